"""What every throughput run shares: the measured window, its sample, and the drive.

A run starts N workers (asyncio tasks, :class:`Tasks`, or plain threads, in
:mod:`.threaded`), lets them warm up, opens the window for a fixed time, then stops
them: the sample is the invocations finished inside the window per second, the p50/p99
of what the mode timed, and the client's and Redis's CPU time per invocation. On a slow
disk (``appendfsync always``) a short window may close before anything finished, so it
stays open until a few invocations have, up to a bound: a rate is never a zero that only
says the window was too short.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from redis.asyncio import Redis

from eventstore.boundary.contracts import AgentReply, ToolError, ToolResult, reply_status
from eventstore.errors import CanonError
from eventstore.writer import Writer

_WRITER_CALLS: Final = ("create", "start_projecting", "complete")
#: The window closes once its time is up and at least this many invocations finished (a
#: per-invocation count, such as the waits for Redis, is then off by at most 1/50 for the
#: calls that straddle the window's edges, however busy the machine)...
_FEWEST_INVOCATIONS: Final = 50.0
#: ...or, whatever finished, once it has been open about this long.
_LONGEST_WINDOW_S: Final = 20.0
#: Redis CPU seconds used so far, one figure per server (on a cluster: per master).
ServerCpu = Callable[[], Awaitable[list[float]]]


class BenchError(CanonError, RuntimeError):
    """Raised when a benchmark write is refused: the numbers would not mean anything."""


@dataclass(slots=True)
class Window:
    """The measured window of one run: whether it is open, and what it counted."""

    measuring: bool = False
    invocations: float = 0.0
    latencies: list[float] = field(default_factory=list)

    def count(self, invocations: float) -> None:
        """Credit finished invocations (or a share of them) to the window while it is open."""
        if self.measuring:
            self.invocations += invocations


@dataclass(frozen=True, slots=True)
class Sample:
    """One timed run: throughput, append latency and CPU time per invocation.

    ``server_cpu_us`` is the sum over the servers measured; ``server_cpu_split_us`` gives
    each server's part (one figure for a single server, one per master on a cluster).
    """

    invocations_per_s: float
    p50_ms: float
    p99_ms: float
    invocations: int
    client_cpu_us: float
    server_cpu_us: float
    server_cpu_split_us: tuple[float, ...] = ()
    #: Times a caller waited for Redis per invocation (the store's modes; 0: not counted).
    waits_per_invocation: float = 0.0


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of ``values`` (0.0 when empty)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


class Workers(Protocol):
    """What writes during a run: N asyncio tasks or N threads, started and stopped."""

    def start(self) -> None:
        """Start writing."""

    async def stop(self) -> None:
        """Stop, wait for every worker, count into the window and raise the first error."""

    def finished(self) -> float:
        """Invocations finished inside the window so far."""


#: ``one(task, number, window)`` writes invocations numbered from ``number`` on, credits
#: the window with what it finished (:meth:`Window.count`) and returns how many numbers
#: it used.
One = Callable[[int, int, Window], Awaitable[int]]


class Tasks:
    """N asyncio tasks, each calling ``one(task, number, window)`` until stopped."""

    def __init__(self, window: Window, concurrency: int, one: One) -> None:
        self._window = window
        self._concurrency = concurrency
        self._one = one
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start the tasks."""
        self._tasks = [asyncio.create_task(self._worker(t)) for t in range(self._concurrency)]

    async def _worker(self, task: int) -> None:
        window, number = self._window, 0
        while not self._stopping:
            number += await self._one(task, number, window)

    def finished(self) -> float:
        """Invocations finished inside the window so far."""
        return self._window.invocations

    async def stop(self) -> None:
        """Let every task finish its invocation; raise the first error."""
        self._stopping = True
        try:
            await asyncio.gather(*self._tasks)
        finally:
            for task in self._tasks:
                task.cancel()


async def drive(
    window: Window,
    workers: Workers,
    warmup_s: float,
    duration_s: float,
    server_cpu: ServerCpu,
    waits: Callable[[], int] | None = None,
) -> Sample:
    """Run ``workers`` through a warm-up and the measured window; return the sample.

    ``waits``: how many times the mode's callers have waited for Redis so far (a store's
    ``batch_stats.waits``), read as the window opens and closes.
    """
    workers.start()
    try:
        await asyncio.sleep(warmup_s)
        server_started = await server_cpu()
        waits_started = waits() if waits is not None else 0
        window.measuring = True
        started, cpu_started = time.perf_counter(), time.process_time()
        await asyncio.sleep(duration_s)
        # Threads count on their own, so the window looks at what they finished now and then.
        for _ in range(int(_LONGEST_WINDOW_S / duration_s * 10)):
            if workers.finished() >= _FEWEST_INVOCATIONS:
                break
            await asyncio.sleep(duration_s / 10)
        window.measuring = False
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        waited = waits() - waits_started if waits is not None else 0
        server = [
            end - begin for begin, end in zip(server_started, await server_cpu(), strict=True)
        ]
    finally:
        await workers.stop()
    count = max(window.invocations, 1.0)
    return Sample(
        invocations_per_s=window.invocations / elapsed,
        p50_ms=percentile(window.latencies, 0.50) * 1000,
        p99_ms=percentile(window.latencies, 0.99) * 1000,
        invocations=round(window.invocations),
        client_cpu_us=cpu / count * 1e6,
        server_cpu_us=sum(server) / count * 1e6,
        server_cpu_split_us=tuple(part / count * 1e6 for part in server),
        waits_per_invocation=waited / count,
    )


def _timed(window: Window, call: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        result = await call(*args, **kwargs)
        if window.measuring:
            window.latencies.append(time.perf_counter() - started)
        return result

    return timed


@contextlib.contextmanager
def timing_appends(writer: Writer, window: Window) -> Iterator[None]:
    """Time each of ``writer``'s appends into ``window``, as the writer mode times its own."""
    for name in _WRITER_CALLS:
        setattr(writer, name, _timed(window, getattr(writer, name)))
    try:
        yield
    finally:
        for name in _WRITER_CALLS:
            writer.__dict__.pop(name, None)


async def timed_call(window: Window, call: Awaitable[Any]) -> Any:
    """Await ``call``, its latency counted into ``window`` while it is open."""
    started = time.perf_counter()
    result = await call
    if window.measuring:
        window.latencies.append(time.perf_counter() - started)
    return result


def check_reply(reply: AgentReply) -> None:
    """Raise :class:`BenchError` unless the boundary answered with a result."""
    if not isinstance(reply, ToolResult):
        code = reply.error_code.value if isinstance(reply, ToolError) else reply_status(reply)
        raise BenchError(f"boundary answered {code}")


async def bare_server_cpu(client: Redis) -> list[float]:
    """Redis CPU seconds (user + system) of the server ``client`` is connected to."""
    info = await client.info("cpu")
    return [float(info["used_cpu_user"]) + float(info["used_cpu_sys"])]
