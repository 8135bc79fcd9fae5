"""Governed calls: the one dispatch permit, and the calls waiting across runs.

A governed call (a side-effecting tool that needs an operator's approval) is recorded
frozen by :meth:`~eventstore.writer.Writer.request_approval` and waits in
AWAITING_APPROVAL; operators decide it and pause runs through the store
(``store.decide``, ``store.pause_run``: :mod:`eventstore.decisions`). Here are the steps
that read across runs or let a call run, each write one event appended by the same
atomic script as every other, checked by the same transition table:

- :func:`take_permit`: the approved -> EXECUTING step (Dispatched), the only dispatch
  permit. The script refuses it while the run or the namespace is paused, past the
  expiry, or once another resumer took it; only its winner may run the tool.
- :func:`pending_approvals`: the calls waiting for a decision across the latest runs,
  from the run index and each run's count of its waiting calls (kept by the scripts);
  :func:`sweep_expired` records the expiry of those past it (``canon sweep-approvals``,
  from cron or a timer), so an expired call shows as such without anyone touching it.
  It writes records, so it runs with the writer's credentials, never a projection
  worker's.

Nothing here runs a tool; reading a decision never consumes it.
"""

from __future__ import annotations

import msgspec

from eventstore.audit.run_calls import CallRow, run_calls
from eventstore.audit.run_index import MAX_LIMIT, RunFilter, list_runs
from eventstore.decisions import MOVED_ON, NotAwaitingApproval
from eventstore.errors import InvalidArgument, Refused
from eventstore.store import Store
from eventstore.writer import Head, head_of
from machine.codes import ErrorCode, Stage
from machine.fold import InvocationState


class Permit(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of asking for a governed call's dispatch permit.

    ``head`` is set only for the one caller that took the permit: it may run the tool,
    once, and goes on from there. Otherwise ``stage`` (and ``code`` for an ERROR or a
    refusal) says why not: not approved yet, already dispatched, ended, paused.
    """

    head: Head | None
    stage: Stage
    code: ErrorCode | None = None


async def take_permit(store: Store, state: InvocationState, expires_at_ms: int) -> Permit:
    """Take the one dispatch permit of an approved call whose request ``state`` describes.

    The caller has read the request back and checked its digest (``state`` holds the
    approved one); the permit records that digest. Only the caller that gets a head may
    run the tool.

    Raises:
        StoreUnavailable: Redis failed or timed out.

    """
    if state.stage is not Stage.APPROVED:
        return Permit(head=None, stage=state.stage, code=state.error_code)
    try:
        head = await store.writer.dispatch(head_of(state, expires_at_ms), state.request_sha256)
    except Refused as refused:
        if refused.code == ErrorCode.APPROVAL_EXPIRED.value:
            await store.decisions.expire(state.run_id, state.tool_call_id)
            return Permit(head=None, stage=Stage.ERROR, code=ErrorCode.APPROVAL_EXPIRED)
        if refused.code in (ErrorCode.RUN_PAUSED.value, ErrorCode.EXECUTION_PAUSED.value):
            return Permit(head=None, stage=Stage.APPROVED, code=ErrorCode(refused.code))
        if refused.code not in MOVED_ON:
            raise
        record = await store.reader.get(state.run_id, state.tool_call_id)
        if record is None:
            return Permit(head=None, stage=Stage.ERROR, code=ErrorCode.RECORD_EXPIRED)
        return Permit(head=None, stage=record.state.stage, code=record.state.error_code)
    return Permit(head=head, stage=Stage.EXECUTING)


class Waiting(msgspec.Struct, frozen=True, kw_only=True):
    """A governed call waiting for an operator's decision, and its run."""

    run_id: str
    call: CallRow


class WaitingCalls(msgspec.Struct, frozen=True, kw_only=True):
    """The governed calls waiting across runs.

    ``runs_examined`` is how many runs were read; ``complete`` whether every waiting call
    of the latest runs is listed.
    """

    calls: list[Waiting]
    runs_examined: int
    complete: bool


async def pending_approvals(store: Store, *, runs: int = 200, limit: int = 100) -> WaitingCalls:
    """The governed calls waiting for a decision in the latest ``runs`` runs, oldest first.

    Served from the run index and each run's count of its waiting calls: only a run that
    has some has its calls read (lifecycle fields, never a payload); never a SCAN. At most
    ``limit`` calls, the oldest.

    Raises:
        InvalidArgument: ``runs`` or ``limit`` out of range (see :func:`list_runs`).
        StoreUnavailable: Redis failed or timed out.

    """
    if not 1 <= limit <= 1000:
        raise InvalidArgument("limit must be between 1 and 1000")
    page = await list_runs(
        store,
        limit=min(runs, MAX_LIMIT),
        where=RunFilter(status="awaiting_approval"),
        examine=runs,
    )
    found = [
        Waiting(run_id=run.run_id, call=call)
        for run in page.runs
        for call in await run_calls(store, run.run_id)
        if call.stage == Stage.AWAITING_APPROVAL.value
    ]
    found.sort(key=lambda waiting: (waiting.call.created_at_ms, waiting.run_id))
    return WaitingCalls(
        calls=found[:limit],
        runs_examined=page.examined,
        complete=len(found) <= limit and page.cursor is None,
    )


async def sweep_expired(store: Store, *, runs: int = 200) -> int:
    """Record the expiry of every call of the latest ``runs`` runs waiting past it.

    Returns how many expiries this sweep recorded. Idempotent and safe beside any other
    writer: each expiry is one append checked against the call's version, so a decision
    or a resume that came first wins.

    Raises:
        StoreUnavailable: Redis failed or timed out.

    """
    waiting = await pending_approvals(store, runs=runs, limit=1000)
    recorded = 0
    for entry in waiting.calls:
        try:
            recorded += await store.decisions.expire(entry.run_id, entry.call.tool_call_id)
        except NotAwaitingApproval:
            continue  # its record expired meanwhile
    return recorded
