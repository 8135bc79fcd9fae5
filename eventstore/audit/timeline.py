"""The replay timeline: an invocation's stored events folded one by one through the machine.

Each step shows what the event says (version, type, time, payload size and digest), the
hash of its stored bytes, and the lifecycle position after it. Pure: no I/O.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET

from eventstore.reader import StoredEvent
from machine.codes import EvidenceStatus, Stage, Status
from machine.events import GENESIS_HASH, PAYLOADS_OF, Event, event_type, stored_document
from machine.fold import FoldError, InvocationState, fold


class StepState(msgspec.Struct, frozen=True, kw_only=True):
    """The lifecycle position after one event."""

    stage: Stage
    status: Status
    evidence_status: EvidenceStatus


class TimelinePayload(msgspec.Struct, frozen=True):
    """One payload an event names: its record field, UTF-8 size and SHA-256."""

    payload_field: str
    payload_bytes: int
    payload_sha256: str


class TimelineStep(msgspec.Struct, frozen=True, kw_only=True):
    """One stored event as replayed.

    Attributes:
        entry_id: the stream entry id.
        version: the event's version (None when the bytes do not decode).
        event_type: the event's tag (None when undecodable).
        stored_schema: the schema of the stored bytes (older ones were upcast on read).
        at_ms: when the event was committed, by the writer's clock.
        event_bytes: size of the stored event.
        event_hash: SHA-256 of the stored bytes; ``stored_hash`` is the one written beside
            (entries before schema 2), else the same hash.
        payload_field: the record field this event's payload lives in, if any (a
            Failed event's is the failure detail when one was kept, else the agent
            result when the agent was shown the tool's own error text).
        payload_bytes: the payload's (or a rejected payload's) UTF-8 size.
        payload_sha256: the payload digest the event carries.
        detail: the error code or evidence status the event sets, if any.
        state: the state after this event, None when it could not be folded.
        fold_error: why the fold refused this event, if it did.
        more_payloads: the payloads the event names besides the first (a Failed event
            that kept both: the agent result).

    """

    entry_id: str
    version: int | None
    event_type: str | None
    stored_schema: int | None
    at_ms: int | None
    event_bytes: int
    event_hash: str
    stored_hash: str
    payload_field: str | None = None
    payload_bytes: int | None = None
    payload_sha256: str | None = None
    detail: str | None = None
    state: StepState | None = None
    fold_error: str | None = None
    more_payloads: tuple[TimelinePayload, ...] = ()


def _payloads(event: Event) -> list[TimelinePayload]:
    """The payloads the event names, in declaration order (a Failed event's are optional)."""
    named = []
    for fields in PAYLOADS_OF[event_type(event)]:
        if fields.payload is None or fields.size is None or fields.digest is None:
            continue
        size, digest = getattr(event, fields.size), getattr(event, fields.digest)
        if size is not None and size is not UNSET:
            named.append(TimelinePayload(fields.payload, size, digest))
    return named


def _payload(
    event: Event | None,
) -> tuple[str | None, int | None, str | None, str | None, tuple[TimelinePayload, ...]]:
    """The first payload's field, size and digest, the code the event sets, and the rest."""
    if event is None:
        return None, None, None, None, ()
    detail = getattr(event, "evidence_status", None) or getattr(event, "error_code", None)
    named = _payloads(event)
    if not named:
        # A Failed that kept no payload: at most the size of what it refused.
        rejected = PAYLOADS_OF[event_type(event)][0].rejected
        return None, getattr(event, rejected) if rejected else None, None, detail, ()
    first = named[0]
    return (
        first.payload_field,
        first.payload_bytes,
        first.payload_sha256,
        detail,
        tuple(named[1:]),
    )


def _stored_schema(data: bytes) -> int | None:
    try:
        schema = stored_document(data).get("schema")
    except msgspec.DecodeError:
        return None
    return schema if isinstance(schema, int) else None


def _relinked(event: Event, state: InvocationState | None) -> Event:
    return msgspec.structs.replace(
        event,
        version=state.version + 1 if state else 1,
        prev_hash=state.last_hash if state else GENESIS_HASH,
    )


def replay_timeline(
    events: list[StoredEvent],
) -> tuple[list[TimelineStep], InvocationState | None]:
    """Fold stored events one by one; return each step and the last folded state.

    The chain hash of each step is computed from the stored bytes (never from an upcast
    shape). A broken link (version or previous hash) is reported on its step and the event
    is folded relinked; folding stops at the first illegal event, later steps carry no
    state, and the returned state is the one before that event.
    """
    steps: list[TimelineStep] = []
    state: InvocationState | None = None
    failed = False
    for stored in events:
        event, hash_ = stored.event, stored.computed_hash
        errors: list[str] = []
        after: StepState | None = None
        if event is None:
            errors.append("undecodable_event")
            failed = True
        elif not failed:
            # Like the audit, a broken link is reported and the event folded relinked, so
            # the transitions after a gap are still judged.
            linked = _relinked(event, state)
            if (linked.version, linked.prev_hash) != (event.version, event.prev_hash):
                errors.append("broken_chain")
            try:
                state = fold(state, linked, hash_)
            except FoldError as exc:
                errors.append(exc.reason)
                failed = True
            if not failed and state is not None:
                after = StepState(
                    stage=state.stage, status=state.status, evidence_status=state.evidence_status
                )
        field, size, digest, detail, more = _payload(event)
        steps.append(
            TimelineStep(
                entry_id=stored.entry_id,
                version=event.version if event is not None else None,
                event_type=event_type(event) if event is not None else None,
                stored_schema=_stored_schema(stored.data),
                at_ms=event.at_ms if event is not None else None,
                event_bytes=len(stored.data),
                event_hash=hash_,
                stored_hash=stored.stored_hash,
                payload_field=field,
                payload_bytes=size,
                payload_sha256=digest,
                detail=detail,
                state=after,
                fold_error=", ".join(errors) or None,
                more_payloads=more,
            )
        )
    return steps, state
