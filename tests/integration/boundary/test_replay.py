"""``on_duplicate="replay"``: a retried call gets the first call's recorded reply, never a second
execution, never a second budget unit."""

from __future__ import annotations

import asyncio
import functools
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from redis.asyncio import Redis

from eventstore import (
    Limits,
    RunContext,
    Store,
    ToolBoundary,
    ToolError,
    ToolResult,
    reply_to_builtins,
)
from eventstore.errors import InvalidArgument
from machine.codes import ErrorCode, Status
from machine.ids import invocation_id
from tests.conftest import SpawnModule
from tests.helpers import commandstats
from tests.support import first_call_process
from tests.support.calls import RUN, TOOL, assert_safe_error, envelope, open_run
from tests.support.tools import FakeTool
from tests.support.waiting import wait_for

pytestmark = pytest.mark.backends("single", "cluster")

EXPIRY_COMMANDS = ("expire", "pexpire", "expireat", "pexpireat", "persist", "getex")


async def command_calls(redis: Redis, command: str) -> int:
    """How often the server (every primary of a cluster) has run ``command``."""
    return (await commandstats(redis)).get(command, 0)


async def used_total(store: Store) -> int:
    info = await store.run_info(RUN)
    assert info is not None
    return info.used_total


def replaying(store: Store, tool: FakeTool, **options: Any) -> ToolBoundary:
    return ToolBoundary(store, {TOOL: tool.spec()}, on_duplicate="replay", **options)


async def test_a_retried_call_gets_the_recorded_result(store: Store, redis: Redis):
    """The same call sent again gets the first reply exactly; the tool ran once, one budget unit
    was spent, the record is unchanged and its expiry untouched (no expiry command issued)."""
    tool = FakeTool(result={"titles": ["Refund policy"], "score": 0.25, "none": None})
    await open_run(store, budget=5)
    boundary = replaying(store, tool)
    first = await boundary.invoke(RunContext(RUN), envelope())
    record_before = await store.reader.fields(RUN, "call_1")
    pttl_before = await redis.pttl(store.keys.record(RUN, "call_1"))
    expiries_before = [await command_calls(redis, c) for c in EXPIRY_COMMANDS]

    again = [await boundary.invoke(RunContext(RUN), envelope()) for _ in range(3)]

    assert isinstance(first, ToolResult)
    assert all(reply == first for reply in again)
    assert all(reply_to_builtins(reply) == reply_to_builtins(first) for reply in again)
    assert (tool.executed, tool.projected) == (1, 1)
    assert await used_total(store) == 1
    assert await store.reader.fields(RUN, "call_1") == record_before
    assert await redis.pttl(store.keys.record(RUN, "call_1")) <= pttl_before
    assert [await command_calls(redis, c) for c in EXPIRY_COMMANDS] == expiries_before


async def test_a_retried_failed_call_gets_its_error_code(store: Store):
    """A call that ended ERROR is replayed as its code, naming the record; the tool is not run
    again."""
    tool = FakeTool(raise_in_executor=RuntimeError("boom"))
    await open_run(store)
    boundary = replaying(store, tool)

    first = await boundary.invoke(RunContext(RUN), envelope())
    again = await boundary.invoke(RunContext(RUN), envelope())

    assert_safe_error(first, ErrorCode.EXECUTION_FAILED)
    assert again == first
    assert again.invocation_id == invocation_id(RUN, "call_1")  # type: ignore[union-attr]
    assert tool.executed == 1
    assert await used_total(store) == 1


async def test_a_retried_size_error_names_the_same_limit_even_after_the_limits_changed(
    make_store: Any,
):
    """A call refused for its size is replayed with the message naming the limit its record
    says was hit, the one the first call read, also by a boundary whose store has other
    limits now."""
    store = make_store(limits=Limits(raw_bytes=1000))
    tool = FakeTool(raw="x" * 1001)
    await open_run(store)
    first = await replaying(store, tool).invoke(RunContext(RUN), envelope())
    larger = make_store(limits=Limits(raw_bytes=4096))

    again = await replaying(larger, tool).invoke(RunContext(RUN), envelope())

    assert_safe_error(
        first,
        ErrorCode.RESULT_TOO_LARGE,
        "The raw tool response is larger than the 1000 B raw response limit.",
    )
    assert again == first
    assert tool.executed == 1


