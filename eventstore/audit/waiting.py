"""The governed calls waiting for a decision across runs, and the sweep of expired ones.

:func:`pending_approvals` lists the calls waiting for an operator's decision across the
latest runs, from the run index and each run's count of its waiting calls (kept by the
scripts): never a SCAN. :func:`sweep_expired` records the expiry of those past it
(``canon sweep-approvals``, from cron or a timer), so an expired call shows as such
without anyone touching it; it writes records, so it runs with the writer's credentials,
never a projection worker's. Nothing here runs a tool; reading a decision never consumes
it.
"""

from __future__ import annotations

import msgspec

from eventstore.audit.run_calls import CallRow, run_calls
from eventstore.audit.run_index import MAX_LIMIT, RunFilter, list_runs
from eventstore.decisions import NotAwaitingApproval
from eventstore.errors import InvalidArgument
from eventstore.store import Store
from machine.codes import Stage


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
