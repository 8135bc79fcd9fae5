"""Throughput and append latency of the ways to write one invocation (:mod:`.modes`).

``minimal_naive``: bare redis-py asyncio EVALSHA of ``minimal_write.lua`` (only the
writes), one awaited call at a time per task. ``minimal_pipelined``: the same calls in
pipelines of 16 invocations. ``script_floor`` and ``script_ceiling``: the same two ways
with the store's own scripts and pre-built arguments. ``writer``: the Writer's create /
start_projecting / complete. ``boundary``: ``ToolBoundary.invoke`` with a trivial async
tool and logging on; ``boundary_def_tool``: the same with a plain ``def`` tool, which the
boundary runs in a worker thread. The two modes driven by plain threads are in
:mod:`.threaded`. Each runs with N concurrent tasks (or threads) for a fixed window after
a warm-up; a run yields invocations/s, the p50/p99 of one append (pipelined modes: of one
pipeline, which every call in it waits for; the boundary modes: of one whole call), the
client's and Redis's CPU time and, for the store's modes, how many times a call waited
for Redis.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, Final

from redis.asyncio import Redis

from canon.bench.minimal import FOLDER as BENCH_FOLDER
from canon.bench.minimal import MinimalWriteScript
from canon.bench.modes import BY_KEY
from canon.bench.threaded import ThreadedModes
from canon.bench.timing import (
    BenchError,
    Sample,
    ServerCpu,
    Tasks,
    Window,
    Workers,
    bare_server_cpu,
    check_reply,
    drive,
    timed_call,
    timing_appends,
)
from canon.bench.workload import (
    TOOL,
    FloorArgs,
    Payloads,
    boundary_tool,
    request_arguments,
    run_id_for,
    tool_call_id_for,
)
from eventstore.boundary.contracts import RunContext, ToolEnvelope
from eventstore.boundary.tool_boundary import ToolBoundary
from eventstore.store import Store
from eventstore.wire.scripts import FOLDER, AppendScript, CreateScript, is_committed
from eventstore.writer import Writer, now_ms
from machine.codes import EvidenceStatus

PIPELINE_INVOCATIONS: Final = 16
#: Which run ids a measurement keeps (see :meth:`ThroughputBench.run`).
RunSelector = Callable[[str], bool]
#: Filtered runs are numbered from here, apart from the unfiltered ones (0 up).
FILTERED_RUNS_FROM: Final = 100_000
#: One invocation's script calls: (SHA, ``numkeys, *keys, *args``) each.
Calls = list[tuple[str, tuple[Any, ...]]]


def _check_script(reply: Any) -> None:
    if not is_committed(reply):
        raise BenchError(f"script refused a benchmark write: {reply!r:.80}")


def _check_minimal(reply: Any) -> None:
    if not isinstance(reply, bytes):
        raise BenchError(f"the minimal script answered {reply!r:.80}")


class ThroughputBench:
    """Runs the modes against one store (its namespace is the benchmark's).

    Args:
        store: the store under test.
        payloads: one invocation's payloads.
        bare: a plain client of the same server, for the floors and the server's CPU.
        url: the server's URL, for the modes driven by threads (:mod:`.threaded`).
        server_cpu: how to read the servers' CPU time (default: ``INFO`` on ``bare``).

    """

    def __init__(
        self,
        store: Store,
        payloads: Payloads,
        *,
        bare: Redis | None = None,
        url: str | None = None,
        server_cpu: ServerCpu | None = None,
    ) -> None:
        self._store = store
        self._bare = bare
        self._payloads = payloads
        self._floor = FloorArgs(store.keys, payloads, at_ms=now_ms())
        self._boundaries = {
            "boundary": ToolBoundary(store, {TOOL: boundary_tool(payloads)}),
            "boundary_def_tool": ToolBoundary(store, {TOOL: boundary_tool(payloads, plain=True)}),
        }
        self._shas: dict[str, str] = {}
        self._arguments = request_arguments(len(payloads.request))
        self._threaded = (
            None if url is None else ThreadedModes(url, store.keys.namespace, payloads, self._floor)
        )
        if server_cpu is None and bare is not None:
            server_cpu = lambda: bare_server_cpu(bare)  # noqa: E731 - bound once
        self._server_cpu = server_cpu

    async def prepare(self) -> None:
        """Load the scripts the floors call by SHA; open the sync store of the thread modes."""
        if self._bare is not None:
            for name, folder in (
                (CreateScript.name, FOLDER),
                (AppendScript.name, FOLDER),
                (MinimalWriteScript.name, BENCH_FOLDER),
            ):
                self._shas[name] = await self._bare.script_load(folder.source(name))
        if self._threaded is not None:
            await self._threaded.open(self._shas[MinimalWriteScript.name])

    async def close(self) -> None:
        """Close the sync store of the thread modes, if one was opened."""
        if self._threaded is not None:
            await self._threaded.close()

    async def _open_runs(
        self, mode: str, repeat: int, concurrency: int, where: RunSelector | None
    ) -> list[str]:
        letter = BY_KEY[mode].letter
        if where is None:
            runs = [run_id_for(letter, repeat, concurrency, task) for task in range(concurrency)]
        else:  # numbered apart from the unfiltered runs of the same mode and repeat
            candidates = (
                run_id_for(letter, repeat, concurrency, task)
                for task in itertools.count(FILTERED_RUNS_FROM)
            )
            runs = list(itertools.islice(filter(where, candidates), concurrency))
        for run_id in runs:
            await self._store.open_run(run_id, deadline=timedelta(hours=2), tools={TOOL: None})
        return runs

    async def run(
        self,
        mode: str,
        repeat: int,
        concurrency: int,
        warmup_s: float,
        duration_s: float,
        *,
        runs_where: RunSelector | None = None,
    ) -> Sample:
        """Run ``mode`` once with ``concurrency`` tasks (or threads); return its sample.

        ``runs_where`` keeps only the run ids it accepts (on a cluster: the runs whose
        shard one master holds, to load that master alone).
        """
        if self._server_cpu is None:
            raise BenchError("no way to read the server's CPU time was given")
        runs = await self._open_runs(mode, repeat, concurrency, runs_where)
        window = Window()
        timed: Writer | None = None
        workers: Workers
        if BY_KEY[mode].threads:
            if self._threaded is None:
                raise BenchError(f"{mode} needs the server's URL")
            workers, timed = self._threaded.workers(mode, runs, window)
        else:
            one = self._one(mode)

            async def bound(task: int, number: int, window: Window) -> int:
                return await one(runs[task], task, number, window)

            workers = Tasks(window, concurrency, bound)
        waits = self._waits(mode)
        with timing_appends(timed, window) if timed is not None else contextlib.nullcontext():
            return await drive(window, workers, warmup_s, duration_s, self._server_cpu, waits)

    def _waits(self, mode: str) -> Callable[[], int] | None:
        """How to read the waits for Redis of ``mode``'s store (None: a bare floor's)."""
        if mode in ("writer", *self._boundaries):
            stats = self._store.batch_stats
            return lambda: stats.waits
        if mode == "sync_boundary" and self._threaded is not None:
            return self._threaded.waits
        return None

    def _one(self, mode: str) -> Callable[[str, int, int, Window], Awaitable[int]]:
        if mode in self._boundaries:
            boundary = self._boundaries[mode]

            async def invoke(run_id: str, task: int, number: int, window: Window) -> int:
                # Timed whole: one clock pair per call, as the floors time each command.
                await timed_call(window, self._boundary_one(boundary, run_id, number))
                window.count(1)
                return 1

            return invoke
        return {
            "minimal_naive": self._minimal_naive_one,
            "minimal_pipelined": self._minimal_pipelined_one,
            "script_floor": self._script_floor_one,
            "script_ceiling": self._script_ceiling_one,
            "writer": self._writer_one,
        }[mode]

    def _script_calls(self, run_id: str, call: str, invocation_id: str) -> Calls:
        floor, create, append = self._floor, self._shas["create"], self._shas["append"]
        return [
            (create, floor.create(run_id, call, invocation_id)),
            (append, floor.append(run_id, call, 2)),
            (append, floor.append(run_id, call, 3)),
        ]

    def _minimal_calls(self, run_id: str, call: str, invocation_id: str) -> Calls:
        sha = self._shas[MinimalWriteScript.name]
        return [(sha, self._floor.minimal(run_id, call, v, invocation_id)) for v in (1, 2, 3)]

    async def _naive(self, calls: Calls, window: Window, check: Callable[[Any], None]) -> int:
        client = self._bare
        assert client is not None  # prepare() loaded the SHAs through it
        for sha, args in calls:
            started = time.perf_counter()
            reply = await client.evalsha(sha, *args)
            if window.measuring:
                window.latencies.append(time.perf_counter() - started)
            check(reply)
        window.count(1)
        return 1

    async def _pipelined(
        self,
        build: Callable[[str, str, str], Calls],
        run_id: str,
        task: int,
        number: int,
        window: Window,
        check: Callable[[Any], None],
    ) -> int:
        client = self._bare
        assert client is not None  # prepare() loaded the SHAs through it
        invocations = [
            build(run_id, tool_call_id_for(number + i), f"{task:032d}{number + i:032d}")
            for i in range(PIPELINE_INVOCATIONS)
        ]
        # One pipeline per step: every invocation's creation, then each append in turn.
        # Each pipeline is credited with its share of the invocations, so a window
        # shorter than a task's three pipelines still counts what was written in it.
        phases = list(zip(*invocations, strict=True))
        for phase in phases:
            started = time.perf_counter()
            async with client.pipeline(transaction=False) as pipe:
                for sha, args in phase:
                    pipe.evalsha(sha, *args)
                replies = await pipe.execute()
            if window.measuring:
                window.latencies.append(time.perf_counter() - started)
            for reply in replies:
                check(reply)
            window.count(PIPELINE_INVOCATIONS / len(phases))
        return PIPELINE_INVOCATIONS

    async def _minimal_naive_one(self, run_id: str, task: int, number: int, window: Window) -> int:
        calls = self._minimal_calls(run_id, tool_call_id_for(number), f"{task:032d}{number:032d}")
        return await self._naive(calls, window, _check_minimal)

    async def _minimal_pipelined_one(
        self, run_id: str, task: int, number: int, window: Window
    ) -> int:
        return await self._pipelined(
            self._minimal_calls, run_id, task, number, window, _check_minimal
        )

    async def _script_floor_one(self, run_id: str, task: int, number: int, window: Window) -> int:
        calls = self._script_calls(run_id, tool_call_id_for(number), f"{task:032d}{number:032d}")
        return await self._naive(calls, window, _check_script)

    async def _script_ceiling_one(self, run_id: str, task: int, number: int, window: Window) -> int:
        return await self._pipelined(
            self._script_calls, run_id, task, number, window, _check_script
        )

    async def _writer_one(self, run_id: str, task: int, number: int, window: Window) -> int:
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
        window.count(1)
        return 1

    async def _boundary_one(self, boundary: ToolBoundary, run_id: str, number: int) -> None:
        envelope = ToolEnvelope(
            run_id=run_id,
            tool_call_id=tool_call_id_for(number),
            tool=TOOL,
            arguments=self._arguments,
        )
        check_reply(await boundary.invoke(RunContext(run_id), envelope))
