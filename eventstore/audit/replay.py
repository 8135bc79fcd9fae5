"""Replay: re-fold an invocation's journal through the machine and judge its record.

``replay_invocation`` answers "what happened to this call": every stored event with its
time, payload size and digest, the state after it, the state re-folded from the journal,
the state the record holds, and a verdict. It only reads (see :mod:`.readonly`).
"""

from __future__ import annotations

import msgspec

from eventstore.audit.checks import (
    CHAIN_REASONS,
    DIGEST_REASONS,
    RECORD_REASONS,
    TRANSITION_REASONS,
    TTL_REASONS,
    UNFOLDABLE_REASONS,
    has_reason,
    problems_of,
    record_text,
)
from eventstore.audit.readonly import Snapshot
from eventstore.audit.source import AuditSource, source_of
from eventstore.audit.timeline import TimelineStep, replay_timeline
from eventstore.erasure import ERASED_FIELD, Erasure
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.failure_detail import FailureDetail, decode_failure_detail
from machine.fold import InvocationState, state_from_record
from machine.ids import invocation_id, is_run_id, is_tool_call_id
from machine.phases import phase_of


class Verdict(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The replay verdict: each guarantee checked, and whether all of them hold.

    ``payloads_erased`` is encoded only when true (a run that was never erased reads as
    it always did).

    ``record_matches_fold`` and ``payload_digests_match`` are None when they could not be
    judged: the record or the stream is missing, or the journal does not fold.
    """

    chain_intact: bool
    transitions_legal: bool
    record_matches_fold: bool | None
    payload_digests_match: bool | None
    expiry_set: bool
    intact: bool
    #: The run's payloads were erased: missing payloads are the erasure, not tampering.
    payloads_erased: bool = False


class InvocationReplay(msgspec.Struct, frozen=True, kw_only=True):
    """Everything replay learned about one invocation.

    ``failure_detail`` is the record's harness-only failure detail, decoded (None when
    the record holds none, or holds bytes that are not one: ``failure_detail_bytes``
    then still gives their size). For operators only: never pass it to an agent.
    ``phase`` is where the call stands beside its status (:class:`machine.phases.Phase`:
    awaiting_approval, approved, dispatching, attempted, abandoned, ready, error,
    reconciled), judged when it was read; None when neither the record nor the journal
    holds a state.
    """

    invocation_id: str
    run_id: str
    tool_call_id: str
    record_present: bool
    stream_present: bool
    record_pttl_ms: int
    stream_pttl_ms: int
    expires_at_ms: int | None
    record: InvocationState | None
    folded: InvocationState | None
    timeline: list[TimelineStep]
    problems: list[str]
    verdict: Verdict
    failure_detail: FailureDetail | None = None
    failure_detail_bytes: int | None = None
    #: Read from an archive: Redis no longer holds the invocation (its TTL passed).
    archived: bool = False
    #: The run's erasure (who, when, why) when its payloads were erased.
    erasure: Erasure | None = None
    #: Where the call stands now (machine.phases), beside its status.
    phase: str | None = None


def _record_state(fields: dict[bytes, bytes]) -> InvocationState | None:
    try:
        return state_from_record(record_text(fields)) if fields else None
    except msgspec.ValidationError:
        return None


def _judged(problems: list[str], reasons: tuple[str, ...], judged: bool) -> bool | None:
    if has_reason(problems, reasons):
        return False
    return True if judged else None


def judge(snapshot: Snapshot, erasure: Erasure | None = None) -> InvocationReplay:
    """Replay one snapshot: timeline, folded state, record state, problems and verdict.

    ``erasure`` is the run's tombstone, for a record its erasure emptied.
    """
    timeline, folded = replay_timeline(snapshot.events)
    problems = problems_of(snapshot)
    judged = (
        bool(snapshot.fields)
        and bool(snapshot.events)
        and not has_reason(problems, UNFOLDABLE_REASONS)
    )
    expires = snapshot.fields.get(b"expires_at_ms")
    detail = snapshot.fields.get(b"failure_detail")
    record = _record_state(snapshot.fields)
    return InvocationReplay(
        invocation_id=invocation_id(snapshot.run_id, snapshot.tool_call_id),
        run_id=snapshot.run_id,
        tool_call_id=snapshot.tool_call_id,
        record_present=bool(snapshot.fields),
        stream_present=bool(snapshot.events),
        record_pttl_ms=snapshot.record_pttl_ms,
        stream_pttl_ms=snapshot.stream_pttl_ms,
        expires_at_ms=int(expires) if expires is not None and expires.isdigit() else None,
        record=record,
        folded=folded,
        timeline=timeline,
        problems=problems,
        verdict=Verdict(
            chain_intact=not has_reason(problems, CHAIN_REASONS),
            transitions_legal=not has_reason(problems, TRANSITION_REASONS),
            record_matches_fold=_judged(problems, RECORD_REASONS, judged),
            payload_digests_match=_judged(problems, DIGEST_REASONS, judged),
            expiry_set=not has_reason(problems, TTL_REASONS),
            intact=not problems,
            payloads_erased=ERASED_FIELD.encode() in snapshot.fields,
        ),
        failure_detail=decode_failure_detail(detail) if detail is not None else None,
        failure_detail_bytes=len(detail) if detail is not None else None,
        archived=snapshot.archived,
        erasure=erasure if ERASED_FIELD.encode() in snapshot.fields else None,
        phase=_phase(record or folded, snapshot.fields),
    )


def _phase(state: InvocationState | None, fields: dict[bytes, bytes]) -> str | None:
    """Where the call stands now, beside its status (None without a state)."""
    if state is None:
        return None
    lease = fields.get(b"lease_until_ms")
    return phase_of(
        state.stage,
        governed=state.approval_id is not None,
        settled=state.settled_by is not None,
        lease_until_ms=int(lease) if lease is not None and lease.isdigit() else None,
        updated_at_ms=state.updated_at_ms,
        now_ms=now_ms(),
    ).value


async def replay_invocation(
    store: Store | AuditSource, run_id: str, tool_call_id: str
) -> InvocationReplay | None:
    """Replay one invocation; None when neither its record nor its stream exists.

    ``store`` is read through Redis, or an :class:`~.source.AuditSource` (an archive)
    is read: the replay is the same.

    Also None for a tool call id the namespace's key layout cannot hold (one with ``:`` in
    a namespace of the legacy layout): no such invocation can exist there.

    Raises:
        ValueError: the run id is not a run id or the tool call id not a tool call id.
        StoreUnavailable: Redis failed or timed out.

    """
    if not (is_run_id(run_id) and is_tool_call_id(tool_call_id)):
        raise ValueError("run id and tool call id must be safe ids")
    if isinstance(store, Store) and not store.keys.accepts_tool_call_id(tool_call_id):
        return None
    source = source_of(store)
    snapshot = await source.snapshot(run_id, tool_call_id)
    if not snapshot.exists:
        return None
    erasure = await source.erasure(run_id) if ERASED_FIELD.encode() in snapshot.fields else None
    return judge(snapshot, erasure)


async def replay_run(store: Store | AuditSource, run_id: str) -> list[InvocationReplay]:
    """Replay every invocation the run knows of that still exists, oldest first.

    Raises:
        ValueError: the run id is not a run id.
        StoreUnavailable: Redis failed or timed out.

    """
    if not is_run_id(run_id):
        raise ValueError("run id must be a safe id")
    replays = []
    for tool_call_id in await source_of(store).tool_call_ids(run_id):
        replay = await replay_invocation(store, run_id, tool_call_id)
        if replay is not None:
            replays.append(replay)
    return sorted(replays, key=lambda r: (r.timeline[0].at_ms or 0) if r.timeline else 0)
