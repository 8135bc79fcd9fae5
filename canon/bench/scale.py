"""Throughput and bytes per invocation with many invocations already stored.

The store is filled quickly with pipelines of the store's own scripts (the floor's
pre-built arguments, 64 B raw), so what is stored is exactly what the Writer stores. At
each size the bytes per stored invocation are read from ``used_memory``, then the writer
lifecycle runs at concurrency 64 in a separate namespace whose keys are deleted after.

Given one server per size, each is filled once and the writer's repeats alternate
between them, so every repeat measures all sizes within seconds of each other and the
Redis CPU of each size is compared with the smallest pair by pair (as the throughput
section does with the floor): a machine whose speed drifts over minutes then moves all
sizes alike. Given one server, the sizes are reached in turn on it.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from redis.asyncio import Redis

from canon.bench.throughput import ThroughputBench
from canon.bench.timing import BenchError, Sample
from canon.bench.workload import TOOL, FloorArgs, Payloads, tool_call_id_for
from eventstore.store import Store
from eventstore.wire.scripts import FOLDER, AppendScript, CreateScript, is_committed
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
    #: Median over the repeats of this size's Redis CPU per invocation over the smallest
    #: size's in the same repeat; None when the sizes were not measured side by side.
    server_cpu_ratio: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain data for the JSON report."""
        return {
            "stored": self.stored,
            "bytes_per_invocation": round(self.bytes_per_invocation, 1),
            "invocations_per_s": round(self.invocations_per_s, 1),
            "server_cpu_us": round(self.server_cpu_us, 1),
            "server_cpu_ratio": None
            if self.server_cpu_ratio is None
            else round(self.server_cpu_ratio, 3),
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
        for script in (CreateScript, AppendScript):
            self._shas[script.name] = await self._bare.script_load(FOLDER.source(script.name))

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
                if not all(is_committed(reply) for reply in replies):
                    raise BenchError("a fill write was refused")

        await asyncio.gather(*(worker() for _ in range(_FILL_TASKS)))
        self.stored = target


class _Site:
    """One server under test: its fill namespace, its writer probe, and what is stored."""

    def __init__(self, url: str, namespace: str) -> None:
        self.bare = Redis.from_url(url, max_connections=_FILL_TASKS + 4)
        self.store = Store.from_url(url, namespace=namespace, ttl=timedelta(hours=6))
        self.probe = Store.from_url(url, namespace=f"{namespace}w", ttl=timedelta(hours=1))
        self.baseline = 0
        self.filler = Filler(self.store, self.bare, Payloads.of(raw=64))
        self.bench = ThroughputBench(self.probe, Payloads.of(), bare=self.bare)

    async def open(self) -> None:
        await self.store.__aenter__()
        await self.probe.__aenter__()
        self.baseline = int((await self.bare.info("memory"))["used_memory"])
        await self.filler.prepare()
        await self.bench.prepare()

    async def bytes_per_invocation(self) -> float:
        used = int((await self.bare.info("memory"))["used_memory"])
        return (used - self.baseline) / self.filler.stored

    async def run_writer(self, repeat: int, warmup_s: float, duration_s: float) -> Sample:
        sample = await self.bench.run("writer", repeat, 64, warmup_s, duration_s)
        await delete_namespace(self.bare, self.probe.keys.namespace)
        await self.probe.check_namespace()
        return sample

    async def close(self) -> None:
        try:
            await delete_namespace(self.bare, self.store.keys.namespace)
        finally:
            await self.probe.aclose()
            await self.store.aclose()
            await self.bare.aclose()


async def measure_scale(
    urls: Sequence[str],
    sizes: list[int],
    *,
    namespace: str,
    repeats: int,
    warmup_s: float,
    duration_s: float,
    progress: Callable[[str], None],
) -> list[ScalePoint]:
    """Measure bytes and throughput at each of ``sizes`` stored invocations.

    ``urls`` is one server per size (filled once each, repeats alternating between them)
    or a single server (filled to each size in turn).
    """
    if len(urls) not in (1, len(sizes)):
        raise ValueError("give one server, or one per size")
    if len(urls) == 1:
        return await _in_turn(urls[0], sizes, namespace, repeats, warmup_s, duration_s, progress)
    sites = [_Site(url, namespace) for url in urls]
    try:
        byte_figures: list[float] = []
        for site, size in zip(sites, sizes, strict=True):
            await site.open()
            progress(f"scale: filling a server to {size:,} stored invocations")
            await site.filler.fill_to(size)
            byte_figures.append(await site.bytes_per_invocation())
        samples: list[list[Sample]] = [[] for _ in sites]
        for repeat in range(repeats):
            progress(f"scale: writer on every size, repeat {repeat + 1} of {repeats}")
            # Rotate the order so no size always runs first after a pause.
            order = [(repeat + k) % len(sites) for k in range(len(sites))]
            for index in order:
                samples[index].append(await sites[index].run_writer(repeat, warmup_s, duration_s))
        base = samples[0]
        return [
            _point(size, byte_figure, runs, base)
            for size, byte_figure, runs in zip(sizes, byte_figures, samples, strict=True)
        ]
    finally:
        for site in sites:
            await site.close()


async def _in_turn(
    url: str,
    sizes: list[int],
    namespace: str,
    repeats: int,
    warmup_s: float,
    duration_s: float,
    progress: Callable[[str], None],
) -> list[ScalePoint]:
    """One server filled to each size in turn, the writer measured at each."""
    points: list[ScalePoint] = []
    site = _Site(url, namespace)
    try:
        await site.open()
        for size in sizes:
            progress(f"scale: filling to {size:,} stored invocations")
            await site.filler.fill_to(size)
            byte_figure = await site.bytes_per_invocation()
            runs = [await site.run_writer(n, warmup_s, duration_s) for n in range(repeats)]
            points.append(_point(size, byte_figure, runs))
    finally:
        await site.close()
    return points


def _point(
    stored: int, byte_figure: float, runs: list[Sample], base: list[Sample] | None = None
) -> ScalePoint:
    """One size's figures: the medians over its runs.

    Given the smallest size's runs, taken in the same rounds, also the median of the
    per-round ratios of Redis CPU per invocation to them.
    """
    return ScalePoint(
        stored=stored,
        bytes_per_invocation=byte_figure,
        invocations_per_s=statistics.median(s.invocations_per_s for s in runs),
        server_cpu_us=statistics.median(s.server_cpu_us for s in runs),
        server_cpu_ratio=None
        if base is None
        else statistics.median(
            run.server_cpu_us / first.server_cpu_us for run, first in zip(runs, base, strict=True)
        ),
    )