@pytest.mark.parametrize(
    "changed",
    [{"arguments": {"q": 2}}, {"arguments": {"q": 1, "extra": True}}, {"tool": "other"}],
    ids=["other-value", "other-keys", "other-tool"],
)
async def test_another_request_under_the_same_id_is_still_a_duplicate(
    store: Store, changed: dict[str, Any]
):
    """Another canonical request (or another tool) under a used id is DUPLICATE_TOOL_CALL, as
    without replay: nothing runs, the record is not named and stays as it was."""
    tool, other = FakeTool(), FakeTool()
    await open_run(store)
    boundary = ToolBoundary(
        store, {TOOL: tool.spec(), "other": other.spec()}, on_duplicate="replay"
    )
    await boundary.invoke(RunContext(RUN), envelope())
    before = await store.reader.fields(RUN, "call_1")

    reply = await boundary.invoke(RunContext(RUN), envelope(**changed))

    assert_safe_error(reply, ErrorCode.DUPLICATE_TOOL_CALL)
    assert reply == ToolError.of(ErrorCode.DUPLICATE_TOOL_CALL, tool_call_id="call_1")
    assert (tool.executed, other.executed) == (1, 0)
    assert await store.reader.fields(RUN, "call_1") == before
    assert await used_total(store) == 1


async def test_the_same_request_as_json_text_is_the_same_request(store: Store):
    """The comparison is of canonical requests: the arguments as JSON text with other spacing and
    key order replay the call made with a mapping."""
    tool = FakeTool()
    await open_run(store)
    boundary = replaying(store, tool)

    first = await boundary.invoke(RunContext(RUN), envelope(arguments={"a": 1, "b": [1, 2]}))
    again = await boundary.invoke(RunContext(RUN), envelope(arguments='{ "a":1,"b":[1, 2] }'))

    assert isinstance(first, ToolResult) and again == first
    assert tool.executed == 1


async def test_refuse_stays_the_default(store: Store):
    """Without on_duplicate the retried call is DUPLICATE_TOOL_CALL, even with the same request."""
    tool = FakeTool()
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: tool.spec()})

    await boundary.invoke(RunContext(RUN), envelope())
    reply = await boundary.invoke(RunContext(RUN), envelope())

    assert reply == ToolError.of(ErrorCode.DUPLICATE_TOOL_CALL, tool_call_id="call_1")
    assert tool.executed == 1


async def test_a_view_answers_duplicates_its_own_way_and_shares_the_rest(store: Store):
    """``answering_duplicates("replay")`` on a refusing boundary replays the recorded reply
    (the tool ran once); the boundary itself still refuses; a view of the same kind is the
    boundary itself; an unknown answer is InvalidArgument."""
    tool = FakeTool()
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: tool.spec()})
    view = boundary.answering_duplicates("replay")

    first = await boundary.invoke(RunContext(RUN), envelope())
    assert await view.invoke(RunContext(RUN), envelope()) == first
    refused = await boundary.invoke(RunContext(RUN), envelope())

    assert refused == ToolError.of(ErrorCode.DUPLICATE_TOOL_CALL, tool_call_id="call_1")
    assert tool.executed == 1
    assert boundary.answering_duplicates("refuse") is boundary
    assert view.answering_duplicates("replay") is view
    with pytest.raises(InvalidArgument):
        boundary.answering_duplicates("ignore")  # type: ignore[arg-type]


async def test_replay_after_the_record_expired_is_record_expired(make_store: Any):
    """Once the first call's record has expired, the retried call gets RECORD_EXPIRED; it is not
    run again and spends no budget (the run still remembers the id)."""
    store: Store = make_store(ttl=timedelta(milliseconds=300))
    tool = FakeTool()
    await open_run(store)
    boundary = replaying(store, tool)
    assert isinstance(await boundary.invoke(RunContext(RUN), envelope()), ToolResult)

    async def expired() -> bool:
        return await store.get(RUN, "call_1") is None

    await wait_for(expired)
    reply = await boundary.invoke(RunContext(RUN), envelope())

    assert reply == ToolError.of(ErrorCode.RECORD_EXPIRED, tool_call_id="call_1")
    assert tool.executed == 1
    assert await used_total(store) == 1


class HeldTool(FakeTool):
    """A tool whose executor waits until the test releases it."""

    def __init__(self) -> None:
        super().__init__()
        self.running = asyncio.Event()
        self.release = asyncio.Event()

    async def executor(self, arguments: dict[str, Any], call: Any) -> Any:
        self.executed += 1
        self.running.set()
        await self.release.wait()
        return self.raw


