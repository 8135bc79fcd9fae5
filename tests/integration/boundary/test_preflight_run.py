"""The bad-input catalogue, run part: run state, pause, duplicates, budgets and grants.

These refusals come from the creation script; each runs nothing and creates no key.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from eventstore import RunContext, Store, ToolBoundary
from eventstore.writer import now_ms
from machine.codes import ErrorCode
from tests.helpers import record_fields
from tests.support.calls import (
    RUN,
    TOOL,
    assert_refused_before_execution,
    envelope,
    open_run,
    outcome,
)
from tests.support.tools import FakeTool, namespace_keys
from tests.support.waiting import wait_for

pytestmark = pytest.mark.backends("single", "cluster")


async def test_run_never_opened_is_inactive(store: Store, redis: Redis, namespace: str):
    """A call of a run that was never opened is RUN_INACTIVE and creates no key at all."""
    tool = FakeTool()
    boundary = ToolBoundary(store, {TOOL: tool.spec()})

    await assert_refused_before_execution(
        boundary, tool, envelope(), ErrorCode.RUN_INACTIVE, redis=redis, namespace=namespace
    )
    assert await namespace_keys(redis, namespace) == []


async def test_closed_run_is_inactive(store: Store, redis: Redis, namespace: str):
    """After close_run every call of the run is RUN_INACTIVE."""
    tool = FakeTool()
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: tool.spec()})
    assert outcome(await boundary.invoke(RunContext(RUN), envelope("before"))) == "READY"
    assert await store.close_run(RUN)

    await assert_refused_before_execution(
        boundary, tool, envelope("after"), ErrorCode.RUN_INACTIVE, redis=redis, namespace=namespace
    )


async def test_run_past_its_deadline_is_refused(store: Store, redis: Redis, namespace: str):
    """A call after the run's deadline is RUN_DEADLINE_EXPIRED."""
    tool = FakeTool()
    opened = await store.open_run(RUN, deadline=timedelta(milliseconds=500))
    boundary = ToolBoundary(store, {TOOL: tool.spec()})
    await wait_for(lambda: now_ms() > opened.deadline_ms + 5)

    await assert_refused_before_execution(
        boundary,
        tool,
        envelope(),
        ErrorCode.RUN_DEADLINE_EXPIRED,
        redis=redis,
        namespace=namespace,
    )


async def test_paused_execution_is_refused_until_resumed(
    store: Store, redis: Redis, namespace: str
):
    """While execution is paused calls are EXECUTION_PAUSED; after resuming they run again."""
    tool = FakeTool()
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: tool.spec()})
    await store.set_paused(True)

    await assert_refused_before_execution(
        boundary, tool, envelope(), ErrorCode.EXECUTION_PAUSED, redis=redis, namespace=namespace
    )

    await store.set_paused(False)
    reply = await boundary.invoke(RunContext(RUN), envelope())
    assert outcome(reply) == "READY" and tool.executed == 1


async def test_duplicate_canonical_key_is_refused(store: Store, redis: Redis, namespace: str):
    """A second call with the same run and tool_call_id is DUPLICATE_TOOL_CALL, even with other
    input, and leaves the first record and the budgets untouched."""
    tool = FakeTool()
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: tool.spec()})
    assert outcome(await boundary.invoke(RunContext(RUN), envelope(arguments={"q": 1}))) == "READY"
    fields = await record_fields(store, RUN, "call_1")
    used = (await store.run_info(RUN)).used_total  # type: ignore[union-attr]

    await assert_refused_before_execution(
        boundary,
        tool,
        envelope(arguments={"q": 2}),
        ErrorCode.DUPLICATE_TOOL_CALL,
        redis=redis,
        namespace=namespace,
    )
    assert await record_fields(store, RUN, "call_1") == fields
    assert (await store.run_info(RUN)).used_total == used  # type: ignore[union-attr]


