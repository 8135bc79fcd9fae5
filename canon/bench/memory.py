"""Redis memory per invocation, measured exactly by deleting what was written, part by part.

N invocations are written through the Writer into a fresh namespace. ``used_memory``
(without the clients' buffers) is read after writing, then again after deleting (DEL,
never the lazy UNLINK) each kind of key in turn: run hashes and progress lists, streams,
records, feeds. Each drop divided by N is that part's exact share, allocator overhead
included. ``MEMORY USAGE`` is only an estimate for streams and hashes, so it is not used.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from redis.asyncio import Redis

from canon.bench.workload import TOOL, Payloads, tool_call_id_for
from eventstore.store import Store
from eventstore.wire.replies import reply_text
from machine.codes import EvidenceStatus

_RUNS = 16


@dataclass(frozen=True, slots=True)
class MemoryPoint:
    """Bytes per invocation of one payload size; every figure is a mean over N.

    Attributes:
        raw_bytes: size of the raw response.
        payload_bytes: request + raw + result bytes the record holds.
        invocations: how many were written.
        record: the canonical record hash (key and expiry entry included).
        stream: the invocation's event stream.
        feed: the share of the shard feeds (three entries per invocation).
        run_index: the share of run hashes and progress lists (duplicate detection,
            budgets and progress; not part of the issue's per-invocation figure).
        per_invocation: record + stream + feed, the figure the goals use.
        total: every byte the invocations added (``per_invocation`` + ``run_index``).
        record_encoding: the record hash's encoding (listpack/ziplist or hashtable).

    """

    raw_bytes: int
    payload_bytes: int
    invocations: int
    record: float
    stream: float
    feed: float
    run_index: float
    per_invocation: float
    total: float
    record_encoding: str

    def to_json(self) -> dict[str, Any]:
        """Plain data for the JSON report."""
        return {k: round(v, 1) if isinstance(v, float) else v for k, v in asdict(self).items()}


async def _used_memory(client: Redis) -> int:
    """``used_memory`` less what the clients' buffers hold (``mem_clients_normal``).

    A connection's query and reply buffers come and go on their own: Redis frees those of
    a client idle for two seconds in its cron, which can fall between any two readings
    and would count, about 30 KiB a writer connection, as the data of whichever kind of
    key was deleted in that step.
    """
    info = await client.info("memory")
    return int(info["used_memory"]) - int(info.get("mem_clients_normal", 0))


async def _delete(client: Redis, keys: list[str]) -> None:
    for start in range(0, len(keys), 500):
        await client.delete(*keys[start : start + 500])


async def measure(
    url: str, payloads: Payloads, invocations: int, namespace: str, concurrency: int = 16
) -> MemoryPoint:
    """Write ``invocations`` into ``namespace`` on ``url``, measure, and delete them all."""
    store = Store.from_url(url, namespace=namespace, ttl=timedelta(hours=2))
    async with store:
        client, keys = store.client, store.keys
        runs = [f"mem{i:09d}" for i in range(_RUNS)]
        per_run = -(-invocations // _RUNS)
        before = await _used_memory(client)
        for run_id in runs:
            await store.open_run(run_id, deadline=timedelta(hours=1), tools={TOOL: None})

        async def write(run_id: str) -> None:
            for number in range(per_run):
                head = await store.writer.create(
                    run_id, tool_call_id_for(number), TOOL, payloads.request
                )
                head = await store.writer.start_projecting(head, payloads.raw)
                await store.writer.complete(
                    head, payloads.result, EvidenceStatus.EVIDENCE_FOUND, "bench corpus"
                )

        for start in range(0, _RUNS, concurrency):
            await asyncio.gather(*(write(run_id) for run_id in runs[start : start + concurrency]))
        written = per_run * _RUNS
        calls = [(run_id, tool_call_id_for(n)) for run_id in runs for n in range(per_run)]
        encoding = await client.object("encoding", keys.record(*calls[0]))
        filled = await _used_memory(client)
        await _delete(client, [keys.run(r) for r in runs] + [keys.progress(r) for r in runs])
        no_runs = await _used_memory(client)
        await _delete(client, [keys.stream(r, c) for r, c in calls])
        no_streams = await _used_memory(client)
        await _delete(client, [keys.record(r, c) for r, c in calls])
        no_records = await _used_memory(client)
        await _delete(client, [keys.feed(shard) for shard in range(keys.shards)])
        no_feeds = await _used_memory(client)
        await _delete(client, [keys.meta()])
    record = (no_streams - no_records) / written
    stream = (no_runs - no_streams) / written
    feed = (no_records - no_feeds) / written
    return MemoryPoint(
        raw_bytes=len(payloads.raw),
        payload_bytes=payloads.total,
        invocations=written,
        record=record,
        stream=stream,
        feed=feed,
        run_index=(filled - no_runs) / written,
        per_invocation=record + stream + feed,
        total=(filled - before) / written,
        record_encoding=reply_text(encoding),
    )


def fixed_overhead(small: MemoryPoint) -> float:
    """Bytes per invocation that do not depend on the payload (from the small payload)."""
    return small.per_invocation - small.payload_bytes


def payload_ratio(small: MemoryPoint, large: MemoryPoint) -> float:
    """(bytes per invocation - fixed) / payload at the large size: 1.0 is bytes stored once."""
    return (large.per_invocation - fixed_overhead(small)) / large.payload_bytes
