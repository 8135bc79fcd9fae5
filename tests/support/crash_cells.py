"""The crash-point matrix: every point where a process can die on the plain and the governed
path, what each leaves, and what resolves it; and what the killed process runs.

Each :class:`Cell` names a fault point (:mod:`eventstore.wire.faults`: ``before:<event>``
and ``after:<event>`` around the script call writing that event, ``inside:<function>`` in
the test's own executor, projector or reconcile hook, ``before:receipts_put`` in a
projection worker) and what the process killed there leaves: the call's stage, what its
receipt says, what resolves it. ``tests/faults/test_crash_matrix.py`` kills a real process
there (:mod:`tests.support.crash_zygote`) and checks every cell; :func:`table` is the
table docs/guarantees-reference.md shows, checked against the page by that test.

The scenarios below run in the killed process: the plain path's call through a boundary
that answers duplicates from their records, the governed path's call (recorded, decided,
resumed), a reconcile, a receipt worker. Their tools count each run of the executor in a
Redis list (``<namespace>:ran:<call>``): a side effect the test can count across the kill.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, Literal

from eventstore import Reconciliation, RunContext, Store, ToolBoundary, ToolEnvelope, ToolSpec
from eventstore.boundary.contracts import Projection, ToolCall
from eventstore.wire import faults
from machine.codes import EvidenceStatus
from projections import ReceiptWorker

#: How long a call's lease lasts in the matrix (the killed process's calls lapse quickly).
LEASE: Final = timedelta(milliseconds=300)
#: The run every cell's call belongs to.
RUN: Final = "run-crash"
Path = Literal["plain", "governed", "worker"]
#: What the killed process runs: a call, a reconcile, or a receipt worker.
Step = Literal["call", "reconcile", "worker"]


@dataclass(frozen=True)
class Cell:
    """One point where a process dies, and what it leaves.

    Attributes:
        path: the plain path (a read-only tool), the governed path, or a worker.
        point: the fault point armed in the killed process.
        where: where that is, as the table says it.
        step: what the killed process was doing (a call, a reconcile, a worker's batch).
        left: the call's stage once the killed process's lease lapsed (``none``: no
            record was written).
        ran: how many times the executor ran before the kill.
        shows: what the operator sees, as the table says it.
        resolves: what ends it, as the table says it.
        ends: the call's status once resolved, and its error code (None for READY).

    """

    path: Path
    point: str
    where: str
    step: Step
    left: str
    ran: int
    shows: str
    resolves: str
    ends: tuple[str, str | None] = ("READY", None)

    @property
    def name(self) -> str:
        """The cell's id in test names."""
        return f"{self.path}-{self.point.replace(':', '-')}"


_RETRY = "a retry of the call id takes it over and runs the read-only tool again"
_SWEEP = "; the sweep (`canon reconcile`) ends it ABANDONED if nobody retries"
_ATTEMPTED_RECEIPT = "receipt `attempted`, `dispatching`, result `reconciliation_required`"
CELLS: Final = (
    Cell(
        "plain",
        "before:Preflighted",
        "before the creation script",
        "call",
        "none",
        0,
        "nothing: no record",
        "the retry is a first call",
    ),
    Cell(
        "plain",
        "after:Preflighted",
        "after Preflighted, before the executor",
        "call",
        "abandoned",
        0,
        "stage `abandoned` once the lease lapsed; receipt `attempted`, `dispatching`",
        _RETRY + _SWEEP,
    ),
    Cell(
        "plain",
        "inside:executor",
        "inside the executor",
        "call",
        "abandoned",
        1,
        "stage `abandoned`; receipt `attempted`, `dispatching`",
        _RETRY + _SWEEP,
    ),
    Cell(
        "plain",
        "before:ProjectingStarted",
        "after the executor returned, before its raw response is stored",
        "call",
        "abandoned",
        1,
        "stage `abandoned`; receipt `attempted`, `dispatching`",
        _RETRY + _SWEEP,
    ),
    Cell(
        "plain",
        "after:ProjectingStarted",
        "after the raw response is stored, before the projector",
        "call",
        "abandoned",
        1,
        "stage `abandoned` (PROJECTING); receipt `attempted`, `response_recorded`",
        _RETRY + _SWEEP,
    ),
    Cell(
        "plain",
        "inside:projector",
        "inside the projector",
        "call",
        "abandoned",
        1,
        "stage `abandoned` (PROJECTING); receipt `attempted`, `response_recorded`",
        _RETRY + _SWEEP,
    ),
    Cell(
        "plain",
        "before:Completed",
        "after the projector, before Completed",
        "call",
        "abandoned",
        1,
        "stage `abandoned` (PROJECTING); receipt `attempted`, `response_recorded`",
        _RETRY + _SWEEP,
    ),
    Cell(
        "plain",
        "after:Completed",
        "after Completed (its feed entry is in the same script), before the agent's answer",
        "call",
        "ready",
        1,
        "stage `ready`; receipt `attempted`, `completed`",
        "the retry answers the recorded result",
    ),
    Cell(
        "worker",
        "before:receipts_put",
        "inside a receipt worker, between its read of a batch and its settle script",
        "worker",
        "ready",
        1,
        "stage `ready`; receipt `attempted`, `completed` (built on read: its materialized "
        "copy waits for a worker)",
        "the next worker under that consumer name (or any, past `min_idle_ms`) settles the "
        "entries it left pending",
    ),
    Cell(
        "governed",
        "after:ApprovalRequested",
        "after ApprovalRequested, before the agent heard `ApprovalPending`",
        "call",
        "awaiting_approval",
        0,
        "stage `awaiting_approval`; receipt `not_dispatched`, `absent`, approval `pending`",
        "the framework's re-entry answers `ApprovalPending`; once approved, a resume runs it once",
    ),
    Cell(
        "governed",
        "after:Approved",
        "after a decision, before the decider heard it",
        "call",
        "approved",
        0,
        "stage `approved`; receipt `not_dispatched`, `absent`, approval `approved`",
        "a resume runs it once",
    ),
    Cell(
        "governed",
        "before:Dispatched",
        "after the decision, before the permit script",
        "call",
        "approved",
        0,
        "stage `approved`; receipt `not_dispatched`, `absent`, approval `approved`",
        "a resume runs it once",
    ),
    Cell(
        "governed",
        "after:Dispatched",
        "after the permit, before the executor",
        "call",
        "attempted",
        0,
        "stage `attempted`; " + _ATTEMPTED_RECEIPT,
        "a resume answers `ALREADY_DISPATCHED` (never run again); a reconcile asks the hook: "
        "not executed, ERROR `RECONCILED_NOT_EXECUTED`",
        ("ERROR", "RECONCILED_NOT_EXECUTED"),
    ),
    Cell(
        "governed",
        "inside:executor",
        "inside the executor",
        "call",
        "attempted",
        1,
        "stage `attempted`; " + _ATTEMPTED_RECEIPT,
        "a resume answers `ALREADY_DISPATCHED`; a reconcile asks the hook: executed, its raw "
        "response projected, READY",
    ),
    Cell(
        "governed",
        "before:ProjectingStarted",
        "after the executor returned, before its raw response is stored",
        "call",
        "attempted",
        1,
        "stage `attempted`; " + _ATTEMPTED_RECEIPT,
        "a reconcile asks the hook: executed, READY",
    ),
    Cell(
        "governed",
        "after:ProjectingStarted",
        "after the raw response is stored, before the projector",
        "call",
        "attempted",
        1,
        "stage `attempted` (PROJECTING); receipt `attempted`, `response_recorded`, result "
        "`reconciliation_required`",
        "a reconcile projects the recorded raw response (no hook needed), READY",
    ),
    Cell(
        "governed",
        "inside:projector",
        "inside the projector",
        "call",
        "attempted",
        1,
        "stage `attempted` (PROJECTING); receipt `attempted`, `response_recorded`, result "
        "`reconciliation_required`",
        "a reconcile projects the recorded raw response, READY",
    ),
    Cell(
        "governed",
        "before:Completed",
        "after the projector, before Completed",
        "call",
        "attempted",
        1,
        "stage `attempted` (PROJECTING); receipt `attempted`, `response_recorded`, result "
        "`reconciliation_required`",
        "a reconcile projects the recorded raw response, READY",
    ),
    Cell(
        "governed",
        "after:Completed",
        "after Completed (its feed entry is in the same script), before the agent's answer",
        "call",
        "ready",
        1,
        "stage `ready`; receipt `attempted`, `completed`",
        "a resume answers the recorded result",
    ),
    Cell(
        "governed",
        "inside:hook",
        "during a reconcile, inside the tool's reconcile hook",
        "reconcile",
        "attempted",
        1,
        "stage `attempted`, unchanged; " + _ATTEMPTED_RECEIPT,
        "the next reconcile asks the hook again: executed, READY",
    ),
    Cell(
        "governed",
        "after:Reconciled",
        "during a reconcile, after Reconciled, before the raw response is stored",
        "reconcile",
        "attempted",
        1,
        "stage `attempted` (the reconciler's lease lapsed); " + _ATTEMPTED_RECEIPT,
        "the next reconcile asks the hook again: executed, READY",
    ),
)
#: The cells whose process dies on the governed path (also run on the cluster).
GOVERNED: Final = tuple(cell for cell in CELLS if cell.path == "governed")

#: Where the table goes in docs/guarantees-reference.md.
TABLE_START: Final = "<!-- crash-matrix: generated from tests/support/crash_cells.py -->"
TABLE_END: Final = "<!-- crash-matrix end -->"


def table() -> str:
    """The crash-point table docs/guarantees-reference.md shows, between its two markers."""
    rows = [
        "| path | the process dies | state left | what the operator sees | what resolves it |",
        "|---|---|---|---|---|",
    ]
    rows += [
        f"| {cell.path} | {cell.where} (`{cell.point}`) | `{cell.left}` | {cell.shows} | "
        f"{cell.resolves} |"
        for cell in CELLS
    ]
    return "\n".join([TABLE_START, *rows, TABLE_END])


def ran_key(namespace: str, call: str) -> str:
    """The Redis list the executor pushes to each time it runs (the side effect counted)."""
    return f"{namespace}:ran:{call}"


def tools(store: Store, namespace: str) -> dict[str, ToolSpec]:
    """The matrix's tools: ``lookup`` (read-only) and ``refund`` (governed, with a hook)."""

    async def run(arguments: dict[str, Any], call: ToolCall) -> Any:
        key = ran_key(namespace, call.tool_call_id)
        await store.client.rpush(key, os.getpid())
        await store.client.expire(key, 600)
        if faults.ARMED:
            faults.reached("inside:executor")
        return {"done": arguments["n"]}

    def project(raw: Any, call: ToolCall) -> Projection:
        if faults.ARMED:
            faults.reached("inside:projector")
        return Projection(result=raw, evidence_status=EvidenceStatus.EVIDENCE_FOUND, scope="t")

    async def look_up(arguments: dict[str, Any], call: ToolCall) -> Reconciliation:
        if faults.ARMED:
            faults.reached("inside:hook")
        runs = await store.client.llen(ran_key(namespace, call.tool_call_id))
        if runs:
            return Reconciliation.executed({"done": arguments["n"]}, evidence=f"ran {runs}")
        return Reconciliation.not_executed(evidence="the business system has no such run")

    return {
        "lookup": ToolSpec(executor=run, projector=project),
        "refund": ToolSpec(
            executor=run, projector=project, read_only=False, approval=True, reconcile=look_up
        ),
    }


def envelope(cell_path: Path, call: str) -> ToolEnvelope:
    """The call a cell's process makes."""
    tool = "refund" if cell_path == "governed" else "lookup"
    return ToolEnvelope(run_id=RUN, tool_call_id=call, tool=tool, arguments={"n": 7})


def boundary_of(store: Store, namespace: str) -> ToolBoundary:
    """The boundary every process of the matrix uses."""
    return ToolBoundary(store, tools(store, namespace), on_duplicate="replay", replay_wait_s=0.05)


async def run_step(
    url: str, namespace: str, call: str, point: str | None, step: Step, path: Path
) -> None:
    """What one process of the matrix does, with ``point`` armed where it belongs.

    A governed call is recorded and decided first when its point comes later; the point
    is armed just before the step it belongs to (None: nothing armed, the step runs).
    """
    async with Store.from_url(url, namespace=namespace, shards=2, lease=LEASE) as store:
        boundary = boundary_of(store, namespace)
        ctx = RunContext(RUN)
        if step == "worker":
            faults.arm(point)
            await ReceiptWorker(store, consumer="crash-worker", block_ms=50).run(burst=True)
            return
        if step == "reconcile":
            faults.arm(point)
            await boundary.reconcile(RUN, grace=timedelta(0))
            return
        if path == "plain" or point == "after:ApprovalRequested":
            faults.arm(point)
            await boundary.invoke(ctx, envelope(path, call))
            return
        await boundary.invoke(ctx, envelope(path, call))
        if point == "after:Approved":
            faults.arm(point)
        await store.decide(RUN, call, approve=True, by="ops", reason="crash matrix")
        faults.arm(point)
        await boundary.resume(ctx, call)


if __name__ == "__main__":  # writes the table into docs/guarantees-reference.md
    import pathlib

    page = pathlib.Path(__file__).parents[2] / "docs" / "guarantees-reference.md"
    text = page.read_text()
    start, end = text.index(TABLE_START), text.index(TABLE_END) + len(TABLE_END)
    page.write_text(text[:start] + table() + text[end:])
