"""The store and the boundary for code without an event loop: ``SyncStore``, ``SyncBoundary``.

A ``SyncStore`` owns one background thread that runs one asyncio event loop; the async
:class:`~eventstore.store.Store` is built, used and closed in that loop only (an async
store belongs to one loop; see :class:`~eventstore.errors.WrongEventLoop`). Each method
hands its coroutine to the loop and blocks the calling thread until it is done, so any
number of threads may call at once: their calls interleave on the loop like concurrent
tasks, and budgets and duplicates are decided by Redis exactly as for async callers.

``close()`` (or leaving ``with``) closes the boundaries' own tool threads, the
connection pool, the loop's default executor and the loop thread, in that order: nothing
is left running. Close once every call has returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Self, TypeVar

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from eventstore.boundary.contracts import AgentReply, RunContext, ToolEnvelope, ToolSpec
from eventstore.boundary.tool_boundary import ToolBoundary
from eventstore.errors import StoreClosed, WrongEventLoop
from eventstore.reader import InvocationRecord, StoredEvent
from eventstore.runs import OpenedRun, RunInfo
from eventstore.server.durability import DurabilityMode, DurabilityReport
from eventstore.store import Store
from machine.limits import Limits

T = TypeVar("T")


async def _gather(
    boundary: ToolBoundary, ctx: RunContext, envelopes: Sequence[ToolEnvelope]
) -> list[AgentReply]:
    return list(await asyncio.gather(*(boundary.invoke(ctx, envelope) for envelope in envelopes)))


async def _await_on(
    loop: asyncio.AbstractEventLoop, start: Callable[[], Coroutine[Any, Any, T]]
) -> T:
    """Run ``start()`` as a task of ``loop`` and await it from the running (other) loop.

    The caller's cancellation cancels the task and waits for it to finish, so the call has
    closed its record when the cancellation reaches the caller.
    """
    caller = asyncio.get_running_loop()
    outcome: asyncio.Future[T] = caller.create_future()
    tasks: list[asyncio.Task[T]] = []

    def settle(task: asyncio.Task[T]) -> None:
        if outcome.done():
            return
        if task.cancelled():
            outcome.cancel()
        elif (error := task.exception()) is not None:
            outcome.set_exception(error)
        else:
            outcome.set_result(task.result())

    def begin() -> None:
        task = loop.create_task(start())
        tasks.append(task)
        task.add_done_callback(lambda done: caller.call_soon_threadsafe(settle, done))

    loop.call_soon_threadsafe(begin)
    try:
        return await asyncio.shield(outcome)
    except asyncio.CancelledError:
        # FIFO: begin() has run before this, so the task exists.
        loop.call_soon_threadsafe(lambda: tasks[0].cancel())
        with contextlib.suppress(BaseException):
            await outcome
        raise


async def _build(factory: Callable[[], T]) -> T:
    """Run ``factory`` inside the loop, so what it builds belongs to that loop."""
    return factory()


class SyncStore:
    """A :class:`~eventstore.store.Store` for threads: the same options, blocking methods.

    Args:
        client: the Redis (or Redis Cluster) client, as for ``Store``.
        options: every keyword option of ``Store`` (namespace, ttl, limits, durability,
            ...).

    Use :meth:`from_url` to build one and ``with`` to check the namespace and the
    server's durability on entry and close everything on exit.

    """

    def __init__(self, client: Redis | RedisCluster, **options: Any) -> None:
        self._start(lambda: Store(client, **options))

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SyncStore:
        """Build a store on ``url``; the options are those of :meth:`Store.from_url`."""
        store = cls.__new__(cls)
        store._start(lambda: Store.from_url(url, **options))
        return store

    def _start(self, factory: Callable[[], Store]) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="canon-sync-store", daemon=True
        )
        self._closed = False
        self._close_lock = threading.Lock()
        self._boundaries: list[SyncBoundary] = []
        self._thread.start()
        try:
            self._store = self.call(_build(factory))
        except BaseException:
            self._stop_loop()
            raise

    @property
    def limits(self) -> Limits:
        """The store's size limits."""
        return self._store.settings.limits

    @property
    def durability(self) -> DurabilityMode:
        """What entering the store does about a server that could lose records."""
        return self._store.settings.durability

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the store's loop and return its result (or raise its error).

        The way to use the async API (``store.async_store``) from a thread. If the calling
        thread is interrupted (KeyboardInterrupt), the coroutine is cancelled.

        Raises:
            StoreClosed: the store was closed.
            WrongEventLoop: called from the store's own loop thread (a plain projector
                that calls the store): it would wait for itself forever.

        """
        if threading.get_ident() == self._thread.ident:
            coroutine.close()
            raise WrongEventLoop(
                "a SyncStore was called from its own event-loop thread (a tool or projector "
                "running on the loop): await the async store (SyncStore.async_store) there"
            )
        if self._closed:
            coroutine.close()
            raise StoreClosed("this SyncStore is closed")
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    @property
    def async_store(self) -> Store:
        """The async store inside; only its own loop (see :meth:`call`) may use it."""
        return self._store

    def __enter__(self) -> Self:
        try:
            self.call(self._store.__aenter__())
        except BaseException:
            self._stop_loop()  # the async store closed its pool itself
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the boundaries' tool threads, the connections and the loop thread."""
        with self._close_lock:
            if self._closed:
                return
            for boundary in list(self._boundaries):
                boundary.close()
            try:
                self.call(self._store.aclose())
            finally:
                self._stop_loop()

    def _stop_loop(self) -> None:
        """Stop the loop thread after its default executor; idempotent."""
        if self._loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(
                self._loop.shutdown_default_executor(), self._loop
            ).result()
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def check_namespace(self) -> None:
        """See :meth:`Store.check_namespace`."""
        self.call(self._store.check_namespace())

    def check_durability(self, mode: DurabilityMode | None = None) -> DurabilityReport | None:
        """See :meth:`Store.check_durability`."""
        return self.call(self._store.check_durability(mode))

    def open_run(
        self,
        run_id: str,
        *,
        deadline: datetime | timedelta,
        budget: int | None = None,
        tools: Mapping[str, int | None] | None = None,
    ) -> OpenedRun:
        """Register a run; see :meth:`Store.open_run`."""
        return self.call(
            self._store.open_run(run_id, deadline=deadline, budget=budget, tools=tools)
        )

    def close_run(self, run_id: str) -> bool:
        """Mark a run inactive; False when the run is unknown."""
        return self.call(self._store.close_run(run_id))

    def revoke_token(self, run_id: str) -> bool:
        """Withdraw a run's access token; False when the run is unknown."""
        return self.call(self._store.revoke_token(run_id))

    def run_info(self, run_id: str) -> RunInfo | None:
        """Return a run's registry entry, or None."""
        return self.call(self._store.run_info(run_id))

    def set_paused(self, paused: bool) -> None:
        """Pause or resume tool execution in the whole namespace."""
        self.call(self._store.set_paused(paused))

    def is_paused(self) -> bool:
        """Tell whether execution is paused."""
        return self.call(self._store.is_paused())

    def get(self, run_id: str, tool_call_id: str) -> InvocationRecord | None:
        """Return the canonical record, or None (read-only; see :meth:`Store.get`)."""
        return self.call(self._store.get(run_id, tool_call_id))

    def events(self, run_id: str, tool_call_id: str) -> list[StoredEvent]:
        """Return the invocation's stored events in order (read-only)."""
        return self.call(self._store.events(run_id, tool_call_id))


