"""A tool's time limit (``ToolSpec.timeout_s``): an executor past it fails its call closed."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any

import pytest

from eventstore import (
    Projection,
    RunContext,
    Store,
    ToolBoundary,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from eventstore.errors import InvalidArgument
from machine.codes import ErrorCode, EvidenceStatus, Status
from tests.support.calls import RUN, TOOL, assert_safe_error, envelope, open_run, outcome
from tests.support.tools import FakeTool

pytestmark = pytest.mark.backends("single", "cluster")

LIMIT_S = 0.2


async def assert_failed_on_time(store: Store, boundary: ToolBoundary, tool: FakeTool) -> None:
    """The call answers EXECUTION_FAILED soon after the limit; its record says the same."""
    loop = asyncio.get_running_loop()
    started = loop.time()

    reply = await boundary.invoke(RunContext(RUN), envelope())

    assert LIMIT_S <= loop.time() - started < LIMIT_S + 2.0
    assert_safe_error(reply, ErrorCode.EXECUTION_FAILED)
    record = await store.get(RUN, "call_1")
    assert record is not None
    assert (record.state.status, record.state.error_code) == (
        Status.ERROR,
        ErrorCode.EXECUTION_FAILED,
    )
    assert record.raw is None and tool.projected == 0


async def test_an_async_executor_past_its_time_limit_fails_the_call(store: Store):
    """The executor is cancelled at its limit; nothing it would have returned is stored."""
    cancelled = asyncio.Event()
    tool = FakeTool()

    async def slow(arguments: dict[str, Any], call: ToolCall) -> Any:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "late"

    await open_run(store)
    spec = ToolSpec(executor=slow, projector=tool.projector, timeout_s=LIMIT_S)

    await assert_failed_on_time(store, ToolBoundary(store, {TOOL: spec}), tool)
    assert cancelled.is_set()


async def test_a_threaded_executor_past_its_time_limit_fails_the_call(store: Store):
    """A plain executor runs in a worker thread; the call stops waiting for it at the limit."""
    release = threading.Event()
    tool = FakeTool()

    def slow(arguments: dict[str, Any], call: ToolCall) -> Any:
        release.wait(30)
        return "late"

    await open_run(store)
    spec = ToolSpec(executor=slow, projector=tool.projector, timeout_s=LIMIT_S)
    try:
        await assert_failed_on_time(store, ToolBoundary(store, {TOOL: spec}), tool)
    finally:
        release.set()  # the thread itself cannot be cancelled: let it end


async def test_an_executor_within_its_time_limit_completes(store: Store):
    """A limit only stops executors that overrun it."""
    tool = FakeTool()

    async def quick(arguments: dict[str, Any], call: ToolCall) -> Any:
        await asyncio.sleep(0.01)
        return await tool.executor(arguments, call)

    await open_run(store)
    spec = ToolSpec(executor=quick, projector=tool.projector, timeout_s=LIMIT_S)
    boundary = ToolBoundary(store, {TOOL: spec})

    replies = [await boundary.invoke(RunContext(RUN), envelope(f"call_{i}")) for i in range(3)]

    assert [outcome(reply) for reply in replies] == ["READY"] * 3


async def test_tools_with_and_without_limits_run_side_by_side(store: Store):
    """Concurrent calls each keep their own tool's limit: only the slow one fails."""
    tool = FakeTool()

    async def slow(arguments: dict[str, Any], call: ToolCall) -> Any:
        await asyncio.sleep(30)

    await open_run(store)
    boundary = ToolBoundary(
        store,
        {
            "slow": ToolSpec(executor=slow, projector=tool.projector, timeout_s=LIMIT_S),
            "fast": tool.spec(timeout_s=LIMIT_S),
            "free": tool.spec(),
        },
    )
    calls = [envelope(f"call_{name}", tool=name) for name in ("slow", "fast", "free")]

    replies = await asyncio.gather(*(boundary.invoke(RunContext(RUN), call) for call in calls))

    assert [outcome(reply) for reply in replies] == [
        ErrorCode.EXECUTION_FAILED,
        "READY",
        "READY",
    ]


async def test_a_tool_may_call_the_boundary_again_within_its_limit(store: Store):
    """An executor that invokes another limited tool (same limit) gets that tool's reply."""
    inner = FakeTool()
    boundaries: list[ToolBoundary] = []

    async def outer(arguments: dict[str, Any], call: ToolCall) -> Any:
        reply = await boundaries[0].invoke(RunContext(RUN), envelope("inner_call", tool="inner"))
        return {"inner": outcome(reply)}

    def project(raw: Any, call: ToolCall) -> Projection:
        return Projection(result=raw, evidence_status=EvidenceStatus.EVIDENCE_FOUND, scope="s")

    await open_run(store)
    boundaries.append(
        ToolBoundary(
            store,
            {
                "outer": ToolSpec(executor=outer, projector=project, timeout_s=5),
                "inner": inner.spec(timeout_s=5),
            },
        )
    )

    started = time.monotonic()
    reply = await boundaries[0].invoke(RunContext(RUN), envelope(tool="outer"))

    assert isinstance(reply, ToolResult)
    assert reply.result == {"inner": "READY"}
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("limit", [0, -1.0, math.nan, math.inf])
async def test_a_time_limit_that_is_not_positive_seconds_is_refused_up_front(
    store: Store, limit: float
):
    """A limit that could never be kept (or never end a call) fails the boundary's setup."""
    with pytest.raises(InvalidArgument, match="time limits"):
        ToolBoundary(store, {TOOL: FakeTool().spec(timeout_s=limit)})
