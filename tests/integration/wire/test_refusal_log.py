"""Refusals are on record: a refused call creates no invocation, but its run keeps it.

Each run has a bounded refusal log (time, tool, tool call id or its size, code) and a count
per code in its run hash, written by the creation script in the same step as its refusal,
or by one small script for the refusals the boundary decides before any script. Nothing
is written for a run that does not exist, every key keeps an expiry, and a call that is
not refused pays nothing for it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, cast

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from eventstore import Refusal, RunContext, Store, ToolBoundary
from eventstore.errors import InvalidArgument, Refused
from eventstore.writer import now_ms
from machine.codes import ErrorCode
from tests.helpers import REQUEST
from tests.integration.audit.test_replay import run_cli
from tests.support.calls import RUN, TOOL, envelope, open_run, outcome
from tests.support.tools import FakeTool, namespace_keys
from tests.support.waiting import wait_for

pytestmark = pytest.mark.backends("single", "cluster")

Setup = Callable[[Store], Awaitable[None]]
#: A marker that must never be stored, wherever an unsafe id carries it.
MARKER = "SECRET-ID-4b7e"


@pytest.fixture
async def store(make_open_store: Any) -> Store:
    """An opened store on the test's namespace (no run opened)."""
    return cast(Store, await make_open_store(shards=4, ttl=timedelta(minutes=5)))


async def _inactive(store: Store) -> None:
    await open_run(store)
    assert await store.close_run(RUN)


async def _revoked(store: Store) -> None:
    await open_run(store, tools={TOOL: None})
    assert await store.runs.revoke_tool(RUN, TOOL)


async def _past_deadline(store: Store) -> None:
    opened = await store.open_run(RUN, deadline=timedelta(milliseconds=500))
    await wait_for(lambda: now_ms() > opened.deadline_ms + 5)


async def _paused(store: Store) -> None:
    await open_run(store)
    await store.set_paused(True)


async def _duplicate(store: Store) -> None:
    await open_run(store)
    await store.writer.create(RUN, "call-1", TOOL, REQUEST)


async def _tool_budget_spent(store: Store) -> None:
    await open_run(store, tools={TOOL: 1})
    await store.writer.create(RUN, "call-0", TOOL, REQUEST)


async def _run_budget_spent(store: Store) -> None:
    await open_run(store, budget=1)
    await store.writer.create(RUN, "call-0", TOOL, REQUEST)


_SCRIPT_CASES: list[tuple[str, Setup, ErrorCode]] = [
    ("inactive", _inactive, ErrorCode.RUN_INACTIVE),
    ("revoked", _revoked, ErrorCode.UNAUTHORIZED),
    ("past-deadline", _past_deadline, ErrorCode.RUN_DEADLINE_EXPIRED),
    ("paused", _paused, ErrorCode.EXECUTION_PAUSED),
    ("duplicate", _duplicate, ErrorCode.DUPLICATE_TOOL_CALL),
    ("tool-budget", _tool_budget_spent, ErrorCode.TOOL_BUDGET_EXHAUSTED),
    ("run-budget", _run_budget_spent, ErrorCode.RUN_BUDGET_EXHAUSTED),
]


@pytest.mark.parametrize(
    ("setup", "code"), [c[1:] for c in _SCRIPT_CASES], ids=[c[0] for c in _SCRIPT_CASES]
)
async def test_each_refusal_of_the_creation_script_is_recorded_in_that_script(
    store: Store, setup: Setup, code: ErrorCode
) -> None:
    """A creation the run refuses puts one entry on the run's refusal log and counts its
    code once, in the same script call: right after the one refused creation (no other
    write was sent) the entry and the count are there, and no invocation was created."""
    await setup(store)
    before = store.batch_stats.calls
    started = now_ms()
    with pytest.raises(Refused) as refused:
        await store.writer.create(RUN, "call-1", TOOL, REQUEST)
    assert refused.value.error_code is code
    assert store.batch_stats.calls == before + 1

    [entry] = await store.refusals(RUN)
    assert (entry.code, entry.tool, entry.tool_call_id) == (code.value, TOOL, "call-1")
    assert entry.tool_call_id_bytes == len(b"call-1")
    assert started - 1000 <= entry.at_ms <= now_ms() + 1000  # the server's clock
    info = await store.run_info(RUN)
    assert info is not None and info.refused == {code.value: 1}
    if code is not ErrorCode.DUPLICATE_TOOL_CALL:
        assert await store.get(RUN, "call-1") is None


