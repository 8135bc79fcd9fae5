"""Throughput and bytes per invocation with many invocations already stored.

The store is filled quickly with pipelines of the store's own scripts (the floor's
pre-built arguments, 64 B raw), so what is stored is exactly what the Writer stores. At
each size the bytes per stored invocation are read from ``used_memory``, then the writer
lifecycle runs at concurrency 64 in a separate namespace whose keys are deleted after.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from redis.asyncio import Redis

from canon.bench.throughput import BenchError, ThroughputBench
from canon.bench.workload import TOOL, FloorArgs, Payloads, tool_call_id_for
from eventstore.scripts import script_source
from eventstore.store import Store
from eventstore.writer import now_ms

_RUNS = 64
_PIPELINE_INVOCATIONS = 16
_FILL_TASKS = 8


@dataclass(frozen=True, slots=True)
class ScalePoint:
    """Figures with ``stored`` invocations in Redis (medians over the repeats).

    ``server_cpu_us`` is the Redis CPU time one writer invocation costs: unlike the rate,
    it does not move with whatever else the machine is running, so it is what tells
    whether more stored invocations make each write dearer.
    """

    stored: int
    bytes_per_invocation: float
    invocations_per_s: float
    server_cpu_us: float

    def to_json(self) -> dict[str, Any]:
        """Plain data for the JSON report."""
        return {
            "stored": self.stored,
            "bytes_per_invocation": round(self.bytes_per_invocation, 1),
            "invocations_per_s": round(self.invocations_per_s, 1),
            "server_cpu_us": round(self.server_cpu_us, 1),
        }


async def delete_namespace(client: Redis, namespace: str) -> int:
    """Delete every key of ``namespace`` (SCAN + DEL in batches); return how many."""
    deleted = 0
    batch: list[bytes] = []
    async for key in client.scan_iter(match=f"{namespace}:*", count=2000):
        batch.append(key)
        if len(batch) >= 1000:
            deleted += await client.delete(*batch)
            batch = []
    if batch:
        deleted += await client.delete(*batch)
    return deleted


class Filler:
    """Writes invocations through the scripts in pipelines, numbered from 0 upwards."""

    def __init__(self, store: Store, bare: Redis, payloads: Payloads) -> None:
        self._store = store
        self._bare = bare
        self._args = FloorArgs(store.keys, payloads, at_ms=now_ms())
        self._runs = [f"scale{i:07d}" for i in range(_RUNS)]
        self._shas: dict[str, str] = {}
        self.stored = 0

    async def prepare(self) -> None:
        """Open the fill's runs and load the scripts."""
        for run_id in self._runs:
            await self._store.open_run(run_id, deadline=timedelta(hours=6), tools={TOOL: None})
        for name in ("create", "append"):
            self._shas[name] = await self._bare.script_load(script_source(name))

    def _commands(self, number: int) -> list[tuple[str, tuple[Any, ...]]]:
        run_id = self._runs[number % _RUNS]
        call = tool_call_id_for(number // _RUNS)
        inv = f"{number % _RUNS:032d}{number // _RUNS:032d}"
        return [
            (self._shas["create"], self._args.create(run_id, call, inv)),
            (self._shas["append"], self._args.append(run_id, call, 2)),
            (self._shas["append"], self._args.append(run_id, call, 3)),
        ]

    async def fill_to(self, target: int) -> None:
        """Write invocations until ``target`` are stored."""
        numbers = iter(range(self.stored, target))

        async def worker() -> None:
            while True:
                chunk = [n for _, n in zip(range(_PIPELINE_INVOCATIONS), numbers, strict=False)]
                if not chunk:
                    return
                commands = [c for n in chunk for c in self._commands(n)]
                async with self._bare.pipeline(transaction=False) as pipe:
                    for sha, args in commands:
                        pipe.evalsha(sha, *args)
                    replies = await pipe.execute()
                if any(reply[0] != b"ok" for reply in replies):
                    raise BenchError("a fill write was refused")

        await asyncio.gather(*(worker() for _ in range(_FILL_TASKS)))
        self.stored = target


async def measure_scale(
    url: str,
    sizes: list[int],
    *,
    namespace: str,
    repeats: int,
    warmup_s: float,
    duration_s: float,
    progress: Callable[[str], None],
) -> list[ScalePoint]:
    """Fill ``namespace`` to each of ``sizes`` in turn; measure bytes and throughput."""
    points: list[ScalePoint] = []
    bare = Redis.from_url(url, max_connections=_FILL_TASKS + 4)
    store = Store.from_url(url, namespace=namespace, ttl=timedelta(hours=6))
    probe = Store.from_url(url, namespace=f"{namespace}w", ttl=timedelta(hours=1))
    try:
        async with store, probe:
            baseline = int((await bare.info("memory"))["used_memory"])
            filler = Filler(store, bare, Payloads.of(raw=64))
            await filler.prepare()
            bench = ThroughputBench(probe, bare, Payloads.of())
            await bench.prepare()
            for size in sizes:
                progress(f"scale: filling to {size:,} stored invocations")
                await filler.fill_to(size)
                used = int((await bare.info("memory"))["used_memory"])
                samples = []
                for repeat in range(repeats):
                    samples.append(await bench.run("writer", repeat, 64, warmup_s, duration_s))
                    await delete_namespace(bare, probe.keys.namespace)
                    await probe.check_namespace()
                points.append(
                    ScalePoint(
                        stored=size,
                        bytes_per_invocation=(used - baseline) / size,
                        invocations_per_s=statistics.median(s.invocations_per_s for s in samples),
                        server_cpu_us=statistics.median(s.server_cpu_us for s in samples),
                    )
                )
    finally:
        await delete_namespace(bare, namespace)
        await bare.aclose()
    return points
