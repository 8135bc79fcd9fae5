"""The store and the boundary for code without an event loop: ``SyncStore``, ``SyncBoundary``.

A ``SyncStore`` owns one background thread that runs one asyncio event loop; the async
:class:`~eventstore.store.Store` is built, used and closed in that loop only (an async
store belongs to one loop; see :class:`~eventstore.errors.WrongEventLoop`). Each method
hands its coroutine to the loop and blocks the calling thread until it is done, so any
number of threads may call at once: their calls interleave on the loop like concurrent
tasks, and budgets and duplicates are decided by Redis exactly as for async callers.

``close()`` (or leaving ``with``) may be called from any thread while others are calling,
and ends within a bound: new calls are refused at once with
:class:`~eventstore.errors.StoreClosed`, calls in flight get a grace period, the rest are
cancelled (a tool call's record is closed with ``Failed``, CALLER_CANCELLED, before its
thread gets ``StoreClosed``), then the tool threads, the connections and the loop thread
are stopped (:meth:`SyncStore.close`). No thread waits on a closed store and no record is
left PROJECTING, unless Redis cannot be reached to close it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import functools
import math
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any, Final, Self, TypeVar

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from eventstore.audit.waiting import WaitingCalls, pending_approvals
from eventstore.boundary.contracts import AgentReply, RunContext, ToolEnvelope, ToolSpec
from eventstore.boundary.reconciling import ReconcileReport
from eventstore.boundary.tool_boundary import DEFAULT_RECONCILE_GRACE, OnDuplicate, ToolBoundary
from eventstore.boundary.tool_threads import DEFAULT_EXECUTOR_THREADS, shutdown_within
from eventstore.decisions import Decision
from eventstore.erasure import Erasure
from eventstore.errors import InvalidArgument, StoreClosed, WrongEventLoop
from eventstore.reader import InvocationRecord, StoredEvent
from eventstore.runs import Deadline, OpenedRun, Refusal, RunInfo
from eventstore.server.durability import DurabilityMode, DurabilityReport
from eventstore.settlements import Settlement
from eventstore.store import Store
from machine.codes import ErrorCode
from machine.limits import Limits

T = TypeVar("T")

#: How long ``close()`` lets the calls in flight finish before it cancels them.
DEFAULT_CLOSE_GRACE_S: Final = 10.0
#: Beyond the longest store timeout, how long a cancelled call may take to close its record.
_CLOSING_MARGIN_S: Final = 1.0
#: How long closing waits for the connections to close, and for the loop thread to stop.
_SHUTDOWN_S: Final = 5.0
_CUT = (
    "the SyncStore was closed before this call finished: it was cancelled (a tool call's "
    "record ends ERROR with CALLER_CANCELLED)"
)


async def _gather(
    boundary: ToolBoundary, ctx: RunContext, envelopes: Sequence[ToolEnvelope]
) -> list[AgentReply]:
    return list(await asyncio.gather(*(boundary.invoke(ctx, envelope) for envelope in envelopes)))


async def _build(factory: Callable[[], T]) -> T:
    """Run ``factory`` inside the loop, so what it builds belongs to that loop."""
    return factory()


def _checked_grace(grace_s: float) -> float:
    if not (isinstance(grace_s, int | float) and 0 <= grace_s < math.inf):
        raise InvalidArgument("grace_s must be a finite number of seconds, 0 or more")
    return float(grace_s)


class _Call:
    """One coroutine handed to the store's loop, and the future its caller waits on."""

    __slots__ = ("cut", "future", "owner", "task")

    def __init__(self, owner: SyncBoundary | None) -> None:
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.owner = owner
        # Set on the loop. A call is submitted before any close that could drain it, and
        # the loop runs callbacks in order, so a drain always finds its task.
        self.task: asyncio.Task[Any] | None = None
        self.cut = False  # cancelled by a close, not by its caller


async def _drain(calls: list[_Call], grace_s: float, closing_s: float) -> None:
    """Let ``calls`` finish within ``grace_s``, then cancel the rest and wait for them.

    A task is cancelled only if nothing is cancelling it yet (another close, its caller, a
    time limit): a second cancellation would end the wait of ``invoke`` for the closing
    of its record. Either way it is waited for.
    """
    tasks = {call.task: call for call in calls if call.task is not None}
    if not tasks:
        return
    _, running = await asyncio.wait(set(tasks), timeout=grace_s)
    if not running:
        return
    for task in running:
        if task.cancelling() == 0:
            tasks[task].cut = True
            task.cancel()
    await asyncio.wait(running, timeout=closing_s)


