"""The journal state of one invocation: what its event stream proves about its record.

The journal is the invocation's event stream. It is audited with
:func:`eventstore.audit.journal.verify_fields` (decoding, hash chain, lifecycle, and the
record's fields against the fold). Receipts never read the request or the raw response,
so the audit's findings about those two payloads are left out here; the one payload a
receipt shows, the bounded result, counts. Before the audit, the cheap agreement check of
:mod:`projections.receipts.agreement` (the one every read of a materialized receipt makes) is run,
so a materialized receipt and a freshly built one judge a record alike. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Final

import msgspec

from eventstore.audit import verify_fields
from eventstore.reader import InvocationRecord, StoredEvent
from machine.codes import Stage
from machine.events import PAYLOAD_FIELDS
from machine.fold import InvocationState, state_from_record
from machine.lifecycle import TERMINAL
from projections.receipts.agreement import disagreement

#: A PROJECTING record unchanged for longer than this is reported ``uncertain``.
DEFAULT_STALE_AFTER_MS: Final = 5 * 60 * 1000
#: The payloads a receipt never reads: every one but the bounded agent result.
_PAYLOADS: Final = tuple(field for field in PAYLOAD_FIELDS if field != "result")
#: Audit findings about payloads a receipt never reads (they are not in its fields).
_UNREAD: Final = tuple(f"payload_digest_mismatch:{name}" for name in _PAYLOADS)
#: The audit finding about the one payload a receipt shows.
_RESULT_MISMATCH: Final = "payload_digest_mismatch:result"
#: The record fields :func:`record_view` reads as text: the state and the expiry.
_STATE_FIELDS: Final = (*InvocationState.__struct_fields__, "expires_at_ms")


class JournalState(StrEnum):
    """What the event stream says about the invocation (receipt field ``journal_state``)."""

    ABSENT = "absent"
    DISPATCHING = "dispatching"
    RESPONSE_RECORDED = "response_recorded"
    COMPLETED = "completed"
    UNCERTAIN = "uncertain"
    EVIDENCE_DEGRADED = "evidence_degraded"
    UNKNOWN = "unknown"


class RecordView(msgspec.Struct, frozen=True, kw_only=True):
    """The parts of a canonical record a receipt may look at; never the request or raw.

    Attributes:
        fields: the record's fields as bytes, payloads other than ``result`` removed.
        state: the lifecycle state, or None when the fields are not a valid state.
        expires_at_ms: the record's absolute expiry, when readable.
        result: the stored bounded agent result bytes, if any.

    """

    fields: dict[str, bytes]
    state: InvocationState | None
    expires_at_ms: int | None
    result: bytes | None


def _bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def _record_fields(record: InvocationRecord, events: Sequence[StoredEvent]) -> dict[str, bytes]:
    """The hash fields an :class:`InvocationRecord` stands for.

    The struct does not carry the record's event-id fields; they are taken from the
    events, so for this input the event ids are not cross-checked.
    """
    state = msgspec.to_builtins(record.state)
    assert isinstance(state, dict)
    fields = {name: str(value).encode() for name, value in state.items() if value is not None}
    fields["invocation_id"] = record.invocation_id.encode()
    fields["expires_at_ms"] = str(record.expires_at_ms).encode()
    if record.result is not None:
        fields["result"] = record.result
    for position, stored in enumerate(events, start=1):
        if stored.event is not None:
            fields[f"e{position}"] = stored.event.event_id.encode()
    return fields


def record_view(
    record: Mapping[str, str | bytes] | Mapping[bytes, bytes] | InvocationRecord | None,
    events: Sequence[StoredEvent],
) -> RecordView | None:
    """Normalize a record given as hash fields or as an :class:`InvocationRecord`.

    The request and the raw response are dropped here, so nothing downstream can copy
    them by mistake. Returns None when the record is absent (None or no fields).
    """
    if record is None:
        return None
    if isinstance(record, InvocationRecord):
        fields = _record_fields(record, events)
    else:
        fields = {
            (name.decode("utf-8", "replace") if isinstance(name, bytes) else name): _bytes(value)
            for name, value in record.items()
            if value is not None
        }
    return view_of_fields(fields)


def view_of_fields(record: Mapping[str, bytes]) -> RecordView | None:
    """:func:`record_view` of fields whose names are text and values bytes (a snapshot's)."""
    fields = {name: value for name, value in record.items() if name not in _PAYLOADS}
    if not fields:
        return None
    text = {
        name: fields[name].decode("utf-8", "replace") for name in _STATE_FIELDS if name in fields
    }
    try:
        state: InvocationState | None = state_from_record(text)
    except (msgspec.ValidationError, ValueError):
        state = None
    try:
        expires: int | None = int(text["expires_at_ms"])
    except (KeyError, ValueError):
        expires = None
    return RecordView(
        fields=fields, state=state, expires_at_ms=expires, result=fields.get("result")
    )


def journal_state(
    record: RecordView | None,
    events: Sequence[StoredEvent],
    *,
    observed_at_ms: int,
    stale_after_ms: int = DEFAULT_STALE_AFTER_MS,
    stored_result: bool = True,
) -> JournalState:
    """Judge the stream against the record.

    With ``stored_result=False`` the stored result bytes are left out of the judgement
    (the record's recorded digest and size still count): a record that is then
    ``completed``, and ``evidence_degraded`` otherwise, differs from its journal only in
    a malformed stored result.

    Precedence, first match wins: no events (``absent`` without a record, else
    ``evidence_degraded``); an event that does not decode (``unknown``); no record, a
    record that disagrees with its journal's end (:func:`disagreement`), a broken
    chain, an illegal step, a record field the fold does not produce, or a stored result
    whose digest or size is not the recorded one (``evidence_degraded``); a terminal
    record (``completed``); a governed call not yet dispatched (``absent``: awaiting its
    decision, or approved and not resumed); a non-terminal record unchanged for longer than
    ``stale_after_ms`` (``uncertain``); ``dispatching`` while executing;
    ``response_recorded`` once the raw response is stored.
    """
    if not events:
        return JournalState.ABSENT if record is None else JournalState.EVIDENCE_DEGRADED
    if any(stored.event is None for stored in events):
        return JournalState.UNKNOWN
    if record is None or record.state is None:
        return JournalState.EVIDENCE_DEGRADED
    if disagreement(record.fields, events, stored_result=stored_result) is not None:
        return JournalState.EVIDENCE_DEGRADED
    unread = _UNREAD if stored_result else (*_UNREAD, _RESULT_MISMATCH)
    problems = verify_fields(record.fields, events)
    if any(problem not in unread for problem in problems):
        return JournalState.EVIDENCE_DEGRADED
    state = record.state
    if state.stage in TERMINAL:
        return JournalState.COMPLETED
    if state.stage in (Stage.AWAITING_APPROVAL, Stage.APPROVED):
        # A governed call before its dispatch permit: nothing was dispatched, so there is
        # no dispatch to journal yet, however long it waits for its operator or its resume.
        return JournalState.ABSENT
    if observed_at_ms - state.updated_at_ms > stale_after_ms:
        return JournalState.UNCERTAIN
    if state.stage is Stage.EXECUTING:
        return JournalState.DISPATCHING
    return JournalState.RESPONSE_RECORDED
