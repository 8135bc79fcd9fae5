"""Budgets and duplicate checks hold across boundaries on separate clients and processes."""

from __future__ import annotations

import asyncio
import collections
import functools
from typing import Any

import msgspec
import pytest
from redis.asyncio import Redis

from eventstore import Projection, RunContext, Store, ToolBoundary, ToolCall, ToolSpec
from machine.codes import Status
from tests.conftest import SpawnModule
from tests.support.calls import RUN, TOOL, envelope, open_run, outcome
from tests.support.tools import namespace_keys

pytestmark = pytest.mark.backends("single", "cluster")


class CountingTool:
    """An async tool that yields inside the executor so concurrent calls interleave."""

    def __init__(self) -> None:
        self.executed: collections.Counter[str] = collections.Counter()

    async def executor(self, arguments: dict[str, Any], call: ToolCall) -> Any:
        self.executed[call.tool_call_id] += 1
        await asyncio.sleep(0.001)
        return {"call": call.tool_call_id}

    def projector(self, raw: Any, call: ToolCall) -> Projection:
        return Projection(result="ok", evidence_status="EVIDENCE_FOUND", scope="s")

    def spec(self) -> ToolSpec:
        return ToolSpec(executor=self.executor, projector=self.projector)


async def record_count(redis: Redis, namespace: str) -> int:
    """Canonical record hashes of the namespace (event streams not counted)."""
    keys = await namespace_keys(redis, namespace)
    return sum(1 for key in keys if b":inv:" in key and not key.endswith(b":ev"))


def two_boundaries(
    make_store: Any, tools: dict[str, CountingTool]
) -> tuple[list[Store], list[ToolBoundary]]:
    """Two boundaries, each on its own Store (its own client and connection pool)."""
    stores: list[Store] = [make_store(), make_store()]
    assert stores[0].client.connection_pool is not stores[1].client.connection_pool
    specs = {name: tool.spec() for name, tool in tools.items()}
    return stores, [ToolBoundary(store, specs) for store in stores]


async def fire(boundaries: list[ToolBoundary], calls: int, tool: str = TOOL) -> list[str]:
    """``calls`` concurrent calls with distinct ids, alternating between the boundaries."""
    replies = await asyncio.gather(
        *(
            boundaries[i % len(boundaries)].invoke(
                RunContext(RUN), envelope(f"c{i}", tool=tool, arguments={"i": i})
            )
            for i in range(calls)
        )
    )
    return [outcome(reply) for reply in replies]


@pytest.mark.not_on_cluster(
    "asserts two single-server connection pools; test_cluster_layout has the cluster version"
)
async def test_tool_budget_holds_under_200_concurrent_calls_from_two_clients(
    make_store: Any, redis: Redis, namespace: str
):
    """Run budget 50, tool budget 30, 200 concurrent calls split over two clients: exactly 30 run,
    the other 170 are TOOL_BUDGET_EXHAUSTED."""
    tool = CountingTool()
    stores, boundaries = two_boundaries(make_store, {TOOL: tool})
    await open_run(stores[0], budget=50, tools={TOOL: 30})

    outcomes = await fire(boundaries, 200)

    assert collections.Counter(outcomes) == {"READY": 30, "TOOL_BUDGET_EXHAUSTED": 170}
    assert sum(tool.executed.values()) == 30 and set(tool.executed.values()) == {1}
    info = await stores[1].run_info(RUN)
    assert info is not None and (info.used_total, info.used[TOOL]) == (30, 30)
    assert await record_count(redis, namespace) == 30


@pytest.mark.not_on_cluster(
    "asserts two single-server connection pools; test_cluster_layout has the cluster version"
)
async def test_run_budget_holds_under_200_concurrent_calls_from_two_clients(
    make_store: Any, redis: Redis, namespace: str
):
    """Run budget 50 over two tools of budget 40 each, 200 concurrent calls from two clients:
    exactly 50 run, no tool passes 40, the rest are budget refusals."""
    tools = {"alpha": CountingTool(), "beta": CountingTool()}
    stores, boundaries = two_boundaries(make_store, tools)
    await open_run(stores[0], budget=50, tools={"alpha": 40, "beta": 40})

    replies = await asyncio.gather(
        *(
            boundaries[i % 2].invoke(
                RunContext(RUN), envelope(f"c{i}", tool="alpha" if i % 4 < 2 else "beta")
            )
            for i in range(200)
        )
    )
    outcomes = collections.Counter(outcome(reply) for reply in replies)

    assert outcomes["READY"] == 50
    assert outcomes["RUN_BUDGET_EXHAUSTED"] > 0
    assert set(outcomes) <= {"READY", "RUN_BUDGET_EXHAUSTED", "TOOL_BUDGET_EXHAUSTED"}
    used = {name: sum(t.executed.values()) for name, t in tools.items()}
    assert sum(used.values()) == 50 and max(used.values()) <= 40
    info = await stores[1].run_info(RUN)
    assert info is not None and info.used_total == 50 and info.used == used
    assert await record_count(redis, namespace) == 50


