"""The cheap record/journal agreement check: each disagreement has its reason, an intact
record has none, and it never needs more than the stream's end."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest

from eventstore.reader import StoredEvent
from projections.receipts.agreement import MAX_EVENTS, disagreement
from tests.unit.test_receipt_rules import READY, RESULT, Fields, invocation

Tamper = Callable[[Fields, list[StoredEvent]], None]


def _set(name: str, value: bytes) -> Tamper:
    def tamper(fields: Fields, _events: list[StoredEvent]) -> None:
        fields[name] = value

    return tamper


def _drop_last(_fields: Fields, events: list[StoredEvent]) -> None:
    events.pop()


def _drop_all(_fields: Fields, events: list[StoredEvent]) -> None:
    events.clear()


def _relabel_last(_fields: Fields, events: list[StoredEvent]) -> None:
    last = events[-1]
    assert last.event is not None
    events[-1] = msgspec.structs.replace(last, event=msgspec.structs.replace(last.event, version=9))


def _undecodable_last(_fields: Fields, events: list[StoredEvent]) -> None:
    events[-1] = msgspec.structs.replace(events[-1], event=None)


def _too_long(_fields: Fields, events: list[StoredEvent]) -> None:
    events.extend([events[-1]] * MAX_EVENTS)


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        (_drop_all, "record_without_stream"),
        (_set("stage", b"FINISHED"), "unknown_stage"),
        (_set("status", b"DONE"), "unknown_stage"),
        (_set("status", b"ERROR"), "stage_mismatch"),
        (_set("stage", b"PROJECTING"), "stage_mismatch"),
        (_drop_last, "stream_length"),
        (_too_long, "stream_length"),
        (_set("version", b"2"), "stream_length"),
        (_undecodable_last, "undecodable_event"),
        (_relabel_last, "version_mismatch"),
        (_set("last_hash", b"f" * 64), "last_hash_mismatch"),
        (_set("result", RESULT.replace(b"3", b"4")), "result_digest_mismatch"),
        (_set("result_sha256", b"0" * 64), "result_digest_mismatch"),
        (_set("evidence_status", b"NO_EVIDENCE"), "outcome_mismatch"),
    ],
)
def test_each_disagreement_is_named(tamper: Tamper, reason: str) -> None:
    """One tampered field or event, one reason."""
    fields, events = invocation(*READY)
    tamper(fields, events)
    assert disagreement(fields, events) == reason


def test_an_intact_record_agrees_at_every_stage() -> None:
    """Executing, projecting, ready and error records agree with their streams."""
    for kinds in (READY[:1], READY[:2], READY, ("Preflighted", "Failed")):
        assert disagreement(*invocation(*kinds)) is None


def test_a_stream_without_record_and_an_absent_invocation() -> None:
    """No record but events is a disagreement; neither is nothing to judge."""
    _, events = invocation(*READY)
    assert disagreement({}, events) == "stream_without_record"
    assert disagreement({}, []) is None


def test_a_changed_error_code_is_an_outcome_mismatch() -> None:
    """An ERROR record whose code is not its Failed event's disagrees."""
    fields, events = invocation("Preflighted", "Failed")
    fields["error_code"] = (
        b"PROJECTION_FAILED"
        if fields["error_code"] != b"PROJECTION_FAILED"
        else b"EXECUTION_FAILED"
    )
    assert disagreement(fields, events) == "outcome_mismatch"