_PREFLIGHT_CASES: list[tuple[str, dict[str, Any], ErrorCode]] = [
    ("run-mismatch", {"run_id": "run-other"}, ErrorCode.RUN_MISMATCH),
    ("invalid-input", {"arguments": [1, 2]}, ErrorCode.INVALID_INPUT),
    ("too-large", {"arguments": {"q": "x" * 70_000}}, ErrorCode.REQUEST_TOO_LARGE),
    ("unknown-tool", {"tool": "nowhere"}, ErrorCode.UNKNOWN_TOOL),
    ("unauthorized", {"tool": "locked"}, ErrorCode.UNAUTHORIZED),
    ("not-read-only", {"tool": "writes"}, ErrorCode.NOT_READ_ONLY),
]


@pytest.mark.parametrize(
    ("change", "code"), [c[1:] for c in _PREFLIGHT_CASES], ids=[c[0] for c in _PREFLIGHT_CASES]
)
async def test_a_preflight_refusal_of_an_existing_run_is_recorded(
    store: Store, change: dict[str, Any], code: ErrorCode
) -> None:
    """A call the boundary refuses before any script (run, input, size, tool, grant,
    read-only) is on its context run's log with its tool, call id and code, and counted."""
    await open_run(store)
    tool = FakeTool()
    boundary = ToolBoundary(
        store,
        {
            TOOL: tool.spec(),
            "locked": tool.spec(authorized=False),
            "writes": tool.spec(read_only=False),
        },
    )
    reply = await boundary.invoke(RunContext(RUN), envelope("call-1", **change))
    assert outcome(reply) == code.value and tool.executed == 0

    [entry] = await store.refusals(RUN)
    assert (entry.code, entry.tool_call_id) == (code.value, "call-1")
    assert entry.tool == change.get("tool", TOOL)
    info = await store.run_info(RUN)
    assert info is not None and info.refused == {code.value: 1} and info.invocations == 0
    assert await store.get(RUN, "call-1") is None


async def test_an_unsafe_tool_call_id_is_recorded_by_its_size_and_never_stored(
    store: Store, redis: Redis, namespace: str
) -> None:
    """INVALID_TOOL_CALL_ID is on record with the id's UTF-8 size only: neither the id nor
    anything it carries is in any key or value; a tool name that is not one is left out."""
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: FakeTool().spec()})
    unsafe = f"call é\n{MARKER}"
    replies = [
        await boundary.invoke(RunContext(RUN), envelope(unsafe)),
        await boundary.invoke(RunContext(RUN), envelope("call-2", tool=f"bad tool {MARKER}")),
    ]
    assert [outcome(reply) for reply in replies] == ["INVALID_TOOL_CALL_ID", "UNKNOWN_TOOL"]

    unknown, invalid = await store.refusals(RUN)
    assert (invalid.code, invalid.tool_call_id) == ("INVALID_TOOL_CALL_ID", None)
    assert invalid.tool_call_id_bytes == len(unsafe.encode())
    assert (unknown.code, unknown.tool, unknown.tool_call_id) == ("UNKNOWN_TOOL", None, "call-2")
    for key in await namespace_keys(redis, namespace):
        assert MARKER.encode() not in key
        kind = (await redis.type(key)).decode()
        if kind == "stream":
            stored = repr(await redis.xrange(key))
        elif kind == "hash":
            stored = repr(await redis.hgetall(key))
        else:
            continue
        assert MARKER not in stored, key


async def test_a_refusal_for_a_run_that_does_not_exist_creates_no_key(
    store: Store, redis: Redis, namespace: str
) -> None:
    """Refusals of a run never opened (preflight and creation script alike) and of a
    context whose run id is not one write nothing: the namespace holds only its metadata."""
    boundary = ToolBoundary(store, {TOOL: FakeTool().spec()})
    replies = [
        await boundary.invoke(RunContext(RUN), envelope("call-1", tool="nowhere")),
        await boundary.invoke(RunContext(RUN), envelope("call-2")),
        await boundary.invoke(RunContext("bad run{x}"), envelope("call-3", run_id="bad run{x}")),
    ]
    assert [outcome(reply) for reply in replies] == [
        "UNKNOWN_TOOL",
        "RUN_INACTIVE",
        "RUN_MISMATCH",
    ]
    assert await namespace_keys(redis, namespace) == [store.keys.meta().encode()]
    assert await store.refusals(RUN) == []
    assert await store.writer.record_refusal(RUN, TOOL, "call-4", ErrorCode.UNKNOWN_TOOL) is False
    assert await namespace_keys(redis, namespace) == [store.keys.meta().encode()]


