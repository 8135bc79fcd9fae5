"""The naive floor makes Redis do exactly the Writer's work: same keys, fields and sizes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from redis.asyncio import Redis

from canon.bench.workload import (
    SCOPE,
    TOOL,
    FloorArgs,
    Payloads,
    run_id_for,
    tool_call_id_for,
)
from eventstore.scripts import FOLDER
from eventstore.server_settings import RECOMMENDED_SETTINGS
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.codes import EvidenceStatus
from machine.ids import invocation_id


async def _floor_lifecycle(redis: Redis, args: FloorArgs, run_id: str, call: str) -> None:
    create = await redis.script_load(FOLDER.source("create"))
    append = await redis.script_load(FOLDER.source("append"))
    replies = [
        await redis.evalsha(create, *args.create(run_id, call, invocation_id(run_id, call))),
        await redis.evalsha(append, *args.append(run_id, call, 2)),
        await redis.evalsha(append, *args.append(run_id, call, 3)),
    ]
    assert [reply[0] for reply in replies] == [b"ok", b"ok", b"ok"]


def _shape(fields: dict[bytes, bytes]) -> dict[bytes, int]:
    return {name: len(value) for name, value in fields.items()}


async def test_floor_and_writer_store_the_same_shapes(store: Store, redis: Redis) -> None:
    """Record fields, event sizes and feed entries of a floor invocation match the Writer's."""
    payloads = Payloads.of()
    run_id = run_id_for("floor", 0, 1, 0)
    await store.open_run(run_id, deadline=timedelta(minutes=5), tools={TOOL: None})
    head = await store.writer.create(run_id, tool_call_id_for(1), TOOL, payloads.request)
    head = await store.writer.start_projecting(head, payloads.raw)
    await store.writer.complete(head, payloads.result, EvidenceStatus.EVIDENCE_FOUND, SCOPE)
    await _floor_lifecycle(
        redis, FloorArgs(store.keys, payloads, at_ms=now_ms()), run_id, tool_call_id_for(2)
    )

    written, floor = [
        await redis.hgetall(store.keys.record(run_id, tool_call_id_for(n))) for n in (1, 2)
    ]
    assert _shape(floor) == _shape(written)
    assert floor[b"status"] == written[b"status"] == b"READY"
    streams = [await redis.xrange(store.keys.stream(run_id, tool_call_id_for(n))) for n in (1, 2)]
    assert [_shape(fields) for _, fields in streams[1]] == [_shape(f) for _, f in streams[0]]
    feed = await redis.xrange(store.keys.feed_of(run_id))
    by_call: dict[bytes, list[dict[bytes, int]]] = {}
    for _, fields in feed:
        by_call.setdefault(fields[b"c"], []).append(_shape(fields))
    assert by_call[tool_call_id_for(2).encode()] == by_call[tool_call_id_for(1).encode()]
    record = await store.get(run_id, tool_call_id_for(2))
    assert record is not None and record.raw == payloads.raw


async def test_a_benchmark_invocation_keeps_its_events_in_one_stream_node(
    store: Store, redis: Redis
) -> None:
    """Entries hold the encoded event only, and the three events share one stream node."""
    node_bytes = (await redis.config_get("stream-node-max-bytes"))["stream-node-max-bytes"]
    if node_bytes != RECOMMENDED_SETTINGS["stream-node-max-bytes"]:
        pytest.skip(f"the server's stream-node-max-bytes is {node_bytes}, not the recommended")
    payloads = Payloads.of()
    run_id = run_id_for("memory", 0, 1, 0)
    await store.open_run(run_id, deadline=timedelta(minutes=5), tools={TOOL: None})
    head = await store.writer.create(run_id, tool_call_id_for(1), TOOL, payloads.request)
    head = await store.writer.start_projecting(head, payloads.raw)
    await store.writer.complete(head, payloads.result, EvidenceStatus.EVIDENCE_FOUND, SCOPE)
    stream = store.keys.stream(run_id, tool_call_id_for(1))
    assert [list(fields) for _, fields in await redis.xrange(stream)] == [[b"e"]] * 3
    assert (await redis.xinfo_stream(stream))["radix-tree-keys"] == 1