class SyncStore:
    """A :class:`~eventstore.store.Store` for threads: the same options, blocking methods.

    Args:
        client: the Redis (or Redis Cluster) client, as for ``Store``.
        options: every keyword option of ``Store`` (namespace, ttl, limits, durability,
            ...).

    Use :meth:`from_url` to build one and ``with`` to check the namespace and the
    server's durability on entry and close everything on exit (see :meth:`close`).

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
        # The loop's default executor is ours, so that closing can bound the wait for it.
        self._executor = concurrent.futures.ThreadPoolExecutor(
            DEFAULT_EXECUTOR_THREADS, thread_name_prefix="asyncio"
        )
        self._loop.set_default_executor(self._executor)
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="canon-sync-store", daemon=True
        )
        # Guards the calls in flight and the states below, from any thread and the loop.
        self._lock = threading.Lock()
        self._calls: set[_Call] = set()
        self._closing = False  # new calls are refused
        self._stopping = False  # the loop is being stopped: nothing more is scheduled
        self._closed = threading.Event()  # everything is stopped
        self._boundaries: list[SyncBoundary] = []
        self._thread.start()
        try:
            self._store = self.call(_build(factory))
        except BaseException:
            self._shut_down(None)
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
            StoreClosed: the store was closed, or was closed while the coroutine ran
                (past the grace period of :meth:`close`, which cancelled it).
            WrongEventLoop: called from the store's own loop thread (a plain projector
                that calls the store): it would wait for itself forever.

        """
        return self._run(coroutine, None)

    def _run(self, coroutine: Coroutine[Any, Any, T], owner: SyncBoundary | None) -> T:
        """Submit ``coroutine`` for ``owner`` and block until it is done."""
        if threading.get_ident() == self._thread.ident:
            coroutine.close()
            raise WrongEventLoop(
                "a SyncStore was called from its own event-loop thread (a tool or projector "
                "running on the loop): await the async store (SyncStore.async_store) there"
            )
        call = self._submit(coroutine, owner)
        try:
            result: T = call.future.result()
        except BaseException:
            self._cancel(call)  # this thread is interrupted: the call must not go on
            raise
        return result

    def _submit(self, coroutine: Coroutine[Any, Any, Any], owner: SyncBoundary | None) -> _Call:
        """Hand ``coroutine`` to the loop as a call of ``owner``, unless closed.

        Raises:
            StoreClosed: the store, or ``owner``, is closed or closing.

        """
        call = _Call(owner)
        with self._lock:
            if self._closing or (owner is not None and owner._closed):
                coroutine.close()
                closed = "SyncStore" if self._closing else "SyncBoundary"
                raise StoreClosed(f"this {closed} is closed")
            self._calls.add(call)
            self._loop.call_soon_threadsafe(self._begin, call, coroutine)
        return call

    def _begin(self, call: _Call, coroutine: Coroutine[Any, Any, Any]) -> None:
        """On the loop: start the call's task."""
        call.task = self._loop.create_task(coroutine)
        call.task.add_done_callback(functools.partial(self._settle, call))

    def _settle(self, call: _Call, task: asyncio.Task[Any] | None) -> None:
        """Answer the call's waiter with its task's outcome (None: the call was given up).

        The loop and a close that gave the call up may both answer it: the first wins.
        """
        with self._lock:
            self._calls.discard(call)
        future = call.future
        with contextlib.suppress(concurrent.futures.InvalidStateError):  # answered already
            if task is None or (task.cancelled() and call.cut):
                future.set_exception(StoreClosed(_CUT))
            elif task.cancelled():
                future.cancel()
            elif (error := task.exception()) is not None:
                future.set_exception(error)
            else:
                future.set_result(task.result())

    def _cancel(self, call: _Call) -> None:
        """Cancel a call from any thread (nothing once the loop is closed)."""

        def cancel() -> None:
            if call.task is not None:
                call.task.cancel()

        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing runs
            self._loop.call_soon_threadsafe(cancel)

    def _finish(self, owner: SyncBoundary | None, deadline: float) -> None:
        """Let the calls in flight (of ``owner``, else all) run until ``deadline``.

        Then cut the rest and wait until their records are closed; bounded even when a
        tool blocks the loop thread.
        """
        with self._lock:
            calls = [call for call in self._calls if owner is None or call.owner is owner]
            if not calls or self._stopping:
                return
            grace_s = max(0.0, deadline - time.monotonic())
            timeouts = [boundary._boundary.store_timeout_s for boundary in self._boundaries]
            closing_s = max(timeouts, default=self._store.settings.timeout_s) + _CLOSING_MARGIN_S
            drain = asyncio.run_coroutine_threadsafe(_drain(calls, grace_s, closing_s), self._loop)
        # A tool blocking the loop thread itself would hold the drain: do not wait forever.
        with contextlib.suppress(TimeoutError):
            drain.result(grace_s + closing_s + _SHUTDOWN_S)

    @property
    def async_store(self) -> Store:
        """The async store inside; only its own loop (see :meth:`call`) may use it."""
        return self._store

    def __enter__(self) -> Self:
        try:
            self.call(self._store.__aenter__())
        except BaseException:
            self._shut_down(None)  # the async store closed its pool itself
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self, grace_s: float = DEFAULT_CLOSE_GRACE_S) -> None:
        """Refuse new calls, finish or cancel those in flight, then stop everything.

        Safe to call from any thread, while other threads are calling, and more than once:
        a second call waits until the first one is done, then returns.

        1. From now on, every call (of the store or of its boundaries, from any thread) is
           refused at once with ``StoreClosed``.
        2. The calls in flight may finish until ``grace_s`` seconds have passed; they
           answer as usual.
        3. Those still running are then cancelled: a tool call closes its record with
           ``Failed`` (CALLER_CANCELLED), waiting at most its boundary's store timeout,
           and only then does its waiting thread get ``StoreClosed``; ``ainvoke`` gets it
           too.
        4. The boundaries' own tool threads and the loop's default executor get what is
           left of ``grace_s`` to finish (a tool still running after that cannot be
           stopped: its thread ends when it returns); then the connections and the loop
           thread are closed.

        Args:
            grace_s: how long the calls in flight (and their tool threads) may take.

        Raises:
            InvalidArgument: ``grace_s`` is not a finite number of seconds, 0 or more.
            WrongEventLoop: called from the store's own loop thread (a tool running on the
                loop), where it would wait for itself.

        """
        grace_s = _checked_grace(grace_s)
        if threading.get_ident() == self._thread.ident:
            raise WrongEventLoop(
                "a SyncStore was closed from its own event-loop thread (a tool running on "
                "the loop): close it from another thread"
            )
        with self._lock:
            first = not self._closing
            self._closing = True
        if not first:
            self._closed.wait()  # the first close ends within its own bound
            return
        deadline = time.monotonic() + grace_s
        try:
            self._finish(None, deadline)
            with self._lock:
                boundaries = list(self._boundaries)
            for boundary in boundaries:
                boundary._stop_threads(deadline)
            closing = asyncio.run_coroutine_threadsafe(self._store.aclose(), self._loop)
            try:
                closing.result(_SHUTDOWN_S)
            except TimeoutError:
                closing.cancel()
        finally:
            self._shut_down(deadline)

    def _shut_down(self, deadline: float | None) -> None:
        """Stop the default executor's threads, then the loop thread; idempotent.

        A call still unanswered then (one that ignored its cancellation) is answered with
        ``StoreClosed``: no thread waits on a stopped loop.
        """
        try:
            with self._lock:
                self._closing = True
                if self._stopping:
                    return
                self._stopping = True
            wait_s = _SHUTDOWN_S if deadline is None else deadline - time.monotonic()
            shutdown_within(self._executor, wait_s)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(_SHUTDOWN_S)
            if not self._thread.is_alive():  # else a tool blocks the loop thread itself
                self._loop.close()
            with self._lock:
                left = list(self._calls)
            for call in left:
                self._settle(call, None)
        finally:
            self._closed.set()

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
        deadline: Deadline,
        budget: int | None = None,
        tools: Mapping[str, int | None] | None = None,
    ) -> OpenedRun:
        """Register a run; see :meth:`Store.open_run`.

        ``deadline``: a ``timedelta``, a number of seconds, or a timezone-aware ``datetime``.
        """
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

    def refusals(self, run_id: str, *, limit: int = 100) -> list[Refusal]:
        """Return the run's latest refusals, newest first (see :meth:`Store.refusals`)."""
        return self.call(self._store.refusals(run_id, limit=limit))

    def set_paused(self, paused: bool) -> None:
        """Pause or resume tool execution in the whole namespace."""
        self.call(self._store.set_paused(paused))

    def is_paused(self) -> bool:
        """Tell whether execution is paused."""
        return self.call(self._store.is_paused())

    def decide(
        self,
        run_id: str,
        tool_call_id: str,
        *,
        approve: bool,
        by: str,
        reason: str,
        decision_id: str | None = None,
    ) -> Decision:
        """Approve or deny a governed call waiting for a decision; see Store.decide."""
        return self.call(
            self._store.decide(
                run_id,
                tool_call_id,
                approve=approve,
                by=by,
                reason=reason,
                decision_id=decision_id,
            )
        )

    def pending_approvals(self, *, runs: int = 200, limit: int = 100) -> WaitingCalls:
        """The governed calls waiting for a decision, oldest first (never a SCAN).

        See :func:`eventstore.audit.waiting.pending_approvals`.
        """
        return self.call(pending_approvals(self._store, runs=runs, limit=limit))

    def settle(
        self, run_id: str, tool_call_id: str, *, executed: bool, by: str, evidence: str
    ) -> Settlement:
        """Settle a call whose process died after its dispatch; see Store.settle."""
        return self.call(
            self._store.settle(run_id, tool_call_id, executed=executed, by=by, evidence=evidence)
        )

    def pause_run(self, run_id: str, *, by: str, reason: str) -> bool:
        """Pause one run; see Store.pause_run."""
        return self.call(self._store.pause_run(run_id, by=by, reason=reason))

    def unpause_run(self, run_id: str, *, by: str, reason: str) -> bool:
        """Lift one run's pause; see Store.unpause_run."""
        return self.call(self._store.unpause_run(run_id, by=by, reason=reason))

    def erase_run(
        self, run_id: str, *, by: str, reason: str, wait_s: float = 30.0, force: bool = False
    ) -> Erasure:
        """Erase a run's payloads from Redis, leaving its tombstone; see Store.erase_run.

        The calling thread waits as the store does: up to ``wait_s`` for calls still
        running (``force`` does not wait).
        """
        return self.call(
            self._store.erase_run(run_id, by=by, reason=reason, wait_s=wait_s, force=force)
        )

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

    Raises:
        StoreClosed: the store is closed.

    """

    def __init__(self, store: SyncStore, tools: Mapping[str, ToolSpec], **options: Any) -> None:
        self._store = store
        self._closed = False
        #: Whose calls these are: this boundary, or the one a view was made from.
        self._owner: SyncBoundary = self
        self._boundary = store.call(
            _build(lambda: ToolBoundary(store.async_store, tools, **options))
        )
        with store._lock:
            if not store._closing:
                store._boundaries.append(self)
                return
        self._boundary.close()  # the store began closing meanwhile
        raise StoreClosed("this SyncStore is closed")

    @property
    def store(self) -> SyncStore:
        """The sync store this boundary records its calls in (to read a call's record)."""
        return self._store

    @property
    def stuck_tool_threads(self) -> int:
        """Tool threads still running a tool whose call ended (time limit, cancellation).

        Counted in this boundary's own pool, or, without ``max_tool_threads``, in the
        store loop's default executor (shared by every boundary of the store). When every
        thread of the pool is stuck, a plain tool is refused at once with
        EXECUTION_FAILED (PROJECTION_FAILED for a projector) until some return; see
        :mod:`eventstore.boundary.tool_threads`.
        """
        return self._boundary.stuck_tool_threads

    @property
    def tools(self) -> Mapping[str, ToolSpec]:
        """The tools this boundary runs, by name (see :attr:`ToolBoundary.tools`)."""
        return self._boundary.tools

    @property
    def refusals(self) -> dict[ErrorCode, int]:
        """Calls this boundary refused before any record existed, by code.

        See :attr:`ToolBoundary.refusals`.
        """
        return self._boundary.refusals

    def answering_duplicates(self, on_duplicate: OnDuplicate) -> SyncBoundary:
        """This boundary, answering a used (run, tool call id) as ``on_duplicate`` says.

        See :meth:`ToolBoundary.answering_duplicates`. The view's calls are this
        boundary's: closing this boundary finishes or cancels them too.

        Raises:
            InvalidArgument: ``on_duplicate`` is not ``"refuse"`` or ``"replay"``.

        """
        inner = self._boundary.answering_duplicates(on_duplicate)
        if inner is self._boundary:
            return self
        view = copy.copy(self)
        view._boundary = inner
        return view

    def invoke(self, ctx: RunContext, envelope: ToolEnvelope) -> AgentReply:
        """Run one tool call and return what the agent may see; see ToolBoundary.invoke.

        Raises:
            StoreClosed: the boundary or its store was closed, or was closed while the
                call ran and cancelled it (its record was closed first; see
                :meth:`SyncStore.close`).

        """
        return self._store._run(self._boundary.invoke(ctx, envelope), self._owner)

    def resume(self, ctx: RunContext, tool_call_id: str) -> AgentReply:
        """Go on with a governed call once decided; see ToolBoundary.resume.

        Raises:
            StoreClosed: as for :meth:`invoke`.

        """
        return self._store._run(self._boundary.resume(ctx, tool_call_id), self._owner)

    def reconcile(
        self,
        run_id: str | None = None,
        *,
        grace: timedelta = DEFAULT_RECONCILE_GRACE,
        runs: int = 200,
    ) -> ReconcileReport:
        """Settle the calls left in flight by processes that died; see ToolBoundary.reconcile.

        Raises:
            StoreClosed: as for :meth:`invoke`.

        """
        return self._store._run(
            self._boundary.reconcile(run_id, grace=grace, runs=runs), self._owner
        )

    def invoke_all(self, ctx: RunContext, envelopes: Sequence[ToolEnvelope]) -> list[AgentReply]:
        """Run several calls (one model turn's) concurrently; replies in the calls' order.

        Raises:
            StoreClosed: the boundary or its store was closed, or was closed while the
                calls ran and cancelled them (as for :meth:`invoke`).

        """
        return self._store._run(_gather(self._boundary, ctx, envelopes), self._owner)

    async def ainvoke(self, ctx: RunContext, envelope: ToolEnvelope) -> AgentReply:
        """Await one call from any event loop; it runs on the boundary's own loop.

        For frameworks that start a loop of their own (a ``run_sync`` that calls
        ``asyncio.run``): their loop waits without blocking and no thread is spent. If
        the awaiting task is cancelled, the call is cancelled and its record closed
        before the cancellation is re-raised, as for ``ToolBoundary.invoke``.

        Raises:
            StoreClosed: as for :meth:`invoke`.

        """
        call = self._store._submit(self._boundary.invoke(ctx, envelope), self._owner)
        waiting = asyncio.wrap_future(call.future)
        try:
            return await asyncio.shield(waiting)
        except asyncio.CancelledError:
            # The caller's own cancellation: cancel the call and wait until it has closed
            # its record; a second cancellation only ends this wait.
            self._store._cancel(call)
            with contextlib.suppress(BaseException):
                await waiting
            raise

    def close(self, grace_s: float = DEFAULT_CLOSE_GRACE_S) -> None:
        """Refuse new calls, finish or cancel this boundary's calls, stop its tool threads.

        As :meth:`SyncStore.close` does for the whole store, for this boundary's calls:
        they may finish until ``grace_s`` has passed, the rest are cancelled (records
        closed with CALLER_CANCELLED, their threads answered with ``StoreClosed``); its
        own tool threads get what is left of ``grace_s``. Safe to call more than once and
        from any thread; while the store is closing, it waits until the store is closed.

        Raises:
            InvalidArgument: ``grace_s`` is not a finite number of seconds, 0 or more.

        """
        if self._owner is not self:  # a view closes the boundary it was made from
            self._owner.close(grace_s)
            return
        grace_s = _checked_grace(grace_s)
        store = self._store
        with store._lock:
            if self._closed:
                return
            self._closed = True
            store_closing = store._closing
        if store_closing:
            store._closed.wait()  # the store's close finishes this boundary's calls
            return
        deadline = time.monotonic() + grace_s
        store._finish(self, deadline)
        self._stop_threads(deadline)

    def _stop_threads(self, deadline: float) -> None:
        """Refuse new calls; stop the own tool threads, waiting at most until ``deadline``."""
        store = self._store
        with store._lock:
            self._closed = True
            if self in store._boundaries:
                store._boundaries.remove(self)
        self._boundary.close(wait=True, timeout_s=deadline - time.monotonic())

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
