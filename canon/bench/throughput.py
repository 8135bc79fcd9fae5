"""Throughput and append latency of the four ways to write one invocation.

``floor``: bare redis-py EVALSHA of the store's scripts with pre-built arguments, one
awaited call at a time per task. ``ceiling``: the same calls in pipelines of 16
invocations. ``writer``: the Writer's create / start_projecting / complete. ``boundary``:
``ToolBoundary.invoke`` with a trivial tool and logging on. Each runs with N concurrent
asyncio tasks for a fixed window after a warm-up; a run yields invocations/s and the
p50/p99 of one append (for the ceiling: of one pipeline, which every call in it waits).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final

from redis.asyncio import Redis

from canon.bench.workload import (
    TOOL,
    FloorArgs,
    Payloads,
    boundary_tool,
    request_arguments,
    run_id_for,
    tool_call_id_for,
)
from eventstore.boundary import ToolBoundary
from eventstore.contracts import RunContext, ToolEnvelope, ToolResult
from eventstore.errors import CanonError
from eventstore.scripts import FOLDER, AppendScript, CreateScript
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.codes import EvidenceStatus

MODES: Final = ("floor", "ceiling", "writer", "boundary")
PIPELINE_INVOCATIONS: Final = 16


_WRITER_CALLS: Final = ("create", "start_projecting", "complete")


class BenchError(CanonError, RuntimeError):
    """Raised when a benchmark write is refused: the numbers would not mean anything."""


@dataclass(slots=True)
class _Window:
    measuring: bool = False
    invocations: int = 0
    latencies: list[float] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Sample:
    """One timed run: throughput and append latency."""

    invocations_per_s: float
    p50_ms: float
    p99_ms: float
    invocations: int
    client_cpu_us: float
    server_cpu_us: float


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of ``values`` (0.0 when empty)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


One = Callable[[int, int, _Window], Awaitable[int]]


async def _drive(
    window: _Window,
    concurrency: int,
    warmup_s: float,
    duration_s: float,
    one: One,
    server_cpu_s: Callable[[], Awaitable[float]],
) -> Sample:
    stop = False

    async def worker(task: int) -> None:
        number = 0
        while not stop:
            done = await one(task, number, window)
            if window.measuring:
                window.invocations += done
            number += done

    tasks = [asyncio.create_task(worker(task)) for task in range(concurrency)]
    try:
        await asyncio.sleep(warmup_s)
        server_started = await server_cpu_s()
        window.measuring = True
        started, cpu_started = time.perf_counter(), time.process_time()
        await asyncio.sleep(duration_s)
        window.measuring = False
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        server_cpu = await server_cpu_s() - server_started
        stop = True
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
    count = max(window.invocations, 1)
    return Sample(
        invocations_per_s=window.invocations / elapsed,
        p50_ms=percentile(window.latencies, 0.50) * 1000,
        p99_ms=percentile(window.latencies, 0.99) * 1000,
        invocations=window.invocations,
        client_cpu_us=cpu / count * 1e6,
        server_cpu_us=server_cpu / count * 1e6,
    )


def _timed(window: _Window, call: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        result = await call(*args, **kwargs)
        if window.measuring:
            window.latencies.append(time.perf_counter() - started)
        return result

    return timed


def _check(reply: Any) -> None:
    if not isinstance(reply, list) or reply[0] != b"ok":
        raise BenchError(f"script refused a benchmark write: {reply!r:.80}")


class ThroughputBench:
    """Runs the four modes against one store (its namespace is the benchmark's)."""

    def __init__(self, store: Store, bare: Redis, payloads: Payloads) -> None:
        self._store = store
        self._bare = bare
        self._payloads = payloads
        self._floor = FloorArgs(store.keys, payloads, at_ms=now_ms())
        self._boundary = ToolBoundary(store, {TOOL: boundary_tool(payloads)})
        self._shas: dict[str, str] = {}
        self._arguments = request_arguments(len(payloads.request))

    async def prepare(self) -> None:
        """Load the scripts the floor calls by SHA."""
        for script in (CreateScript, AppendScript):
            self._shas[script.name] = await self._bare.script_load(FOLDER.source(script.name))

    async def _server_cpu_s(self) -> float:
        info = await self._bare.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    async def _open_runs(self, mode: str, repeat: int, concurrency: int) -> list[str]:
        runs = [run_id_for(mode, repeat, concurrency, task) for task in range(concurrency)]
        for run_id in runs:
            await self._store.open_run(run_id, deadline=timedelta(hours=2), tools={TOOL: None})
        return runs

    async def run(
        self, mode: str, repeat: int, concurrency: int, warmup_s: float, duration_s: float
    ) -> Sample:
        """Run ``mode`` once with ``concurrency`` tasks and return its sample."""
        runs = await self._open_runs(mode, repeat, concurrency)
        one = {
            "floor": self._floor_one,
            "ceiling": self._ceiling_one,
            "writer": self._writer_one,
            "boundary": self._boundary_one,
        }[mode]

        async def bound(task: int, number: int, window: _Window) -> int:
            return await one(runs[task], task, number, window)

        window = _Window()
        writer = self._store.writer
        if mode == "boundary":
            # The boundary's appends are timed where the writer mode times its own.
            for name in _WRITER_CALLS:
                setattr(writer, name, _timed(window, getattr(writer, name)))
        try:
            return await _drive(
                window, concurrency, warmup_s, duration_s, bound, self._server_cpu_s
            )
        finally:
            for name in _WRITER_CALLS:
                writer.__dict__.pop(name, None)

    async def _floor_one(self, run_id: str, task: int, number: int, window: _Window) -> int:
        call = tool_call_id_for(number)
        client, floor = self._bare, self._floor
        calls = (
            (self._shas["create"], floor.create(run_id, call, f"{task:032d}{number:032d}")),
            (self._shas["append"], floor.append(run_id, call, 2)),
            (self._shas["append"], floor.append(run_id, call, 3)),
        )
        for sha, args in calls:
            started = time.perf_counter()
            reply = await client.evalsha(sha, *args)
            if window.measuring:
                window.latencies.append(time.perf_counter() - started)
            _check(reply)
        return 1

    async def _ceiling_one(self, run_id: str, task: int, number: int, window: _Window) -> int:
        calls = [tool_call_id_for(number + i) for i in range(PIPELINE_INVOCATIONS)]
        floor, create, append = self._floor, self._shas["create"], self._shas["append"]
        phases: list[list[tuple[str, tuple[Any, ...]]]] = [
            [
                (create, floor.create(run_id, c, f"{task:032d}{number + i:032d}"))
                for i, c in enumerate(calls)
            ],
            [(append, floor.append(run_id, c, 2)) for c in calls],
            [(append, floor.append(run_id, c, 3)) for c in calls],
        ]
        for phase in phases:
            started = time.perf_counter()
            async with self._bare.pipeline(transaction=False) as pipe:
                for sha, args in phase:
                    pipe.evalsha(sha, *args)
                replies = await pipe.execute()
            if window.measuring:
                window.latencies.append(time.perf_counter() - started)
            for reply in replies:
                _check(reply)
        return PIPELINE_INVOCATIONS

    async def _writer_one(self, run_id: str, task: int, number: int, window: _Window) -> int:
        writer, payloads = self._store.writer, self._payloads
        latencies = window.latencies
        started = time.perf_counter()
        head = await writer.create(run_id, tool_call_id_for(number), TOOL, payloads.request)
        mid = time.perf_counter()
        head = await writer.start_projecting(head, payloads.raw)
        late = time.perf_counter()
        await writer.complete(head, payloads.result, EvidenceStatus.EVIDENCE_FOUND, "bench corpus")
        if window.measuring:
            latencies += (mid - started, late - mid, time.perf_counter() - late)
        return 1

    async def _boundary_one(self, run_id: str, task: int, number: int, window: _Window) -> int:
        envelope = ToolEnvelope(
            run_id=run_id,
            tool_call_id=tool_call_id_for(number),
            tool=TOOL,
            arguments=self._arguments,
        )
        reply = await self._boundary.invoke(RunContext(run_id), envelope)
        if not isinstance(reply, ToolResult):
            raise BenchError(f"boundary answered {reply.error_code.value}")
        return 1
