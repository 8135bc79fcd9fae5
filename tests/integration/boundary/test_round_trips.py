"""A lone agent's call waits for Redis at most twice: ``Preflighted`` before the tool runs,
then the raw response and the outcome, written one behind the other on one connection and
answered together, after the projector.

The batcher counts every wait for an answer (``BatchStats.waits``); Redis counts every
command it ran (``INFO commandstats``). A change that adds a round trip to the plain path,
through the batcher or beside it, fails here.
"""

from __future__ import annotations

import re
from typing import Any, Final

import pytest
from redis.asyncio import Redis

from eventstore import RunContext, Store, ToolBoundary
from eventstore.audit import verify_against_events
from eventstore.wire.scripts import FOLDER, WRAPPERS
from machine.codes import ErrorCode
from tests.helpers import record_fields
from tests.support.calls import RUN, TOOL, envelope, open_run, outcome
from tests.support.tools import FakeTool

pytestmark = pytest.mark.backends("single", "cluster")

#: A command a Lua script calls.
_CALLED: Final = re.compile(r"redis\.p?call\(['\"](\w+)['\"]")
#: Calls measured per case: the waits per call must be exact for every one of them.
CALLS = 5


async def waits_per_call(store: Store, boundary: ToolBoundary, prefix: str) -> tuple[float, float]:
    """Invoke :data:`CALLS` calls one at a time; the waits and script calls per call."""
    stats = store.batch_stats
    waits, calls = stats.waits, stats.calls
    for number in range(CALLS):
        await boundary.invoke(RunContext(RUN), envelope(f"{prefix}{number}"))
    return (stats.waits - waits) / CALLS, (stats.calls - calls) / CALLS


async def commands_run(redis: Redis) -> dict[str, int]:
    """How many times the server ran each command so far."""
    stats = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


async def test_a_call_one_at_a_time_waits_for_redis_twice(store: Store) -> None:
    """A READY call, a call whose projector raises and one whose executor raises each wait
    for Redis twice, whatever their outcome: three scripts (two for the executor's failure)
    in two waits."""
    await open_run(store)
    tool, failing_projector, failing_executor = (
        FakeTool(),
        FakeTool(raise_in_projector=RuntimeError("no")),
        FakeTool(raise_in_executor=RuntimeError("no")),
    )
    boundaries = {
        "ready": ToolBoundary(store, {TOOL: tool.spec()}),
        "projector": ToolBoundary(store, {TOOL: failing_projector.spec()}),
        "executor": ToolBoundary(store, {TOOL: failing_executor.spec()}),
    }
    # The first call of a store waits once more: it learns that the server holds its scripts.
    assert outcome(await boundaries["ready"].invoke(RunContext(RUN), envelope("warm"))) == "READY"

    assert await waits_per_call(store, boundaries["ready"], "r") == (2, 3)
    assert await waits_per_call(store, boundaries["projector"], "p") == (2, 3)
    assert await waits_per_call(store, boundaries["executor"], "e") == (2, 2)
    record = await store.get(RUN, "p0")
    assert record is not None and record.state.error_code is ErrorCode.PROJECTION_FAILED
    assert record.raw is not None  # the raw response written ahead was applied first


@pytest.mark.not_on_cluster("INFO commandstats of one server; the cluster's are per master")
async def test_a_call_sends_redis_nothing_but_its_three_scripts(store: Store, redis: Redis) -> None:
    """Besides the waits the batcher counts, nothing else goes to Redis per call: a READY
    call runs exactly three EVALSHA on the server and no other command."""
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: FakeTool().spec()})
    await boundary.invoke(RunContext(RUN), envelope("warm"))
    before = await commands_run(redis)

    for number in range(CALLS):
        assert outcome(await boundary.invoke(RunContext(RUN), envelope(f"c{number}"))) == "READY"

    after = await commands_run(redis)
    ran: dict[str, Any] = {
        name: after[name] - before.get(name, 0) for name in after if after[name] != before.get(name)
    }
    ran.pop("info", None)  # this test's own reading
    assert ran.pop("evalsha") == 3 * CALLS
    assert set(ran) <= commands_in_scripts(), ran  # those the scripts run themselves


def commands_in_scripts() -> set[str]:
    """Every command the store's write scripts call (counted by Redis as commands too)."""
    sources = [FOLDER.source(wrapper.name) for wrapper in WRAPPERS]
    return {name.lower() for source in sources for name in _CALLED.findall(source)}


@pytest.mark.not_on_cluster("SCRIPT FLUSH of one server; the cluster's masters each hold theirs")
async def test_a_pair_written_ahead_survives_a_server_that_lost_its_scripts(
    store: Store, redis: Redis
) -> None:
    """After SCRIPT FLUSH, the raw response written ahead and its outcome both meet NOSCRIPT:
    the script is loaded again and both are sent again in order, so the call is READY with
    each event once and its record equal to its journal."""
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: FakeTool().spec()})
    await boundary.invoke(RunContext(RUN), envelope("warm"))
    reloads = store.batch_stats.reloads

    await redis.script_flush()
    reply = await boundary.invoke(RunContext(RUN), envelope("after-flush"))

    assert outcome(reply) == "READY"
    assert store.batch_stats.reloads > reloads
    events = await store.events(RUN, "after-flush")
    assert [type(e.event).__name__ for e in events] == [
        "Preflighted",
        "ProjectingStarted",
        "Completed",
    ]
    record = await store.get(RUN, "after-flush")
    assert record is not None and record.raw is not None and record.result is not None
    assert verify_against_events(await record_fields(store, RUN, "after-flush"), events) == []
