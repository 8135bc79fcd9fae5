"""The pure fold: an invocation's state is its events applied in order.

The Lua scripts apply the same rules inside Redis; a test proves both agree on every
(stage, event) pair. Payload bytes are not part of the state, only their digests and sizes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import msgspec
from msgspec import UNSET

from machine.codes import ErrorCode, EvidenceStatus, Stage, Status
from machine.errors import CanonError
from machine.events import (
    COMMON_FIELDS,
    CREATING_EVENTS,
    EVENT_CLASSES,
    GENESIS_HASH,
    ApprovalRequested,
    Completed,
    Event,
    Preflighted,
    encode_event,
    event_hash,
    event_type,
)
from machine.lifecycle import EVIDENCE_ALLOWED, STATUS_OF, next_stage


class FoldError(CanonError):
    """Raised when an event cannot be applied to a state; carries the reason."""

    reason = "fold_error"


class IllegalTransition(FoldError):
    """Raised when the lifecycle does not allow the event in the current stage."""

    reason = "illegal_transition"


class VersionMismatch(FoldError):
    """Raised when an event's version is not the state's version plus one."""

    reason = "version_mismatch"


class ChainBroken(FoldError):
    """Raised when an event's ``prev_hash`` is not the hash of the event before it."""

    reason = "chain_broken"


class InvalidEvidence(FoldError):
    """Raised when a Completed event names an evidence status READY cannot hold."""

    reason = "invalid_evidence_status"


class InvocationState(msgspec.Struct, kw_only=True):
    """Everything the events say about one invocation (payload digests, not payloads).

    Field names are also the canonical record's hash field names.
    """

    run_id: str
    tool_call_id: str
    tool: str
    stage: Stage
    status: Status
    evidence_status: EvidenceStatus
    version: int
    last_hash: str
    created_at_ms: int
    updated_at_ms: int
    request_sha256: str
    request_bytes: int
    raw_sha256: str | None = None
    raw_bytes: int | None = None
    result_sha256: str | None = None
    result_bytes: int | None = None
    scope: str | None = None
    error_code: ErrorCode | None = None
    rejected_bytes: int | None = None
    failure_detail_sha256: str | None = None
    failure_detail_bytes: int | None = None
    approval_id: str | None = None
    approval_expires_at_ms: int | None = None
    decided_by: str | None = None
    decision_reason: str | None = None
    decision_id: str | None = None
    dispatched_request_sha256: str | None = None
    supersedes: str | None = None
    superseded_by: str | None = None
    requested_by: str | None = None
    approvals_required: int | None = None
    approval_count: int | None = None
    retry_of: str | None = None
    retried_by: str | None = None
    lapsed_at_ms: int | None = None
    attempt: int | None = None
    settled_by: str | None = None
    settlement_evidence_sha256: str | None = None
    settlement_evidence_bytes: int | None = None


#: Record fields owned by the lifecycle; an event's own fields may never overwrite them.
LIFECYCLE_FIELDS: Final = frozenset(
    {"stage", "status", "evidence_status", "version", "last_hash", "updated_at_ms"}
)


#: Per event Struct, the record fields it sets: its own declared fields (machine.events).
_RECORD_FIELDS: Final = {
    event: tuple(name for name in event.__struct_fields__ if name not in COMMON_FIELDS)
    for event in EVENT_CLASSES
}

# One function per event Struct, its fields written out: every append builds these
# pairs, and a loop over the field names costs several times more than the fields.
_PAIRS_TEMPLATE: Final = """
def record_pairs(event):
    pairs = {first}
{fields}    return pairs
"""
_FIELD_TEMPLATE: Final = """    value = event.{name}
    if value is not None and value is not UNSET:
        pairs += ("{name}", str(value))
"""


def _pairs_function(event_class: type[Event]) -> Callable[[Event], list[str]]:
    creating = event_class.__struct_config__.tag in CREATING_EVENTS
    first = '["created_at_ms", str(event.at_ms)]' if creating else "[]"
    fields = "".join(_FIELD_TEMPLATE.format(name=name) for name in _RECORD_FIELDS[event_class])
    scope: dict[str, Any] = {"UNSET": UNSET}
    exec(_PAIRS_TEMPLATE.format(first=first, fields=fields), scope)  # noqa: S102 - our own template
    function: Callable[[Event], list[str]] = scope["record_pairs"]
    return function


