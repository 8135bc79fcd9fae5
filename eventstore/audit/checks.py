"""The integrity checks shared by replay and verify, over one invocation snapshot.

The record-versus-journal checks are :func:`.journal.verify_against_events`;
this module adds what only the key space shows: a record or stream without expiry, record
and stream expiring apart, and a record filed under another invocation's key.
"""

from __future__ import annotations

from typing import Final

from eventstore.audit.journal import verify_against_events
from eventstore.audit.readonly import Snapshot
from machine.events import payload_digest
from machine.ids import invocation_id

#: Record and stream get one absolute expiry together; PTTLs read in one step may differ
#: only by the time between the two reads.
EXPIRY_TOLERANCE_MS: Final = 1000

#: Reason prefixes, grouped into the verdicts replay reports.
CHAIN_REASONS: Final = (
    "broken_chain",
    "hash_mismatch",
    "undecodable_event",
    "record_without_stream",
    "stream_without_record",
)
TRANSITION_REASONS: Final = ("illegal_transition",)
RECORD_REASONS: Final = ("tampered_field", "key_mismatch")
DIGEST_REASONS: Final = ("payload_digest_mismatch",)
TTL_REASONS: Final = ("key_without_ttl", "expiry_mismatch")
#: Reasons after which the audit stops folding, so the record is not compared.
UNFOLDABLE_REASONS: Final = ("illegal_transition", "undecodable_event")


def record_text(fields: dict[bytes, bytes]) -> dict[str, str]:
    """Return the record's non-payload fields as text (payload fields stay bytes elsewhere)."""
    return {k.decode(): v.decode("utf-8", "replace") for k, v in fields.items()}


def problems_of(snapshot: Snapshot) -> list[str]:
    """Return every integrity problem of one invocation, as stable reason strings.

    Reasons: those of :func:`verify_against_events`, plus ``key_without_ttl:record``,
    ``key_without_ttl:stream``, ``expiry_mismatch``, ``tampered_field:invocation_id`` and
    ``key_mismatch`` (a record whose ids are not those of its key).
    """
    if not snapshot.exists:
        return []
    digest_of = snapshot.digest_of or payload_digest
    problems = list(verify_against_events(snapshot.fields, snapshot.events, digest_of))
    problems += (f"payload_digest_mismatch:{name}" for name in snapshot.unopened)
    for name, pttl in (("record", snapshot.record_pttl_ms), ("stream", snapshot.stream_pttl_ms)):
        if pttl == -1:
            problems.append(f"key_without_ttl:{name}")
    if (
        snapshot.record_pttl_ms >= 0
        and snapshot.stream_pttl_ms >= 0
        and abs(snapshot.record_pttl_ms - snapshot.stream_pttl_ms) > EXPIRY_TOLERANCE_MS
    ):
        problems.append("expiry_mismatch")
    if snapshot.fields:
        text = record_text(snapshot.fields)
        expected_id = invocation_id(snapshot.run_id, snapshot.tool_call_id)
        if (
            text.get("invocation_id") != expected_id
            and "tampered_field:invocation_id" not in problems
        ):
            problems.append("tampered_field:invocation_id")
        ids = (text.get("run_id"), text.get("tool_call_id"))
        flagged = {"tampered_field:run_id", "tampered_field:tool_call_id"} & set(problems)
        if ids != (snapshot.run_id, snapshot.tool_call_id) and not flagged:
            problems.append("key_mismatch")
    return problems


def has_reason(problems: list[str], prefixes: tuple[str, ...]) -> bool:
    """Tell whether any problem starts with one of ``prefixes``."""
    return any(problem.split(":", 1)[0] in prefixes for problem in problems)
