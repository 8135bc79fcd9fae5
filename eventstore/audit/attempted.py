"""The calls left in flight by processes that died: attempted and abandoned calls.

A call in flight is held by the lease of the process running it (:mod:`machine.phases`);
once the lease has passed, nobody runs the call any more. :func:`calls_left` lists those
calls, of one run or across the latest runs (from the run index and each run's counts of
its calls in flight: never a SCAN), for ``canon reconcile`` and the reconciler
(:mod:`eventstore.boundary.reconciling`) to settle, and for the doors that show them.
Only reads: judged by the reader's clock, never acted upon (the script that settles a
call judges its lease again, by the server's).
"""

from __future__ import annotations

import msgspec

from eventstore.audit.run_calls import CallRow, left_in_flight, run_calls
from eventstore.audit.run_index import MAX_LIMIT, RunFilter, list_runs
from eventstore.errors import InvalidArgument
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.ids import is_run_id


class LeftCall(msgspec.Struct, frozen=True, kw_only=True):
    """A call in flight whose process's lease lapsed, and its run."""

    run_id: str
    call: CallRow


class LeftCalls(msgspec.Struct, frozen=True, kw_only=True):
    """The calls left in flight: ``runs_examined`` runs read, ``complete`` when all are listed."""

    calls: list[LeftCall]
    runs_examined: int
    complete: bool


async def calls_left(
    store: Store,
    run_id: str | None = None,
    *,
    grace_ms: int = 0,
    runs: int = 200,
    limit: int = 1000,
) -> LeftCalls:
    """The calls of ``run_id`` (else of the latest ``runs`` runs) left by a dead process.

    Those in flight whose lease lapsed at least ``grace_ms`` ago, oldest first, at most
    ``limit``. Across runs only the runs whose counts say a call is in flight are read.

    Raises:
        InvalidArgument: ``runs`` or ``limit`` out of range, or ``run_id`` not a run id.
        StoreUnavailable: Redis failed or timed out.

    """
    if not 1 <= limit <= 10_000:
        raise InvalidArgument("limit must be between 1 and 10000")
    if run_id is not None and not is_run_id(run_id):
        raise InvalidArgument("run id is not a safe id")
    if run_id is not None:
        run_ids, examined, more = [run_id], 1, False
    else:
        page = await list_runs(
            store,
            limit=min(runs, MAX_LIMIT),
            where=RunFilter(status="in_flight"),
            examine=min(max(runs, 1), 2000),
        )
        run_ids = [run.run_id for run in page.runs]
        examined, more = page.examined, page.cursor is not None
    at_ms = now_ms()
    found = [
        LeftCall(run_id=owner, call=row)
        for owner in run_ids
        for row in await run_calls(store, owner)
        if left_in_flight(row, at_ms, grace_ms)
    ]
    found.sort(key=lambda left: (left.call.created_at_ms, left.run_id, left.call.tool_call_id))
    return LeftCalls(
        calls=found[:limit], runs_examined=examined, complete=len(found) <= limit and not more
    )
