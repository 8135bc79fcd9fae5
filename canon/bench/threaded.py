"""The modes driven by N plain threads, as code without an event loop writes.

``minimal_sync``: each thread has its own redis-py *sync* client (its own connection)
and makes the minimal floor's three EVALSHA one at a time. ``sync_boundary``: each
thread calls ``SyncBoundary.invoke`` of one shared ``SyncStore`` (whose event loop runs
in its own thread, see :mod:`eventstore.sync`) with a plain ``def`` tool, which the
boundary runs in a worker thread. The measured window is opened and closed by the
benchmark's event loop, exactly as for the asyncio modes.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Final

import redis

from canon.bench.timing import BenchError, Window, Workers, check_reply
from canon.bench.workload import (
    TOOL,
    FloorArgs,
    Payloads,
    boundary_tool,
    request_arguments,
    tool_call_id_for,
)
from eventstore.boundary.contracts import RunContext, ToolEnvelope
from eventstore.sync import SyncBoundary, SyncStore
from eventstore.writer import Writer

#: Connections of the sync store's pool: enough for 64 threads' calls in flight.
_MAX_CONNECTIONS: Final = 256
#: How long stopping waits for the threads to finish their invocation.
_JOIN_TIMEOUT_S: Final = 30.0

#: ``one(task, number)`` writes invocations from ``number`` on; returns how many.
ThreadOne = Callable[[int, int], int]


class Threads:
    """N plain threads, each calling ``one(task, number)`` until stopped.

    ``release`` is called once they have stopped (to close what they used).
    """

    def __init__(
        self,
        window: Window,
        concurrency: int,
        one: ThreadOne,
        release: Callable[[], None] = lambda: None,
    ) -> None:
        self._window = window
        self._one = one
        self._release = release
        self._stopping = threading.Event()
        # One slot per thread: each thread adds to its own, so no count is ever lost.
        self._counts = [0] * concurrency
        self._errors: list[BaseException] = []
        self._threads = [
            threading.Thread(target=self._worker, args=(task,), name=f"bench-{task}", daemon=True)
            for task in range(concurrency)
        ]

    def start(self) -> None:
        """Start the threads."""
        for thread in self._threads:
            thread.start()

    def _worker(self, task: int) -> None:
        window, number = self._window, 0
        try:
            while not self._stopping.is_set():
                done = self._one(task, number)
                if window.measuring:
                    self._counts[task] += done
                number += done
        except BaseException as exc:  # handed to stop(), which raises it in the loop
            self._errors.append(exc)
            self._stopping.set()

    def finished(self) -> float:
        """Invocations finished inside the window so far (each thread's own count)."""
        return float(sum(self._counts))

    def _join(self) -> None:
        for thread in self._threads:
            thread.join(_JOIN_TIMEOUT_S)

    async def stop(self) -> None:
        """Let every thread finish its invocation; count into the window; raise an error."""
        self._stopping.set()
        try:
            await asyncio.to_thread(self._join)
        finally:
            self._release()
        self._window.invocations += sum(self._counts)
        if self._errors:
            raise self._errors[0]
        if any(thread.is_alive() for thread in self._threads):
            raise BenchError("a benchmark thread did not finish its invocation in time")


class ThreadedModes:
    """``minimal_sync`` and ``sync_boundary`` on one server, in the benchmark's namespace."""

    def __init__(self, url: str, namespace: str, payloads: Payloads, floor: FloorArgs) -> None:
        self._url = url
        self._namespace = namespace
        self._payloads = payloads
        self._floor = floor
        self._arguments = request_arguments(len(payloads.request))
        self._sha = ""
        self._store: SyncStore | None = None
        self._boundary: SyncBoundary | None = None

    async def open(self, minimal_sha: str) -> None:
        """Remember the minimal script's SHA; open the sync store and its boundary."""
        self._sha = minimal_sha
        await asyncio.to_thread(self._open_store)

    def _open_store(self) -> None:
        store = SyncStore.from_url(
            self._url, namespace=self._namespace, max_connections=_MAX_CONNECTIONS
        )
        store.__enter__()
        self._store = store
        self._boundary = SyncBoundary(store, {TOOL: boundary_tool(self._payloads, plain=True)})

    async def close(self) -> None:
        """Close the sync store (its boundary, connections and loop thread)."""
        if self._store is not None:
            await asyncio.to_thread(self._store.close)
            self._store = self._boundary = None

    def workers(self, mode: str, runs: list[str], window: Window) -> tuple[Workers, Writer | None]:
        """The threads of ``mode`` writing to ``runs`` (one each), and the writer to time.

        Raises:
            BenchError: ``mode`` is not driven by threads, or the store is not open.

        """
        if mode == "minimal_sync":
            return self._minimal_sync(runs, window), None
        if mode == "sync_boundary" and self._store is not None:
            return Threads(window, len(runs), self._sync_boundary(runs)), self._store_writer()
        raise BenchError(f"{mode} is not a mode driven by threads, or its store is not open")

    def waits(self) -> int:
        """How many times the sync store's callers have waited for Redis so far."""
        return 0 if self._store is None else self._store.async_store.batch_stats.waits

    def _store_writer(self) -> Writer:
        assert self._store is not None
        return self._store.async_store.writer

    def _minimal_sync(self, runs: list[str], window: Window) -> Threads:
        clients = [redis.Redis.from_url(self._url) for _ in runs]
        floor, sha = self._floor, self._sha

        def one(task: int, number: int) -> int:
            client, run_id, call = clients[task], runs[task], tool_call_id_for(number)
            invocation_id = f"{task:032d}{number:032d}"
            for version in (1, 2, 3):
                args = floor.minimal(run_id, call, version, invocation_id)
                started = time.perf_counter()
                reply = client.evalsha(sha, *args)
                if window.measuring:
                    window.latencies.append(time.perf_counter() - started)
                if not isinstance(reply, bytes):
                    raise BenchError(f"the minimal script answered {reply!r:.80}")
            return 1

        def release() -> None:
            for client in clients:
                client.close()

        return Threads(window, len(runs), one, release)

    def _sync_boundary(self, runs: list[str]) -> ThreadOne:
        boundary, arguments = self._boundary, self._arguments
        assert boundary is not None

        def one(task: int, number: int) -> int:
            run_id = runs[task]
            envelope = ToolEnvelope(
                run_id=run_id, tool_call_id=tool_call_id_for(number), tool=TOOL, arguments=arguments
            )
            check_reply(boundary.invoke(RunContext(run_id), envelope))
            return 1

        return one