class SyncBoundary:
    """A :class:`~eventstore.boundary.tool_boundary.ToolBoundary` for threads: ``invoke`` blocks.

    Args:
        store: the sync store whose loop runs the calls.
        tools: the tools this boundary may run, by name.
        options: every keyword option of ``ToolBoundary`` (``max_tool_threads`` sizes
            the threads plain tools run in, ...).

    Safe to call from any number of threads at once. Closed with its store, or earlier
    with :meth:`close`.

    """

    def __init__(self, store: SyncStore, tools: Mapping[str, ToolSpec], **options: Any) -> None:
        self._store = store
        self._boundary = store.call(
            _build(lambda: ToolBoundary(store.async_store, tools, **options))
        )
        self._closed = False
        store._boundaries.append(self)

    def invoke(self, ctx: RunContext, envelope: ToolEnvelope) -> AgentReply:
        """Run one tool call and return what the agent may see; see ToolBoundary.invoke.

        Raises:
            StoreClosed: the boundary or its store was closed.

        """
        if self._closed:
            raise StoreClosed("this SyncBoundary is closed")
        return self._store.call(self._boundary.invoke(ctx, envelope))

    def invoke_all(self, ctx: RunContext, envelopes: Sequence[ToolEnvelope]) -> list[AgentReply]:
        """Run several calls (one model turn's) concurrently; replies in the calls' order.

        Raises:
            StoreClosed: the boundary or its store was closed.

        """
        if self._closed:
            raise StoreClosed("this SyncBoundary is closed")
        return self._store.call(_gather(self._boundary, ctx, envelopes))

    async def ainvoke(self, ctx: RunContext, envelope: ToolEnvelope) -> AgentReply:
        """Await one call from any event loop; it runs on the boundary's own loop.

        For frameworks that start a loop of their own (a ``run_sync`` that calls
        ``asyncio.run``): their loop waits without blocking and no thread is spent. If
        the awaiting task is cancelled, the call is cancelled and its record closed
        before the cancellation is re-raised, as for ``ToolBoundary.invoke``.

        Raises:
            StoreClosed: the boundary or its store was closed.

        """
        if self._closed or self._store._closed:
            raise StoreClosed("this SyncBoundary is closed")
        return await _await_on(self._store._loop, lambda: self._boundary.invoke(ctx, envelope))

    def close(self) -> None:
        """Stop this boundary's own tool threads, waiting for tools still running."""
        if not self._closed:
            self._closed = True
            self._boundary.close(wait=True)
            self._store._boundaries.remove(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
