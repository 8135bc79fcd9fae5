"""Replay: re-fold an invocation's journal through the machine and judge its record.

``replay_invocation`` answers "what happened to this call": every stored event with its
time, payload size and digest, the state after it, the state re-folded from the journal,
the state the record holds, and a verdict. It only reads (see :mod:`.readonly`).
"""

from __future__ import annotations

from typing import cast

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
from eventstore.audit.readonly import Snapshot, read_snapshot
from eventstore.audit.timeline import TimelineStep, replay_timeline
from eventstore.errors import redis_errors
from eventstore.store import Store
from eventstore.wire.keys import split_identity
from machine.failure_detail import FailureDetail, decode_failure_detail
from machine.fold import InvocationState, state_from_record
from machine.ids import invocation_id, is_run_id, is_tool_call_id


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """The replay verdict: each guarantee checked, and whether all of them hold.

    ``record_matches_fold`` and ``payload_digests_match`` are None when they could not be
    judged: the record or the stream is missing, or the journal does not fold.
    """

    chain_intact: bool
    transitions_legal: bool
    record_matches_fold: bool | None
    payload_digests_match: bool | None
    expiry_set: bool
    intact: bool


class InvocationReplay(msgspec.Struct, frozen=True, kw_only=True):
    """Everything replay learned about one invocation.

    ``failure_detail`` is the record's harness-only failure detail, decoded (None when
    the record holds none, or holds bytes that are not one: ``failure_detail_bytes``
    then still gives their size). For operators only: never pass it to an agent.
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


def _record_state(fields: dict[bytes, bytes]) -> InvocationState | None:
    try:
        return state_from_record(record_text(fields)) if fields else None
    except msgspec.ValidationError:
        return None


def _judged(problems: list[str], reasons: tuple[str, ...], judged: bool) -> bool | None:
    if has_reason(problems, reasons):
        return False
    return True if judged else None


def judge(snapshot: Snapshot) -> InvocationReplay:
    """Replay one snapshot: timeline, folded state, record state, problems and verdict."""
    timeline, folded = replay_timeline(snapshot.events)
    problems = problems_of(snapshot)
    judged = (
        bool(snapshot.fields)
        and bool(snapshot.events)
        and not has_reason(problems, UNFOLDABLE_REASONS)
    )
    expires = snapshot.fields.get(b"expires_at_ms")
    detail = snapshot.fields.get(b"failure_detail")
    return InvocationReplay(
        invocation_id=invocation_id(snapshot.run_id, snapshot.tool_call_id),
        run_id=snapshot.run_id,
        tool_call_id=snapshot.tool_call_id,
        record_present=bool(snapshot.fields),
        stream_present=bool(snapshot.events),
        record_pttl_ms=snapshot.record_pttl_ms,
        stream_pttl_ms=snapshot.stream_pttl_ms,
        expires_at_ms=int(expires) if expires is not None and expires.isdigit() else None,
        record=_record_state(snapshot.fields),
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
        ),
        failure_detail=decode_failure_detail(detail) if detail is not None else None,
        failure_detail_bytes=len(detail) if detail is not None else None,
    )


async def run_tool_call_ids(store: Store, run_id: str) -> list[str]:
    """Return the tool call ids of a run: its registry's invocations, then its progress list.

    Raises:
        StoreUnavailable: Redis failed or timed out.

    """
    keys = store.keys
    async with redis_errors(), store.client.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.run(run_id))
        pipe.lrange(keys.progress(run_id), 0, -1)
        run_fields, progress = await pipe.execute()
    found: dict[str, None] = {}
    for name, value in cast(dict[bytes, bytes], run_fields).items():
        if name.startswith(b"inv:"):
            found[value.decode()] = None
    for entry in cast(list[bytes], progress):
        owner, call = split_identity(entry.decode("utf-8", "replace"))
        if owner == run_id:
            found[call] = None
    return [call for call in found if keys.accepts_tool_call_id(call)]


async def replay_invocation(
    store: Store, run_id: str, tool_call_id: str
) -> InvocationReplay | None:
    """Replay one invocation; None when neither its record nor its stream exists.

    Also None for a tool call id the namespace's key layout cannot hold (one with ``:`` in
    a namespace of the legacy layout): no such invocation can exist there.

    Raises:
        ValueError: the run id is not a run id or the tool call id not a tool call id.
        StoreUnavailable: Redis failed or timed out.

    """
    if not (is_run_id(run_id) and is_tool_call_id(tool_call_id)):
        raise ValueError("run id and tool call id must be safe ids")
    if not store.keys.accepts_tool_call_id(tool_call_id):
        return None
    snapshot = await read_snapshot(store, run_id, tool_call_id)
    return judge(snapshot) if snapshot.exists else None


async def replay_run(store: Store, run_id: str) -> list[InvocationReplay]:
    """Replay every invocation the run knows of that still exists, oldest first.

    Raises:
        ValueError: the run id is not a run id.
        StoreUnavailable: Redis failed or timed out.

    """
    if not is_run_id(run_id):
        raise ValueError("run id must be a safe id")
    replays = []
    for tool_call_id in await run_tool_call_ids(store, run_id):
        replay = await replay_invocation(store, run_id, tool_call_id)
        if replay is not None:
            replays.append(replay)
    return sorted(replays, key=lambda r: (r.timeline[0].at_ms or 0) if r.timeline else 0)