_PAIRS_OF: Final = {event: _pairs_function(event) for event in EVENT_CLASSES}


def record_pairs(event: Event) -> list[str]:
    """Return the record fields an event sets besides the lifecycle fields, as a flat list.

    ``[name, value, name, value, ...]``: the fields its type declares (a None or
    ``UNSET`` is left out), and for the creating event also ``created_at_ms``, its time,
    each value a string (``str()`` of an int, and of a StrEnum its value: the record's
    spelling).
    """
    return _PAIRS_OF[type(event)](event)


def event_fields(event: Event) -> dict[str, str]:
    """Return the fields of :func:`record_pairs` as a dict."""
    pairs = record_pairs(event)
    return dict(zip(pairs[::2], pairs[1::2], strict=True))


def fold(state: InvocationState | None, event: Event, hash_: str | None = None) -> InvocationState:
    """Apply one event to ``state`` (None before the first event) and return the new state.

    Args:
        state: the state after the previous event, or None for a new invocation.
        event: the event to apply.
        hash_: the event's chain hash; computed from its canonical encoding when omitted
            (pass the hash of the stored bytes when replaying upcast events).

    Raises:
        VersionMismatch, ChainBroken, IllegalTransition, InvalidEvidence, checked in that
        order (the order append.lua checks them in). IllegalTransition also for a
        TakenOver of a governed call: only an ungoverned call is ever taken over.

    """
    stage = state.stage if state is not None else Stage.NEW
    version = state.version if state is not None else 0
    last_hash = state.last_hash if state is not None else GENESIS_HASH
    kind = event_type(event)
    # Same order as append.lua, so Python and Redis give the same reason for a refusal:
    # a stale writer learns it lost a race (version) before anything else.
    if event.version != version + 1:
        raise VersionMismatch(f"expected version {version + 1}, got {event.version}")
    if event.prev_hash != last_hash:
        raise ChainBroken(f"event {event.version} does not follow the previous event")
    dest = next_stage(stage, kind)
    if dest is None:
        raise IllegalTransition(f"{kind} is not allowed in {stage.value}")
    if kind == "TakenOver" and state is not None and state.approval_id is not None:
        # Nothing dispatches a governed call again by itself (the scripts agree).
        raise IllegalTransition("a governed call is never taken over")
    if isinstance(event, Completed) and event.evidence_status not in EVIDENCE_ALLOWED[dest]:
        raise InvalidEvidence(f"{event.evidence_status.value} cannot complete an invocation")
    evidence = EvidenceStatus.ERROR if dest is Stage.ERROR else EvidenceStatus.PENDING
    lifecycle = {
        "stage": dest,
        "status": STATUS_OF[dest],
        "evidence_status": evidence,
        "version": event.version,
        "last_hash": hash_ if hash_ is not None else event_hash(encode_event(event)),
        "updated_at_ms": event.at_ms,
    }
    if state is None:
        # The table allows only a creating event from NEW.
        assert isinstance(event, Preflighted | ApprovalRequested)
        merged: dict[str, object] = {}
    else:
        merged = msgspec.structs.asdict(state)
    merged.update(lifecycle)
    merged.update(event_fields(event))
    return msgspec.convert(merged, InvocationState, strict=False)


def fold_all(events: Iterable[tuple[Event, str]]) -> InvocationState | None:
    """Fold ``(event, hash)`` pairs from nothing; None when there are no events."""
    state: InvocationState | None = None
    for event, hash_ in events:
        state = fold(state, event, hash_)
    return state


def state_from_record(record: Mapping[str, str]) -> InvocationState:
    """Read the lifecycle state out of a canonical record's hash fields.

    Raises:
        msgspec.ValidationError: when the record does not hold a valid state.

    """
    fields = {name: record[name] for name in InvocationState.__struct_fields__ if name in record}
    return msgspec.convert(fields, InvocationState, strict=False)