async def test_the_log_keeps_the_newest_refusals_kept(make_open_store: Any) -> None:
    """With refusals_kept=3 the log holds the three newest refusals, while the counts per
    code go on counting every one."""
    store: Store = await make_open_store(refusals_kept=3)
    await open_run(store, budget=0)
    boundary = ToolBoundary(store, {TOOL: FakeTool().spec()})
    for number in range(5):
        await boundary.invoke(RunContext(RUN), envelope(f"call-{number}", tool="nowhere"))
    await boundary.invoke(RunContext(RUN), envelope("call-5"))

    entries = await store.refusals(RUN, limit=10)
    assert [(e.tool_call_id, e.code) for e in entries] == [
        ("call-5", "RUN_BUDGET_EXHAUSTED"),
        ("call-4", "UNKNOWN_TOOL"),
        ("call-3", "UNKNOWN_TOOL"),
    ]
    info = await store.run_info(RUN)
    assert info is not None
    assert info.refused == {"UNKNOWN_TOOL": 5, "RUN_BUDGET_EXHAUSTED": 1}


async def _expiry_ms(redis: Redis, key: str) -> tuple[int, bool]:
    """The key's absolute expiry (ms), and whether it is exact: PEXPIRETIME on 7.x, the
    clock plus PTTL on 6.2 (which has no PEXPIRETIME)."""
    try:
        return int(await redis.execute_command("PEXPIRETIME", key)), True
    except ResponseError:
        return now_ms() + int(await redis.pttl(key)), False


async def test_the_log_expires_with_the_run_hash(store: Store, redis: Redis) -> None:
    """Whichever script writes it, the log's expiry is the run hash's own instant."""
    opened = await store.open_run(RUN, deadline=timedelta(minutes=2), budget=0)
    boundary = ToolBoundary(store, {TOOL: FakeTool().spec()})
    log, run = store.keys.refusals(RUN), store.keys.run(RUN)

    for call in (envelope("call-1", tool="nowhere"), envelope("call-2")):
        await boundary.invoke(RunContext(RUN), call)
        (run_expiry, exact), (log_expiry, _) = (
            await _expiry_ms(redis, run),
            await _expiry_ms(redis, log),
        )
        if exact:
            assert log_expiry == run_expiry == opened.expires_at_ms
        else:  # two reads of a clock, a little apart
            assert abs(log_expiry - opened.expires_at_ms) <= 100
            assert abs(run_expiry - opened.expires_at_ms) <= 100
    assert len(await store.refusals(RUN)) == 2


async def test_no_key_is_left_without_an_expiry_after_refusals(
    store: Store, redis: Redis, namespace: str
) -> None:
    """After refusals of every kind and calls that ran, every key of the namespace has a
    TTL but those the layout keeps without one: the namespace metadata, the shards' control
    hashes and their feeds (trimmed by age)."""
    await open_run(store, tools={TOOL: 2})
    boundary = ToolBoundary(store, {TOOL: FakeTool().spec()})
    calls = [
        envelope("ok"),
        envelope("ok"),
        envelope("bad id"),
        envelope("call-2", tool="nowhere"),
        envelope("call-3", arguments=[1]),
        envelope("call-4"),
        envelope("call-5"),
    ]
    for call in calls:
        await boundary.invoke(RunContext(RUN), call)
    await boundary.invoke(RunContext("run-never-opened"), envelope("c", run_id="run-never-opened"))

    lasting = {store.keys.meta().encode()}
    for shard in range(store.keys.shards):
        lasting |= {store.keys.control(shard).encode(), store.keys.feed(shard).encode()}
    keys = await namespace_keys(redis, namespace)
    assert store.keys.refusals(RUN).encode() in keys
    for key in keys:
        if key not in lasting:
            assert await redis.pttl(key) > 0, key
    info = await store.run_info(RUN)
    assert info is not None
    assert info.refused == {
        "DUPLICATE_TOOL_CALL": 1,
        "INVALID_TOOL_CALL_ID": 1,
        "UNKNOWN_TOOL": 1,
        "INVALID_INPUT": 1,
        "TOOL_BUDGET_EXHAUSTED": 1,
    }


async def test_a_refusal_free_call_writes_no_refusal_and_sends_nothing_more(
    store: Store, redis: Redis
) -> None:
    """Calls that are not refused leave no refusal key and no count, and cost their three
    script calls, no more."""
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: FakeTool().spec()})
    before = store.batch_stats.calls
    for number in range(3):
        assert outcome(await boundary.invoke(RunContext(RUN), envelope(f"c{number}"))) == "READY"
    assert store.batch_stats.calls == before + 3 * 3
    assert await redis.exists(store.keys.refusals(RUN)) == 0
    info = await store.run_info(RUN)
    assert info is not None and info.refused == {}


