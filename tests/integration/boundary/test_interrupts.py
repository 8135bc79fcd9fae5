"""No record is left PROJECTING by the tool or by the caller: every way a call can be cut short
ends its record in ERROR with a stable code before ``invoke`` returns or re-raises."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from eventstore import Projection, RunContext, Store, ToolBoundary, ToolCall, ToolSpec
from machine.codes import ErrorCode, EvidenceStatus, Stage, Status
from tests.support.calls import RUN, TOOL, assert_safe_error, envelope, open_run
from tests.support.tools import FakeTool
from tests.support.waiting import wait_for

pytestmark = pytest.mark.backends("single", "cluster")


async def assert_closed(store: Store, code: ErrorCode, call_id: str = "call_1") -> None:
    """The call's record is ERROR with ``code`` and ERROR evidence."""
    record = await store.get(RUN, call_id)
    assert record is not None
    state = record.state
    assert (state.status, state.stage, state.error_code) == (Status.ERROR, Stage.ERROR, code)
    assert state.evidence_status is EvidenceStatus.ERROR


def raise_cancelled(*_: Any) -> Any:
    raise asyncio.CancelledError()


async def raise_cancelled_async(*_: Any) -> Any:
    raise asyncio.CancelledError()


@pytest.mark.parametrize(
    "executor", [raise_cancelled_async, raise_cancelled], ids=["async", "thread"]
)
async def test_a_tool_raising_its_own_cancelled_error_is_an_execution_failure(
    store: Store, executor: Any
):
    """An executor that raises CancelledError while nobody cancelled the call has failed:
    EXECUTION_FAILED is returned and recorded."""
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: ToolSpec(executor=executor, projector=raise_cancelled)})

    reply = await boundary.invoke(RunContext(RUN), envelope())

    assert_safe_error(reply, ErrorCode.EXECUTION_FAILED)
    await assert_closed(store, ErrorCode.EXECUTION_FAILED)


@pytest.mark.parametrize(
    "projector", [raise_cancelled_async, raise_cancelled], ids=["async", "plain"]
)
async def test_a_projector_raising_its_own_cancelled_error_is_a_projection_failure(
    store: Store, projector: Any
):
    """A projector that raises CancelledError on its own is PROJECTION_FAILED."""
    await open_run(store)
    tool = FakeTool()
    boundary = ToolBoundary(store, {TOOL: ToolSpec(executor=tool.executor, projector=projector)})

    reply = await boundary.invoke(RunContext(RUN), envelope())

    assert_safe_error(reply, ErrorCode.PROJECTION_FAILED)
    await assert_closed(store, ErrorCode.PROJECTION_FAILED)


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit], ids=["interrupt", "exit"])
@pytest.mark.parametrize("where", ["executor", "thread", "projector"])
async def test_the_process_asked_to_exit_closes_the_record_then_goes_on(
    store: Store, error: type[BaseException], where: str
):
    """KeyboardInterrupt or SystemExit from a tool (async, in a worker thread, or from the
    projector) is re-raised, after the record is closed as CALLER_CANCELLED."""
    await open_run(store)

    def plain_executor(arguments: Any, call: ToolCall) -> Any:
        raise error()

    tool = FakeTool(
        raise_in_executor=error() if where == "executor" else None,
        raise_in_projector=error() if where == "projector" else None,
    )
    executor = plain_executor if where == "thread" else tool.executor
    boundary = ToolBoundary(store, {TOOL: ToolSpec(executor=executor, projector=tool.projector)})

    with pytest.raises(error):
        await boundary.invoke(RunContext(RUN), envelope())

    await assert_closed(store, ErrorCode.CALLER_CANCELLED)


class Held:
    """An executor or projector that waits until the test releases it."""

    def __init__(self) -> None:
        self.running = asyncio.Event()
        self.release = asyncio.Event()

    async def wait(self, *_: Any) -> Any:
        self.running.set()
        await self.release.wait()
        return {"rows": 1}

    async def project(self, *_: Any) -> Projection:
        await self.wait()
        return Projection(result="ok", evidence_status="EVIDENCE_FOUND")


@pytest.mark.parametrize("stage", [Stage.EXECUTING, Stage.PROJECTING])
async def test_the_callers_cancellation_closes_the_record_then_goes_on(store: Store, stage: Stage):
    """Cancelling the task that runs invoke, while the executor or the projector runs,
    re-raises CancelledError after the record is closed as CALLER_CANCELLED."""
    await open_run(store)
    held, tool = Held(), FakeTool()
    spec = (
        ToolSpec(executor=held.wait, projector=tool.projector)
        if stage is Stage.EXECUTING
        else ToolSpec(executor=tool.executor, projector=held.project)
    )
    boundary = ToolBoundary(store, {TOOL: spec})
    task = asyncio.create_task(boundary.invoke(RunContext(RUN), envelope()))
    await held.running.wait()
    record = await store.get(RUN, "call_1")
    assert record is not None and record.state.stage is stage

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    await assert_closed(store, ErrorCode.CALLER_CANCELLED)


