"""The crash-point matrix: a real process is SIGKILLed exactly at each point of the plain
and the governed path (a fault-injection point only tests arm, not random timing); then
the record, the journal, the receipt, a resume (or a retry) and a reconcile are checked,
and the executor ran at most once by the killed process, never again for a governed call.
Every call ends known: READY, or ERROR with a code that says how. The table in
docs/guarantees-reference.md is generated from the same cells and checked here."""

from __future__ import annotations

import asyncio
import json
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from eventstore import ApprovalPending, RunContext, Store, ToolError, ToolResult
from eventstore.audit import replay_invocation
from eventstore.audit.run_calls import run_calls
from machine.codes import ErrorCode
from machine.ids import invocation_id
from projections import ReceiptWorker
from projections.receipts.inspection import inspect_invocation
from tests.support.crash_cells import (
    CELLS,
    GOVERNED,
    LEASE,
    RUN,
    TABLE_END,
    TABLE_START,
    Cell,
    boundary_of,
    envelope,
    ran_key,
    table,
)
from tests.support.left_calls import until_lapsed

pytestmark = pytest.mark.backends("single", "cluster")

ROOT = pathlib.Path(__file__).parents[2]
KILLED = 9  # SIGKILL: the process died at the point


class Zygote:
    """The forking process of :mod:`tests.support.crash_zygote`, asked one cell at a time."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.crash_zygote"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, request: dict[str, Any]) -> dict[str, int]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        assert answer, "the zygote stopped"
        return json.loads(answer)  # type: ignore[no-any-return]

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    """One forking process for the module's cells, stopped by pid at its end."""
    started = Zygote()
    try:
        yield started
    finally:
        started.stop()


async def kill(
    zygote: Zygote, url: str, store: Store, call: str, cell: Cell, point: str | None, step: str
) -> dict[str, int]:
    request = {
        "url": url,
        "namespace": store.keys.namespace,
        "call": call,
        "point": point,
        "step": step,
        "path": cell.path if cell.path != "worker" else "plain",
    }
    return await asyncio.to_thread(zygote.ask, request)


async def ran(store: Store, call: str) -> int:
    return int(await store.client.llen(ran_key(store.keys.namespace, call)))


async def left_by_the_kill(zygote: Zygote, url: str, store: Store, cell: Cell) -> str:
    """Run the cell's process until it dies at its point; the call it left."""
    call = cell.name
    if cell.step == "reconcile":  # an attempted call first, then a reconcile killed
        died = await kill(zygote, url, store, call, cell, "inside:executor", "call")
        assert died == {"signal": KILLED}, died
        await until_lapsed(store, RUN, call)
    elif cell.step == "worker":  # a call that ends, then a worker killed
        assert await kill(zygote, url, store, call, cell, None, "call") == {"code": 0}
    died = await kill(zygote, url, store, call, cell, cell.point, cell.step)
    assert died == {"signal": KILLED}, f"{cell.point} was never reached: {died}"
    return call


async def stage_left(store: Store, call: str) -> str:
    """The stage the call stands in once the killed process's lease lapsed."""
    record = await store.get(RUN, call)
    if record is None:
        return "none"
    if record.state.stage.value in ("EXECUTING", "PROJECTING"):
        await until_lapsed(store, RUN, call)
    rows = {row.tool_call_id: row for row in await run_calls(store, RUN)}
    return rows[call].phase


async def check_the_receipt(store: Store, call: str, cell: Cell) -> None:
    """What the receipt says of the call the process left, as the table says it."""
    if cell.left == "none":
        return
    receipt = await inspect_invocation(store, RUN, invocation_id(RUN, call))
    dispatched = receipt.dispatch_state.value
    assert f"`{dispatched}`" in cell.shows and f"`{receipt.journal_state.value}`" in cell.shows
    if cell.left in ("awaiting_approval", "approved"):
        assert dispatched == "not_dispatched" and receipt.approval.status in ("pending", "approved")
    elif cell.left == "ready":
        assert receipt.journal_state.value == "completed" and receipt.result is not None
    else:
        assert dispatched == "attempted"
        assert receipt.result is not None
        assert receipt.result["state"] == "reconciliation_required"