async def test_the_read_api_lists_newest_first_and_counts_per_code_without_touching_a_ttl(
    store: Store, redis: Redis
) -> None:
    """store.refusals gives typed entries newest first, at most ``limit``; RunInfo.refused
    counts per code; reading changes no expiry."""
    await open_run(store, tools={TOOL: 1})
    boundary = ToolBoundary(store, {TOOL: FakeTool().spec()})
    await boundary.invoke(RunContext(RUN), envelope("c0"))
    for call in (envelope("c1"), envelope("c2", tool="nowhere"), envelope("c3")):
        await boundary.invoke(RunContext(RUN), call)
    log = store.keys.refusals(RUN)
    ttl_before = await redis.pttl(log)

    entries = await store.refusals(RUN, limit=2)
    assert all(isinstance(entry, Refusal) for entry in entries)
    assert [(e.tool_call_id, e.code) for e in entries] == [
        ("c3", "TOOL_BUDGET_EXHAUSTED"),
        ("c2", "UNKNOWN_TOOL"),
    ]
    every = await store.refusals(RUN)
    assert [e.tool_call_id for e in every] == ["c3", "c2", "c1"]
    assert every[0].at_ms >= every[1].at_ms >= every[2].at_ms
    info = await store.run_info(RUN)
    assert info is not None
    assert info.refused == {"TOOL_BUDGET_EXHAUSTED": 2, "UNKNOWN_TOOL": 1}
    assert 0 < await redis.pttl(log) <= ttl_before
    assert await store.refusals("bad run{x}") == []
    with pytest.raises(InvalidArgument):
        await store.refusals(RUN, limit=0)


async def test_a_replayed_duplicate_is_no_refusal_but_another_request_is(store: Store) -> None:
    """With on_duplicate="replay" a retry answered from the record is not on the log; the
    same id with another request, which nothing recorded answers, is recorded once."""
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: FakeTool().spec()}, on_duplicate="replay")
    assert outcome(await boundary.invoke(RunContext(RUN), envelope("c1"))) == "READY"
    assert outcome(await boundary.invoke(RunContext(RUN), envelope("c1"))) == "READY"
    assert await store.refusals(RUN) == []

    other = envelope("c1", arguments={"q": 2})
    assert outcome(await boundary.invoke(RunContext(RUN), other)) == "DUPLICATE_TOOL_CALL"
    assert [(e.tool_call_id, e.code) for e in await store.refusals(RUN)] == [
        ("c1", "DUPLICATE_TOOL_CALL")
    ]
    info = await store.run_info(RUN)
    assert info is not None and info.refused == {"DUPLICATE_TOOL_CALL": 1}


async def test_the_command_line_shows_the_refusals_of_a_run(
    store: Store, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``canon runs`` counts a run's refusals and names them per code; ``canon replay RUN``
    lists them newest first beside its calls, and ``--json`` carries counts and entries."""
    await open_run(store, budget=1)
    boundary = ToolBoundary(store, {TOOL: FakeTool().spec()})
    assert outcome(await boundary.invoke(RunContext(RUN), envelope("ok-1"))) == "READY"
    for call in ("over-1", "over-2"):
        await boundary.invoke(RunContext(RUN), envelope(call))  # RUN_BUDGET_EXHAUSTED
    await boundary.invoke(RunContext(RUN), envelope("nope-1", tool="nope"))  # UNKNOWN_TOOL

    code, runs, _ = await run_cli(capsys, redis_url, namespace, "runs")
    assert code == 0
    assert f"refused in {RUN}: RUN_BUDGET_EXHAUSTED 2, UNKNOWN_TOOL 1" in runs

    code, replay, _ = await run_cli(capsys, redis_url, namespace, "replay", RUN)
    assert code == 0
    assert "refused before any record: 3 (RUN_BUDGET_EXHAUSTED 2, UNKNOWN_TOOL 1)" in replay
    rows = [line for line in replay.splitlines() if "over-" in line or "nope-1" in line]
    assert [row.split()[1] for row in rows] == ["nope-1", "over-2", "over-1"]

    code, document, _ = await run_cli(capsys, redis_url, namespace, "replay", RUN, "--json")
    parsed = json.loads(document)
    assert parsed["refused"] == {"RUN_BUDGET_EXHAUSTED": 2, "UNKNOWN_TOOL": 1}
    assert [entry["tool_call_id"] for entry in parsed["refusals"]] == ["nope-1", "over-2", "over-1"]