async def test_cancelling_a_call_whose_tool_runs_in_a_thread_closes_the_record(store: Store):
    """A plain executor runs on in its worker thread after the caller cancels; the record is
    closed at once and nothing the thread returns later changes it."""
    await open_run(store)
    started, release, finished = threading.Event(), threading.Event(), threading.Event()
    tool = FakeTool()

    def blocking(arguments: Any, call: ToolCall) -> Any:
        started.set()
        release.wait(timeout=30)
        finished.set()
        return {"late": True}

    boundary = ToolBoundary(store, {TOOL: ToolSpec(executor=blocking, projector=tool.projector)})
    task = asyncio.create_task(boundary.invoke(RunContext(RUN), envelope()))
    await asyncio.to_thread(started.wait, 30)

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await assert_closed(store, ErrorCode.CALLER_CANCELLED)
    release.set()
    await asyncio.to_thread(finished.wait, 30)  # no thread is left behind

    await assert_closed(store, ErrorCode.CALLER_CANCELLED)
    assert tool.projected == 0


async def test_cancelling_while_the_record_is_being_created_closes_it(store: Store):
    """A cancellation that lands while the creation script is in flight still leaves no record
    PROJECTING: the same creation is sent again (applied or created, never twice) and closed;
    the tool never runs."""
    await open_run(store)
    tool = FakeTool()
    boundary = ToolBoundary(store, {TOOL: tool.spec()})
    calls_before = store.batch_stats.calls
    task = asyncio.create_task(boundary.invoke(RunContext(RUN), envelope()))
    await wait_for(lambda: store.batch_stats.calls > calls_before)  # the creation is sent

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    await assert_closed(store, ErrorCode.CALLER_CANCELLED)
    assert tool.executed == 0
    events = await store.events(RUN, "call_1")
    assert [type(e.event).__name__ for e in events] == ["Preflighted", "Failed"]
    info = await store.run_info(RUN)
    assert info is not None and info.used_total == 1


async def cancelled_twice(store: Store) -> None:
    """A call cancelled once while its tool runs, and again once its closing has started:
    the caller's CancelledError comes back at once; the closing goes on in the background."""
    await open_run(store)
    held = Held()
    boundary = ToolBoundary(store, {TOOL: ToolSpec(executor=held.wait, projector=held.project)})
    task = asyncio.create_task(boundary.invoke(RunContext(RUN), envelope()))
    await held.running.wait()

    task.cancel()
    await wait_for(lambda: bool(boundary._runner.interruptions._running))  # the closing has started
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_second_cancellation_does_not_stop_the_closing(store: Store):
    """Cancelling the caller again while its record is being closed re-raises at once; the
    closing goes on in the background and the record still ends CALLER_CANCELLED."""
    await cancelled_twice(store)

    async def closed() -> bool:
        record = await store.get(RUN, "call_1")
        return record is not None and record.state.status is Status.ERROR

    await wait_for(closed)
    await assert_closed(store, ErrorCode.CALLER_CANCELLED)


async def test_closing_the_store_waits_for_a_closing_that_outlived_its_caller(
    make_store: Any, redis: Any
) -> None:
    """A store closed while the closing of a call cancelled twice still runs waits for
    that closing: when ``aclose`` returns, the record is already ERROR (the closing did
    not go on over a connection opened again after the close)."""
    store: Store = make_store()
    await cancelled_twice(store)

    await store.aclose()
    record = await redis.hgetall(store.keys.record(RUN, "call_1"))
    assert (record[b"status"], record[b"error_code"]) == (b"ERROR", b"CALLER_CANCELLED")


async def test_cancelling_while_a_failure_is_being_written_still_closes_the_record(
    store: Store,
):
    """A cancellation that reaches the call as its Failed event is about to be sent (here
    requested by the failing projector itself, so it lands at exactly that await) still
    leaves the record ERROR: the Failed event never went out, CALLER_CANCELLED is written."""
    await open_run(store)

    def projector(raw: Any, call: ToolCall) -> Projection:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # delivered at the boundary's next await: the Failed write
        raise RuntimeError("projection failed")

    tool = FakeTool()
    boundary = ToolBoundary(store, {TOOL: ToolSpec(executor=tool.executor, projector=projector)})

    with pytest.raises(asyncio.CancelledError):
        await boundary.invoke(RunContext(RUN), envelope())
    this_test = asyncio.current_task()
    assert this_test is not None
    this_test.uncancel()  # the cancellation was this test's own, and it has arrived

    await assert_closed(store, ErrorCode.CALLER_CANCELLED)