async def test_replay_waits_for_a_first_call_still_projecting(store: Store, redis: Redis):
    """A retry that arrives while the first call runs waits for it (reading the record again
    until it is READY) and gets the same reply; the tool ran once."""
    tool = HeldTool()
    await open_run(store)
    boundary = replaying(store, tool)
    first_task = asyncio.create_task(boundary.invoke(RunContext(RUN), envelope()))
    await tool.running.wait()
    reads = await command_calls(redis, "hmget")
    retry = asyncio.create_task(boundary.invoke(RunContext(RUN), envelope()))

    async def retry_read_twice() -> bool:
        return await command_calls(redis, "hmget") >= reads + 2

    await wait_for(retry_read_twice)  # it found the record PROJECTING and is waiting
    assert not retry.done()
    tool.release.set()
    first, again = await first_task, await retry

    assert isinstance(first, ToolResult) and again == first
    assert tool.executed == 1


async def test_replay_gives_up_after_its_wait(store: Store):
    """A first call still PROJECTING past replay_wait_s leaves the retry DUPLICATE_TOOL_CALL,
    naming the record so the harness can read it later."""
    tool = HeldTool()
    await open_run(store)
    boundary = replaying(store, tool, replay_wait_s=0.05)
    first_task = asyncio.create_task(boundary.invoke(RunContext(RUN), envelope()))
    await tool.running.wait()

    reply = await boundary.invoke(RunContext(RUN), envelope())
    tool.release.set()
    first = await first_task

    assert_safe_error(reply, ErrorCode.DUPLICATE_TOOL_CALL)
    assert reply.invocation_id == invocation_id(RUN, "call_1")  # type: ignore[union-attr]
    assert isinstance(first, ToolResult)
    assert tool.executed == 1


async def test_concurrent_retries_run_the_tool_once(store: Store):
    """Eight copies of one call at once: one runs, seven replay it; every reply is the same."""
    tool = FakeTool()
    await open_run(store)
    boundary = replaying(store, tool)

    replies = await asyncio.gather(
        *(boundary.invoke(RunContext(RUN), envelope()) for _ in range(8))
    )

    assert isinstance(replies[0], ToolResult)
    assert all(reply == replies[0] for reply in replies)
    assert tool.executed == 1
    assert await used_total(store) == 1


@pytest.mark.parametrize(
    "options",
    [{"on_duplicate": "retry"}, {"replay_wait_s": -1}, {"replay_wait_s": float("inf")}],
)
async def test_replay_options_are_checked(store: Store, options: dict[str, Any]):
    """An unknown on_duplicate or a wait that is not a finite number of seconds is refused."""
    with pytest.raises(InvalidArgument):
        ToolBoundary(store, {TOOL: FakeTool().spec()}, **options)


@pytest.fixture
def spawn_first_call(
    spawn_module: SpawnModule,
) -> SpawnModule:
    """Start ``tests.support.first_call_process`` subprocesses (killed after the test)."""
    return functools.partial(spawn_module, "tests.support.first_call_process")


async def test_replay_races_a_first_call_in_another_process(
    store: Store,
    redis: Redis,
    redis_url: str,
    namespace: str,
    spawn_first_call: SpawnModule,
):
    """Another OS process runs the call and holds it in its executor; a retry here waits for it
    and gets exactly the reply that process got. The tool ran once (there), one budget unit."""
    local = FakeTool()
    await open_run(store, budget=3)
    boundary = replaying(store, local)
    child = await spawn_first_call(redis_url, namespace, RUN, "call_1")
    assert child.stdin is not None and child.stdout is not None
    assert await asyncio.wait_for(child.stdout.readline(), timeout=30) == b"executing\n"
    reads = await command_calls(redis, "hmget")
    retry = asyncio.create_task(
        boundary.invoke(
            RunContext(RUN),
            envelope(tool=first_call_process.TOOL, arguments=first_call_process.ARGUMENTS),
        )
    )

    async def retry_read_twice() -> bool:
        return await command_calls(redis, "hmget") >= reads + 2

    await wait_for(retry_read_twice)  # the retry found the record PROJECTING
    assert not retry.done()
    child.stdin.write(b"go\n")
    await child.stdin.drain()
    stdout, stderr = await asyncio.wait_for(child.communicate(), timeout=30)
    reply = await asyncio.wait_for(retry, timeout=30)

    assert child.returncode == 0, stderr.decode(errors="replace")[-2000:]
    reported = msgspec.json.decode(stdout.strip().splitlines()[-1])
    assert reported["executed"] == 1 and local.executed == 0
    assert reported["reply"]["status"] == "READY"
    assert reply_to_builtins(reply) == reported["reply"]
    assert isinstance(reply, ToolResult) and reply.result == first_call_process.RESULT
    assert await used_total(store) == 1
    record = await store.get(RUN, "call_1")
    assert record is not None and record.state.status is Status.READY
