"""The floors make Redis write what the Writer writes: same keys, fields and sizes.

The script floor runs the store's own scripts; the minimal floor only the writes.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from redis.asyncio import Redis

from canon.bench.minimal import FOLDER as BENCH_FOLDER
from canon.bench.minimal import MinimalWriteScript
from canon.bench.workload import (
    SCOPE,
    TOOL,
    FloorArgs,
    Payloads,
    run_id_for,
    tool_call_id_for,
)
from eventstore.server.config_checks import RECOMMENDED_SETTINGS
from eventstore.store import Store
from eventstore.wire.scripts import FOLDER, committed
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
    assert [committed(reply).version for reply in replies] == [1, 2, 3]


def _shape(fields: dict[bytes, bytes]) -> dict[bytes, int]:
    return {name: len(value) for name, value in fields.items()}


async def _writer_lifecycle(store: Store, run_id: str, call: str, payloads: Payloads) -> None:
    head = await store.writer.create(run_id, call, TOOL, payloads.request)
    head = await store.writer.start_projecting(head, payloads.raw)
    await store.writer.complete(head, payloads.result, EvidenceStatus.EVIDENCE_FOUND, SCOPE)


async def test_floor_and_writer_store_the_same_shapes(store: Store, redis: Redis) -> None:
    """Record fields, event sizes and feed entries of a floor invocation match the Writer's."""
    payloads = Payloads.of()
    run_id = run_id_for("floor", 0, 1, 0)
    await store.open_run(run_id, deadline=timedelta(minutes=5), tools={TOOL: None})
    await _writer_lifecycle(store, run_id, tool_call_id_for(1), payloads)
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


async def _minimal_lifecycle(redis: Redis, args: FloorArgs, run_id: str, call: str) -> None:
    script = MinimalWriteScript(redis, BENCH_FOLDER)
    for version in (1, 2, 3):
        numkeys, *rest = args.minimal(run_id, call, version, invocation_id(run_id, call))
        entry_id = await script((rest[:numkeys], rest[numkeys:]))
        assert entry_id.count("-") == 1


async def _keys_of(redis: Redis, namespace: str, call: str) -> dict[str, int]:
    """The keys that name ``call``, with the call id blanked out, and the PTTL of each."""
    found = {}
    async for key in redis.scan_iter(match=f"{namespace}:*{call}*"):
        found[key.decode().replace(call, "<call>")] = await redis.pttl(key)
    return found


#: Record fields whose values are the same in any invocation of the benchmark's payloads.
_SAME_VALUES = (b"stage", b"status", b"evidence_status", b"version", b"tool", b"scope")


async def test_minimal_floor_writes_what_the_writer_writes(store: Store, redis: Redis) -> None:
    """An invocation by the minimal floor leaves the Writer's keys, TTLs, fields and entries.

    Same keys (record and stream, both with a TTL), the same record field names with the
    same value sizes, the same stream length and entry sizes, and as many feed entries of
    the same shape: a write the floor skipped would show here.
    """
    payloads = Payloads.of()
    run_id = run_id_for("minimal", 0, 1, 0)
    written, minimal = tool_call_id_for(1), tool_call_id_for(2)
    await store.open_run(run_id, deadline=timedelta(minutes=5), tools={TOOL: None})
    await _writer_lifecycle(store, run_id, written, payloads)
    args = FloorArgs(store.keys, payloads, at_ms=now_ms())
    await _minimal_lifecycle(redis, args, run_id, minimal)

    namespace = store.keys.namespace
    keys = [await _keys_of(redis, namespace, call) for call in (written, minimal)]
    assert set(keys[1]) == set(keys[0]) and len(keys[0]) == 2
    assert all(ttl > 0 for ttl in [*keys[0].values(), *keys[1].values()])
    records = [await redis.hgetall(store.keys.record(run_id, call)) for call in (written, minimal)]
    assert _shape(records[1]) == _shape(records[0])
    assert {name: records[1][name] for name in _SAME_VALUES} == {
        name: records[0][name] for name in _SAME_VALUES
    }
    streams = [await redis.xrange(store.keys.stream(run_id, call)) for call in (written, minimal)]
    assert len(streams[0]) == len(streams[1]) == 3
    assert [_shape(fields) for _, fields in streams[1]] == [_shape(f) for _, f in streams[0]]
    feed = await redis.xrange(store.keys.feed_of(run_id))
    by_call: dict[bytes, list[dict[bytes, bytes]]] = {}
    for _, fields in feed:
        by_call.setdefault(fields[b"c"], []).append(fields)
    entries = [by_call[call.encode()] for call in (written, minimal)]
    assert len(entries[0]) == len(entries[1]) == 3
    assert [{k: v for k, v in f.items() if k != b"c"} for f in entries[1]] == [
        {k: v for k, v in f.items() if k != b"c"} for f in entries[0]
    ]
    record = await store.get(run_id, minimal)
    assert record is not None and record.raw == payloads.raw
