"""The naive floor makes Redis do exactly the Writer's work: same keys, fields and sizes."""

from __future__ import annotations

from datetime import timedelta

from redis.asyncio import Redis

from canon.bench.workload import (
    SCOPE,
    TOOL,
    FloorArgs,
    Payloads,
    run_id_for,
    tool_call_id_for,
)
from eventstore.scripts import script_source
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.codes import EvidenceStatus
from machine.ids import invocation_id


async def _floor_lifecycle(redis: Redis, args: FloorArgs, run_id: str, call: str) -> None:
    create = await redis.script_load(script_source("create"))
    append = await redis.script_load(script_source("append"))
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
