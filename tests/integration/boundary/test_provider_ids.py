"""Every tool call id the providers publish: kept exactly in the record, the keys and replay.

One table (``tests/support/provider_ids.py``) drives every check: each accepted id goes
through ``ToolBoundary.invoke``; its record holds the exact id, SCAN finds exactly its
record and stream keys, every key of the run hashes to the run's shard slot (asked of the
server too on a cluster), replay, verify, export, receipts and progress facts report it
intact and unchanged. Each refused value is INVALID_TOOL_CALL_ID and leaves no key.

On the cluster ``redis`` is a cluster client, so the slot of every key is asked of the
cluster (``CLUSTER KEYSLOT``) and must be the slot of the run's shard tag, braces in the
id or not.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, cast

import httpx
import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from canon.cli import main
from eventstore import RunContext, Store, ToolBoundary
from eventstore.audit import (
    NamespaceVerifier,
    export_run,
    open_read_only,
    replay_invocation,
    replay_run,
)
from eventstore.errors import InvalidArgument
from eventstore.wire.keys import escape_glob
from machine.codes import ErrorCode
from machine.ids import invocation_id
from projections import create_app, observed_facts
from projections.receipts.inspection import inspect_invocation
from tests.support.calls import (
    TOOL,
    assert_refused_before_execution,
    envelope,
    open_run,
    outcome,
)
from tests.support.provider_ids import ACCEPTED, REFUSED
from tests.support.tools import FakeTool, namespace_keys

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-ids"


async def _scan(redis: Redis, pattern: str) -> set[bytes]:
    return {key async for key in redis.scan_iter(match=pattern, count=1000)}


async def _slot_of(redis: Redis, key: bytes) -> int:
    """The key's hash slot, as the cluster itself computes it (locally on a single server)."""
    if isinstance(redis, RedisCluster):
        return int(await redis.execute_command("CLUSTER KEYSLOT", key))
    return key_slot(key)


async def _verify(store: Store, redis: Redis) -> tuple[int, int]:
    """Invocations and problems found by verify (on a cluster: on each primary, summed)."""
    if not isinstance(redis, RedisCluster):
        summary = await NamespaceVerifier(store).run()
        return summary.invocations, summary.problems
    invocations = problems = 0
    for node in redis.get_primaries():
        url = f"redis://{node.host}:{node.port}/0"
        async with open_read_only(
            url, namespace=store.keys.namespace, shards=store.keys.shards
        ) as primary:
            summary = await NamespaceVerifier(primary).run()
        invocations, problems = invocations + summary.invocations, problems + summary.problems
    return invocations, problems


@pytest.mark.parametrize("name", list(ACCEPTED))
async def test_an_accepted_id_is_kept_exactly_everywhere(
    store: Store, redis: Redis, namespace: str, name: str
) -> None:
    """The id reaches the record, both keys (and only them), the run's slot, replay,
    verify, export, the receipt and the progress facts exactly as the provider sent it."""
    call = ACCEPTED[name]
    await open_run(store, RUN)
    reply = await ToolBoundary(store, {TOOL: FakeTool().spec()}).invoke(
        RunContext(RUN), envelope(call, run_id=RUN)
    )
    assert outcome(reply) == "READY"

    record = await store.get(RUN, call)
    assert record is not None and record.state.tool_call_id == call
    stored = cast(bytes, await redis.hget(store.keys.record(RUN, call), "tool_call_id"))
    assert stored.decode() == call

    record_key, stream_key = (
        store.keys.record(RUN, call).encode(),
        store.keys.stream(RUN, call).encode(),
    )
    assert record_key.endswith(call.encode()) and stream_key.endswith(call.encode())
    everything = set(await namespace_keys(redis, namespace))
    invocation_keys = {k for k in everything if store.keys.parse_invocation_key(k) is not None}
    assert invocation_keys == {record_key, stream_key}
    assert await redis.type(record_key) == b"hash"
    assert await redis.type(stream_key) == b"stream"
    assert await _scan(redis, store.keys.invocation_scan_pattern(RUN)) >= {record_key, stream_key}
    assert await _scan(redis, escape_glob(record_key.decode())) == {record_key}
    assert await _scan(redis, escape_glob(stream_key.decode())) == {stream_key}
    assert await _scan(redis, store.keys.scan_pattern("inv")) == {record_key}

    run_slot = key_slot(store.keys.tag_of(RUN).encode())
    run_keys = [k for k in everything if k != store.keys.meta().encode()]
    assert [await _slot_of(redis, key) for key in run_keys] == [run_slot] * len(run_keys)

    replay = await replay_invocation(store, RUN, call)
    assert replay is not None and replay.verdict.intact, replay
    assert replay.tool_call_id == call and replay.invocation_id == invocation_id(RUN, call)
    assert [r.tool_call_id for r in await replay_run(store, RUN)] == [call]

    assert await _verify(store, redis) == (1, 0)

    lines = [line async for line in export_run(store, RUN)]
    assert [line["tool_call_id"] for line in lines if line["kind"] == "record"] == [call]

    receipt = await inspect_invocation(store, RUN, invocation_id(RUN, call))
    assert receipt.tool_call_id == call
    assert [fact.tool_call_id for fact in await observed_facts(store, RunContext(RUN))] == [call]