@pytest.mark.not_on_cluster("asserts two single-server connection pools")
async def test_run_budget_binds_before_a_larger_tool_budget(
    make_store: Any, redis: Redis, namespace: str
):
    """Run budget 30 with tool budget 50: exactly 30 of 200 concurrent calls run, the other 170
    are RUN_BUDGET_EXHAUSTED."""
    tool = CountingTool()
    stores, boundaries = two_boundaries(make_store, {TOOL: tool})
    await open_run(stores[0], budget=30, tools={TOOL: 50})

    outcomes = await fire(boundaries, 200)

    assert collections.Counter(outcomes) == {"READY": 30, "RUN_BUDGET_EXHAUSTED": 170}
    assert (await stores[1].run_info(RUN)).used_total == 30  # type: ignore[union-attr]
    assert await record_count(redis, namespace) == 30


@pytest.mark.parametrize("max_connections", [64, 2])
async def test_more_concurrent_calls_than_pool_connections_wait_for_a_connection(
    make_store: Any, max_connections: int
):
    """A burst larger than the store's connection pool queues for connections: all 150
    concurrent calls run; none is answered STORE_UNAVAILABLE."""
    store: Store = make_store(max_connections=max_connections)
    tool = CountingTool()
    await open_run(store)

    outcomes = await fire([ToolBoundary(store, {TOOL: tool.spec()})], 150)

    assert collections.Counter(outcomes) == {"READY": 150}


async def test_same_tool_call_id_from_two_clients_runs_once(make_store: Any, redis: Redis):
    """The same tool_call_id sent through both clients at once: one executes, the other gets
    DUPLICATE_TOOL_CALL (20 rounds, each with a fresh id)."""
    tools = [CountingTool(), CountingTool()]
    stores: list[Store] = [make_store(), make_store()]
    boundaries = [
        ToolBoundary(store, {TOOL: t.spec()}) for store, t in zip(stores, tools, strict=True)
    ]
    await open_run(stores[0])

    for round_ in range(20):
        call_id = f"same-{round_}"
        replies = await asyncio.gather(
            *(boundary.invoke(RunContext(RUN), envelope(call_id)) for boundary in boundaries)
        )

        assert sorted(outcome(reply) for reply in replies) == ["DUPLICATE_TOOL_CALL", "READY"]
        assert tools[0].executed[call_id] + tools[1].executed[call_id] == 1
        record = await stores[1].get(RUN, call_id)
        assert record is not None and record.state.status is Status.READY
    assert (await stores[0].run_info(RUN)).used_total == 20  # type: ignore[union-attr]


@pytest.fixture
def spawn_harness(
    spawn_module: SpawnModule,
) -> SpawnModule:
    """Start ``tests.support.harness_process`` subprocesses (killed after the test)."""
    return functools.partial(spawn_module, "tests.support.harness_process")


@pytest.mark.parametrize(
    ("run_budget", "tool_budget", "refusal"),
    [(None, 30, "TOOL_BUDGET_EXHAUSTED"), (25, None, "RUN_BUDGET_EXHAUSTED")],
    ids=["tool-budget", "run-budget"],
)
async def test_budget_holds_across_two_os_processes(
    make_store: Any,
    redis: Redis,
    redis_url: str,
    namespace: str,
    spawn_harness: SpawnModule,
    run_budget: int | None,
    tool_budget: int | None,
    refusal: str,
):
    """A second OS process and this one fire 100 calls each at one run at the same moment: the
    budget is spent exactly and never exceeded."""
    budget = run_budget or tool_budget
    tool = CountingTool()
    store: Store = make_store()
    await open_run(store, budget=run_budget, tools={TOOL: tool_budget})
    boundary = ToolBoundary(store, {TOOL: tool.spec()})
    child = await spawn_harness(redis_url, namespace, RUN, TOOL, "child", "100")
    assert child.stdin is not None and child.stdout is not None
    assert await asyncio.wait_for(child.stdout.readline(), timeout=30) == b"ready\n"

    child.stdin.write(b"go\n")
    await child.stdin.drain()
    replies = await asyncio.gather(
        *(boundary.invoke(RunContext(RUN), envelope(f"parent-{i}")) for i in range(100))
    )
    stdout, stderr = await asyncio.wait_for(child.communicate(), timeout=60)

    assert child.returncode == 0, stderr.decode(errors="replace")[-2000:]
    child_counts: dict[str, int] = msgspec.json.decode(stdout.strip().splitlines()[-1])
    parent_counts = collections.Counter(outcome(reply) for reply in replies)
    assert set(child_counts) <= {"READY", refusal} and set(parent_counts) <= {"READY", refusal}
    assert child_counts.get("READY", 0) + parent_counts["READY"] == budget
    assert child_counts.get(refusal, 0) + parent_counts[refusal] == 200 - budget
    info = await store.run_info(RUN)
    assert info is not None and info.used_total == budget
    assert await record_count(redis, namespace) == budget
