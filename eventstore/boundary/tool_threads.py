"""Where a boundary runs plain (non-async) executors and projectors: worker threads.

A plain tool would block the event loop, so it runs in a thread: one of the boundary's
own pool when ``ToolBoundary(max_tool_threads=N)`` sizes one (at most N tools at once,
the pool closed with the boundary), else one of the event loop's default executor, which
everything on that loop shares (asyncio sizes it :data:`DEFAULT_EXECUTOR_THREADS`; a
``SyncStore`` gives its loop one of that size). Either way the tool runs in a copy of the
caller's context, so context variables (and tracing spans) follow it.

A thread cannot be stopped from outside. When a call stops waiting for its tool (the
tool's time limit passed, or the call was cancelled), the tool keeps its thread until it
returns; such a thread is *stuck*, and each pool counts its stuck threads
(:attr:`ToolThreads.stuck`; for the default executor, one count per event loop, shared
by every boundary on it). Once every thread of a pool is stuck, a new tool is refused at
once with :class:`ToolThreadsExhausted` (the boundary answers EXECUTION_FAILED, or
PROJECTION_FAILED for a projector) rather than queued behind tools that may never
return; as the stuck tools return, the count drops and tools run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Final

from eventstore.errors import InvalidArgument
from machine.errors import CanonError

#: The size asyncio gives an event loop's default executor (and a SyncStore gives its own).
DEFAULT_EXECUTOR_THREADS: Final = min(32, (os.cpu_count() or 1) + 4)


class ToolThreadsExhausted(CanonError):
    """Raised when a tool is refused because every thread of its pool is stuck.

    Stuck: still running a tool whose call stopped waiting for it (time limit passed, or
    the call was cancelled). The boundary answers the call EXECUTION_FAILED (or
    PROJECTION_FAILED for a projector); the record's failure detail names this type.
    """


class _PoolLoad:
    """How many threads of one pool are stuck, out of how many it has."""

    __slots__ = ("capacity", "lock", "stuck")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.stuck = 0
        self.lock = threading.Lock()


#: The default executor's load, per event loop (the executor belongs to its loop).
_DEFAULT_LOADS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _PoolLoad] = (
    weakref.WeakKeyDictionary()
)
_DEFAULT_LOADS_LOCK: Final = threading.Lock()


def _default_load(loop: asyncio.AbstractEventLoop) -> _PoolLoad:
    with _DEFAULT_LOADS_LOCK:
        load = _DEFAULT_LOADS.get(loop)
        if load is None:
            load = _DEFAULT_LOADS[loop] = _PoolLoad(DEFAULT_EXECUTOR_THREADS)
        return load


class _Job:
    """One tool run in a pool thread: stuck while started, abandoned and not ended.

    Started and ended in the pool thread, abandoned in the loop thread, in either order:
    each step updates the pool's count under its lock, so it is never off by one.
    """

    __slots__ = ("_abandoned", "_ended", "_load", "_started")

    def __init__(self, load: _PoolLoad) -> None:
        self._load = load
        self._started = self._abandoned = self._ended = False

    def start(self) -> None:
        with self._load.lock:
            self._started = True
            if self._abandoned:  # its call gave up while it waited for a thread
                self._load.stuck += 1

    def end(self) -> None:
        with self._load.lock:
            self._ended = True
            if self._abandoned:
                self._load.stuck -= 1

    def abandon(self) -> None:
        with self._load.lock:
            if self._abandoned:
                return
            self._abandoned = True
            if self._started and not self._ended:
                self._load.stuck += 1


def shutdown_within(executor: Executor, timeout_s: float | None) -> None:
    """Shut ``executor`` down, waiting at most ``timeout_s`` for its threads (None: no limit).

    Past the limit, its threads are left to exit when their tools return (a thread cannot
    be stopped), joined by a daemon thread of ours that then exits too.
    """
    if timeout_s is None:
        executor.shutdown(wait=True)
        return
    joiner = threading.Thread(
        target=executor.shutdown, kwargs={"wait": True}, name="canon-tool-closer", daemon=True
    )
    joiner.start()
    joiner.join(max(0.0, timeout_s))


class ToolThreads:
    """The threads one boundary's plain tools run in.

    Args:
        max_threads: size of an own pool; None uses the event loop's default executor.

    Raises:
        InvalidArgument: ``max_threads`` is not a whole number of at least 1.

    """

    __slots__ = ("_load", "_pool")

    def __init__(self, max_threads: int | None = None) -> None:
        if max_threads is not None and not (
            type(max_threads) is int and max_threads >= 1  # bool is not a thread count
        ):
            raise InvalidArgument("max_tool_threads must be a whole number of at least 1")
        self._pool: ThreadPoolExecutor | None = None
        self._load: _PoolLoad | None = None
        if max_threads is not None:
            self._pool = ThreadPoolExecutor(max_threads, thread_name_prefix="canon-tool")
            self._load = _PoolLoad(max_threads)
        else:
            # Built on its loop (as a SyncBoundary's is), its count is known at once;
            # else it is found on the first run.
            with contextlib.suppress(RuntimeError):
                self._load = _default_load(asyncio.get_running_loop())

    @property
    def stuck(self) -> int:
        """Threads of the pool still running a tool whose call stopped waiting for it.

        For the default executor, those of every boundary on the same event loop (0 until
        this one has run on it, when it was built outside a loop).
        """
        return self._load.stuck if self._load is not None else 0

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` in one of the threads, in a copy of the current context.

        Raises:
            ToolThreadsExhausted: every thread of the pool is stuck (nothing was run).

        """
        loop = asyncio.get_running_loop()
        load = self._load
        if load is None:
            load = self._load = _default_load(loop)
        if load.stuck >= load.capacity:
            raise ToolThreadsExhausted(
                f"all {load.capacity} tool threads are still running tools whose calls "
                "have ended (time limit passed or cancelled)"
            )
        job = _Job(load)
        context = contextvars.copy_context()

        def call() -> Any:
            job.start()
            try:
                return context.run(fn, *args)
            finally:
                job.end()

        try:
            return await loop.run_in_executor(self._pool, call)
        except BaseException:
            # Its call stops waiting (time limit, cancellation): if the tool still runs,
            # its thread is stuck until it returns. A tool that raised has ended: no-op.
            job.abandon()
            raise

    def close(self, *, wait: bool = False, timeout_s: float | None = None) -> None:
        """Stop an own pool: idle threads exit now, busy ones when their tool returns.

        Args:
            wait: block until then (never from the event loop: a tool may need it).
            timeout_s: with ``wait``, block at most this long (None: no limit); threads
                still busy then exit when their tool returns.

        """
        if self._pool is None:
            return
        if wait:
            shutdown_within(self._pool, timeout_s)
        else:
            self._pool.shutdown(wait=False)