@pytest.mark.parametrize("name", list(REFUSED))
async def test_an_unsafe_id_is_refused_before_anything_is_stored(
    store: Store, redis: Redis, namespace: str, name: str
) -> None:
    """Empty, over-long, whitespace, control, lone-surrogate and non-str ids are
    INVALID_TOOL_CALL_ID: nothing runs, no key appears, the id is never rewritten."""
    tool = FakeTool()
    await open_run(store, RUN)
    await assert_refused_before_execution(
        ToolBoundary(store, {TOOL: tool.spec()}),
        tool,
        envelope(cast(Any, REFUSED[name]), run_id=RUN),
        ErrorCode.INVALID_TOOL_CALL_ID,
        redis=redis,
        namespace=namespace,
        ctx=RunContext(RUN),
    )


async def test_canon_replay_takes_any_accepted_id_on_the_command_line(
    store: Store, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``canon replay RUN -- ID`` reports intact for a Kimi id, a dash-led id, an id with
    markup-like brackets and the long Gemini 3 id, and shows each id as it is."""
    await open_run(store, RUN)
    boundary = ToolBoundary(store, {TOOL: FakeTool().spec()})
    calls = [ACCEPTED[name] for name in ("kimi", "dash-first", "glob-characters", "gemini-3")]
    for call in calls:
        assert outcome(await boundary.invoke(RunContext(RUN), envelope(call, run_id=RUN))) == (
            "READY"
        )
    for call in calls:
        # Options first: after "--" everything is positional, also an id led by "-".
        argv = ["replay", "--redis-url", redis_url, "--namespace", namespace, RUN, "--", call]
        capsys.readouterr()
        code = await asyncio.to_thread(main, argv)
        out, err = capsys.readouterr()
        assert code == 0, err
        assert "INTACT" in out and "NOT INTACT" not in out
        assert invocation_id(RUN, call) in out
        assert len(call) > 200 or f"call {call} · tool {TOOL}" in out


@pytest.mark.parametrize("run_id", ["_run-1", "-run-2"])
async def test_a_run_id_led_by_underscore_or_dash_works_end_to_end(
    store: Store, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str], run_id: str
) -> None:
    """Run ids may start with '_' or '-': the call is READY, replay finds it intact (also
    ``canon replay -- RUN``), and the HTTP API serves the run's progress."""
    opened = await store.open_run(run_id, deadline=timedelta(minutes=5))
    boundary = ToolBoundary(store, {TOOL: FakeTool().spec()})
    call = ACCEPTED["kimi"]
    assert outcome(await boundary.invoke(RunContext(run_id), envelope(call, run_id=run_id))) == (
        "READY"
    )
    assert [(r.tool_call_id, r.verdict.intact) for r in await replay_run(store, run_id)] == [
        (call, True)
    ]
    argv = ["replay", "--redis-url", redis_url, "--namespace", namespace, "--", run_id]
    capsys.readouterr()
    assert await asyncio.to_thread(main, argv) == 0, capsys.readouterr().err
    transport = httpx.ASGITransport(app=create_app(store))
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        response = await client.get(
            f"/v1/runs/{run_id}/progress",
            headers={"Authorization": f"Bearer {opened.access_token}"},
        )
    assert response.status_code == 200
    assert [fact["tool_call_id"] for fact in response.json()["facts"]] == [call]


@pytest.mark.parametrize("run_id", [".run", "..", "run:1", "run{1}", "run 1", "rün"])
async def test_a_run_id_that_is_not_key_safe_is_refused(store: Store, run_id: str) -> None:
    """Run ids keep the key-safe charset: no leading '.', ':', braces, spaces, non-ASCII."""
    with pytest.raises(InvalidArgument, match="run id"):
        await store.open_run(run_id, deadline=timedelta(minutes=5))
    reply = await ToolBoundary(store, {TOOL: FakeTool().spec()}).invoke(
        RunContext(run_id), envelope("call_1", run_id=run_id)
    )
    assert outcome(reply) == "RUN_MISMATCH"