async def test_duplicate_is_refused_after_the_first_record_expired(
    make_store: Any, redis: Redis, namespace: str
):
    """A tool_call_id stays used for the run's life: reusing it after its record expired is
    DUPLICATE_TOOL_CALL and recreates nothing."""
    # Long enough for the call to end READY on a loaded machine, short enough to wait out.
    store = make_store(ttl=timedelta(seconds=1))
    tool = FakeTool()
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: tool.spec()})
    assert outcome(await boundary.invoke(RunContext(RUN), envelope())) == "READY"

    async def record_gone() -> bool:
        return await store.get(RUN, "call_1") is None

    await wait_for(record_gone)

    await assert_refused_before_execution(
        boundary,
        tool,
        envelope(),
        ErrorCode.DUPLICATE_TOOL_CALL,
        redis=redis,
        namespace=namespace,
    )
    assert await store.get(RUN, "call_1") is None


async def test_exhausted_tool_budget_is_refused(store: Store, redis: Redis, namespace: str):
    """Once a tool's budget is used up its calls are TOOL_BUDGET_EXHAUSTED; others still run."""
    tool, other = FakeTool(), FakeTool()
    await open_run(store, tools={TOOL: 2, "other": None})
    boundary = ToolBoundary(store, {TOOL: tool.spec(), "other": other.spec()})
    for call_id in ("c1", "c2"):
        assert outcome(await boundary.invoke(RunContext(RUN), envelope(call_id))) == "READY"

    await assert_refused_before_execution(
        boundary,
        tool,
        envelope("c3"),
        ErrorCode.TOOL_BUDGET_EXHAUSTED,
        redis=redis,
        namespace=namespace,
    )
    assert outcome(await boundary.invoke(RunContext(RUN), envelope("c4", tool="other"))) == "READY"
    info = await store.run_info(RUN)
    assert info is not None and info.used == {TOOL: 2, "other": 1} and info.used_total == 3


async def test_exhausted_run_budget_is_refused(store: Store, redis: Redis, namespace: str):
    """Once the run's budget is used up every tool's calls are RUN_BUDGET_EXHAUSTED."""
    tool, other = FakeTool(), FakeTool()
    await open_run(store, budget=2)
    boundary = ToolBoundary(store, {TOOL: tool.spec(), "other": other.spec()})
    assert outcome(await boundary.invoke(RunContext(RUN), envelope("c1"))) == "READY"
    assert outcome(await boundary.invoke(RunContext(RUN), envelope("c2", tool="other"))) == "READY"

    for call_id, spec in (("c3", tool), ("c4", other)):
        await assert_refused_before_execution(
            boundary,
            spec,
            envelope(call_id, tool=TOOL if spec is tool else "other"),
            ErrorCode.RUN_BUDGET_EXHAUSTED,
            redis=redis,
            namespace=namespace,
        )
    assert (await store.run_info(RUN)).used_total == 2  # type: ignore[union-attr]


async def test_zero_budget_refuses_the_first_call(store: Store, redis: Redis, namespace: str):
    """A tool granted with budget 0 can never run."""
    tool = FakeTool()
    await open_run(store, tools={TOOL: 0})
    boundary = ToolBoundary(store, {TOOL: tool.spec()})

    await assert_refused_before_execution(
        boundary,
        tool,
        envelope(),
        ErrorCode.TOOL_BUDGET_EXHAUSTED,
        redis=redis,
        namespace=namespace,
    )


async def test_tool_outside_the_run_grant_list_is_unauthorized(
    store: Store, redis: Redis, namespace: str
):
    """A run opened with a tool list may call only those tools; others are UNAUTHORIZED."""
    tool, granted = FakeTool(), FakeTool()
    await open_run(store, tools={"granted": None})
    boundary = ToolBoundary(store, {TOOL: tool.spec(), "granted": granted.spec()})

    await assert_refused_before_execution(
        boundary, tool, envelope("c1"), ErrorCode.UNAUTHORIZED, redis=redis, namespace=namespace
    )
    assert outcome(await boundary.invoke(RunContext(RUN), envelope("c2", tool="granted"))) == (
        "READY"
    )


async def test_revoked_tool_is_unauthorized(store: Store, redis: Redis, namespace: str):
    """After revoke_tool the run's calls of that tool are UNAUTHORIZED."""
    tool = FakeTool()
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: tool.spec()})
    assert outcome(await boundary.invoke(RunContext(RUN), envelope("c1"))) == "READY"
    assert await store.runs.revoke_tool(RUN, TOOL)

    await assert_refused_before_execution(
        boundary, tool, envelope("c2"), ErrorCode.UNAUTHORIZED, redis=redis, namespace=namespace
    )