async def resolve(store: Store, call: str, cell: Cell) -> None:
    """What a resume (or a retry) and a reconcile make of the call; it ends known."""
    namespace = store.keys.namespace
    boundary = boundary_of(store, namespace)
    ctx = RunContext(RUN)
    if cell.path != "governed":
        reply = await boundary.invoke(ctx, envelope("plain", call))  # the retry
        assert isinstance(reply, ToolResult), reply
        if cell.path == "worker":
            worker = ReceiptWorker(store, consumer="crash-worker", block_ms=50)
            await worker.run(burst=True)
            key = worker.projection.receipt_key(RUN, call)  # type: ignore[attr-defined]
            assert await store.client.exists(key), "the pending entries were settled"
    elif cell.left == "awaiting_approval":
        assert isinstance(await boundary.invoke(ctx, envelope("governed", call)), ApprovalPending)
        await store.decide(RUN, call, approve=True, by="ops", reason="after the crash")
        assert isinstance(await boundary.resume(ctx, call), ToolResult)
    elif cell.left in ("approved", "ready"):
        assert isinstance(await boundary.resume(ctx, call), ToolResult)
    else:
        again = await boundary.resume(ctx, call)
        assert isinstance(again, ToolError) and again.error_code is ErrorCode.ALREADY_DISPATCHED
        report = await boundary.reconcile(RUN, grace=timedelta(0))
        assert [c.tool_call_id for c in report.calls] == [call] and not report.left
    report = await boundary.reconcile(RUN, grace=timedelta(0))
    assert not report.left, report
    record = await store.get(RUN, call)
    assert record is not None
    status, code = cell.ends
    assert record.state.status.value == status, record.state
    assert (record.state.error_code.value if record.state.error_code else None) == code
    final = await boundary.resume(ctx, call) if cell.path == "governed" else None
    if final is not None:
        assert isinstance(final, ToolResult) == (status == "READY"), final


async def check(zygote: Zygote, redis_url: str, make_store: Any, cell: Cell) -> None:
    store: Store = make_store(shards=2, lease=LEASE)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    call = await left_by_the_kill(zygote, redis_url, store, cell)
    assert await ran(store, call) == cell.ran, "the executor ran as far as the point"
    assert await stage_left(store, call) == cell.left
    if cell.left != "none":
        replay = await replay_invocation(store, RUN, call)
        assert replay is not None and replay.verdict.intact, replay.problems
    await check_the_receipt(store, call, cell)
    await resolve(store, call, cell)
    replay = await replay_invocation(store, RUN, call)
    assert replay is not None and replay.verdict.intact, replay.problems
    runs = await ran(store, call)
    if cell.path == "governed":
        assert runs == max(cell.ran, 1 if cell.left in ("awaiting_approval", "approved") else 0)
        assert runs <= 1, "a governed tool ran twice"
    else:
        # A read-only tool runs again only when its retry took the call over.
        assert runs <= cell.ran + 1


@pytest.mark.not_on_cluster("the plain path's points and the worker's run on each single server")
@pytest.mark.parametrize(
    "cell", [cell for cell in CELLS if cell.path != "governed"], ids=lambda cell: cell.name
)
async def test_a_process_killed_on_the_plain_path(
    zygote: Zygote, redis_url: str, make_store: Any, cell: Cell
) -> None:
    """Killed at the point, the plain call is left as the table says; its retry (or the
    next worker) ends it READY, nothing is left in flight, the journal replays intact."""
    await check(zygote, redis_url, make_store, cell)


@pytest.mark.parametrize("cell", GOVERNED, ids=lambda cell: cell.name)
async def test_a_process_killed_on_the_governed_path(
    zygote: Zygote, redis_url: str, make_store: Any, cell: Cell
) -> None:
    """Killed at the point, the governed call is left as the table says; a resume never
    runs it twice; a reconcile ends it known; the tool ran at most once."""
    await check(zygote, redis_url, make_store, cell)


def test_the_guarantees_page_shows_the_matrix_as_the_cells_say() -> None:
    """docs/guarantees-reference.md holds exactly the table generated from the cells above."""
    page = (ROOT / "docs" / "guarantees-reference.md").read_text()
    assert TABLE_START in page and TABLE_END in page, "the page has no crash-point table"
    shown = page[page.index(TABLE_START) : page.index(TABLE_END) + len(TABLE_END)]
    assert shown == table(), "regenerate it: python -m tests.support.crash_cells"
