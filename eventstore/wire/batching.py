"""Auto-pipelining: script calls issued in the same event-loop turn share one round trip.

Every concurrent ``await batcher.call(script, keys, args)`` is queued; the first call of
a turn schedules a flush with ``loop.call_soon``, and the flush starts as many *lanes*
as the queue needs, at most ``max_lanes``. A lane takes one connection and sends the
queue, a pipeline's worth of calls at a time, as non-transactional pipelines of EVALSHA
commands, until the queue is empty. A fixed ``max_batch`` sizes every pipeline. By
default the size follows the load (:class:`LoadSizing`; a single server's is
:data:`SERVER_SIZING`): while no more calls are outstanding (queued or being sent) than
one pipeline holds (8), they go as one; beyond that, pipelines take a quarter of the
calls outstanding, from 4 up to 8, so that about four are in flight and Redis runs one
while the client reads and prepares another. Calls queued while every lane is busy go
with the next pipeline a lane sends.
The batcher keeps the connections its lanes used (at most ``max_lanes``) for the next
lanes, and gives them back to the pool when it is closed: taking one from the pool and
giving it back costs more than the rest of a round trip. While it holds a connection,
its replies are read by a :class:`~eventstore.wire.pipe.Pipe`, not by redis-py. A call made
while nothing is in flight skips the queue: it is sent at once from its caller's own
task, on a kept connection, so one call at a time pays for no flush, lane task or future
(nor an extra turn of the loop, unless something else is ready to run in this one). Each
caller gets its own reply or its own exception: one failing script never fails its
neighbours. No task or future is ever left with an exception nobody retrieves: every
future is settled by the lane that took it or cancelled with its caller, and every
lane's end is retrieved when it finishes.

Ordering: a pipeline carries its calls in the order they were made. Pipelines of
different lanes may run in either order: harmless, because two events of one invocation
are in flight together only as a :class:`Sent` pair, on one connection.

Two ordered calls of one invocation (the raw response, then the outcome) may share one
wait: :meth:`ScriptBatcher.send` writes the first at once and answers nothing, and
:meth:`Sent.then` writes the second behind it on the same connection (Redis runs a
connection's commands in order) and waits for both answers together. While nothing else
is in flight the first is written from its caller's own task, on a kept connection, as
a lone call is, and is in the kernel's hands when ``send`` returns: Redis runs it even if
this process dies next. When it cannot be written out whole at once (no pipe, the
connection lost, a payload larger than the socket's buffer, a script this batcher has
not yet seen the server run: NOSCRIPT would hold it back until the pair is re-sent) or
other calls are in flight (it then goes with them, through the lanes), it is answered
before anything follows it.

NOSCRIPT (a restarted server, ``SCRIPT FLUSH``) is answered by loading the script and
re-sending only the commands that were refused: a refused EVALSHA did not run, so the
re-send cannot apply anything twice. The normal path costs no extra round trip (no
SCRIPT EXISTS). Connection errors and timeouts are retried with the client's ``Retry``,
as redis-py retries a pipeline: the connection is dropped and the whole pipeline is sent
again. That is only safe for idempotent scripts, which the store's are (by event id: a
re-sent event is answered "applied").

On a Redis Cluster, :class:`~eventstore.wire.cluster_batching.ClusterScriptBatcher` runs
one :class:`ScriptBatcher` per primary, each over that node's own connections (its
``pool``), and routes each call by its slot: every guarantee above holds per node, but
for retries: a node's connections retry nothing, and the cluster batcher re-sends each
call cut off or redirected, alone, on the node that owns its slot then. A cluster
client given to :class:`ScriptBatcher` itself, with no ``pool``, is not batched:
each call goes alone through redis-py's cluster routing.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, cast

from redis.asyncio import Redis
from redis.asyncio.connection import Connection
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.typing import EncodableT, KeyT

from eventstore.errors import InvalidArgument
from eventstore.logs import get_logger
from eventstore.wire.deadlines import Deadlines
from eventstore.wire.exchange import (
    BatchStats,
    Call,
    pack_evalsha,
    reloaded,
    retried,
    send_batch,
    timed_out,
)
from eventstore.wire.pipe import pipe_for, release_pipe

log = get_logger("canon.batching")


@dataclass(frozen=True, slots=True)
class LoadSizing:
    """How a batcher sizes its pipelines by the calls outstanding (queued or being sent).

    Up to ``most`` calls outstanding go as one pipeline; beyond that, each pipeline takes
    ``1 / pipelines`` of them, at least ``fewest`` and at most ``most``, so that about
    ``pipelines`` are in flight.
    """

    pipelines: int
    fewest: int
    most: int

    def __post_init__(self) -> None:
        if self.pipelines < 1 or not 1 <= self.fewest <= self.most:
            raise InvalidArgument("a load sizing needs pipelines >= 1 and 1 <= fewest <= most")


#: A single server's: at most 8 commands per pipeline, about four in flight. A larger turn
#: is split so that Redis runs one pipeline while the client reads and prepares another;
#: with 16 callers, two full pipelines of 8 would leave Redis and the client taking turns
#: (the measurements that chose these are in docs/performance.md).
SERVER_SIZING: Final = LoadSizing(pipelines=4, fewest=4, most=8)
#: Most commands per pipeline on a single server.
DEFAULT_MAX_BATCH: Final = SERVER_SIZING.most
#: Most pipelines in flight at once (one connection each).
DEFAULT_MAX_LANES: Final = 8


class ConnectionSource(Protocol):
    """Where a batcher takes its connections from: a client's pool, or one cluster node's."""

    async def get_connection(self) -> Connection:
        """A connection for one lane (maybe not connected yet: the first send connects it)."""
        ...

    async def release(self, connection: Connection) -> None:
        """Take ``connection`` back."""
        ...


async def call_script(script: AsyncScript, keys: Sequence[KeyT], args: Iterable[EncodableT]) -> Any:
    """Run ``script`` on its own client, unbatched (the signature of :meth:`ScriptBatcher.call`)."""
    return await script(keys=keys, args=args)


class ScriptBatcher:
    """Coalesces concurrent script calls on one client into pipelines.

    Meant for idempotent scripts only (see the module doc: a pipeline cut off by a
    connection error is sent again whole).

    Args:
        client: the asyncio client; a cluster client is not batched unless ``pool`` is
            given (see module doc).
        max_batch: commands per pipeline, at most; None (the default) sizes each pipeline
            by the calls outstanding, as ``sizing`` says (see the module doc).
        max_lanes: most pipelines in flight at once, each on its own pooled connection.
        pool: where the lanes take their connections (default: the client's pool); one
            cluster node's, for the cluster batcher's per-node batchers.
        sizing: how pipelines follow the load when ``max_batch`` is None (default: a
            single server's).

    """

    def __init__(
        self,
        client: Redis,
        *,
        max_batch: int | None = None,
        max_lanes: int = DEFAULT_MAX_LANES,
        pool: ConnectionSource | None = None,
        sizing: LoadSizing = SERVER_SIZING,
    ) -> None:
        if (max_batch is not None and max_batch < 1) or max_lanes < 1:
            raise InvalidArgument("max_batch and max_lanes must be at least 1")
        self._client = client
        self._by_load = max_batch is None
        self._sizing = sizing
        self._max_batch = sizing.most if max_batch is None else max_batch
        self._sending = 0  # calls in pipelines written and not yet answered
        self._max_lanes = max_lanes
        self._enabled = pool is not None or isinstance(client, Redis)
        self._queue: deque[Call] = deque()
        self._flush_scheduled = False
        self._lanes = 0
        self._connected = 0  # lanes holding a connection
        self._in_flight: set[asyncio.Task[None]] = set()
        # Connections kept between calls: taking one from the pool and giving it back
        # costs more than the rest of a round trip. At most one per lane, and never more
        # than the pool has beyond a full set of lanes, so the store's other commands
        # always find connections.
        self._idle: list[Connection] = []
        self._closed = False
        if pool is None:
            pool = getattr(client, "connection_pool", None)  # a cluster client has none
        self._pool: Any = pool
        pool_size = int(getattr(pool, "max_connections", 0) or 0)
        self._keep = max(0, min(max_lanes, pool_size - max_lanes))
        self._limit_s: float | None = None
        self._limit: Deadlines | None = None
        # Scripts this batcher has seen the server run: a first call written ahead of its
        # answer must not meet NOSCRIPT (it would run only once the pair is re-sent).
        self._loaded: set[str] = set()
        self.stats = BatchStats()

    @property
    def batching(self) -> bool:
        """Whether calls are coalesced (False for a cluster client: each goes alone)."""
        return self._enabled

    def __repr__(self) -> str:
        s = self.stats
        return (
            f"<ScriptBatcher calls={s.calls} round_trips={s.round_trips} "
            f"reloads={s.reloads} largest_batch={s.largest_batch}>"
        )

    async def call(
        self, script: AsyncScript, keys: Sequence[KeyT], args: Iterable[EncodableT]
    ) -> Any:
        """Run ``script`` with ``keys`` and ``args``, sharing a round trip with its turn.

        Returns:
            The script's reply, exactly as ``EVALSHA`` returns it.

        Raises:
            redis.exceptions.RedisError: this call's own error reply, or the error that
                ended its pipeline (after redis-py's retries).

        """
        stats = self.stats
        stats.calls += 1
        stats.waits += 1
        if not self._enabled:
            return await script(keys=keys, args=args)
        loop = asyncio.get_running_loop()
        packed_args = (len(keys), *keys, *args)
        # Packed before the future exists: an argument that cannot be sent leaves nothing.
        packed = pack_evalsha(script.sha, packed_args)
        future: asyncio.Future[Any] = loop.create_future()
        call = Call(script, packed_args, packed, future)
        self._queue.append(call)
        if not self._lanes and not self._flush_scheduled:
            return await self._lead(call, loop)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return await _answer(future)

    async def send(
        self, script: AsyncScript, keys: Sequence[KeyT], args: Iterable[EncodableT]
    ) -> Sent:
        """Write ``script``'s call now; its answer comes with the next call's (:meth:`Sent.then`).

        For the first of two ordered calls of one invocation: see the module doc for when
        it is written out at once (nothing else in flight) and when it is answered here,
        before the caller goes on. Either way the caller must end the pair with
        :meth:`Sent.then` or :meth:`Sent.answer`.

        Raises:
            redis.exceptions.RedisError: the call was answered here and failed (its own
                error reply, or the connection's after the client's retries).

        """
        self.stats.calls += 1
        if not self._enabled:
            self.stats.waits += 1
            return Sent(self, None, replies=[await script(keys=keys, args=args)])
        loop = asyncio.get_running_loop()
        packed_args = (len(keys), *keys, *args)
        call = Call(
            script, packed_args, pack_evalsha(script.sha, packed_args), loop.create_future()
        )
        if self._lanes or self._flush_scheduled or _cancel_pending(loop):
            # Others in flight: it goes with them, and what follows it waits for its answer.
            self._queue.append(call)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                loop.call_soon(self._flush)
            return Sent(self, call)
        self._lanes += 1  # held as a lone call is: calls made meanwhile go to lanes
        try:
            connection = self._idle.pop() if self._idle else await self._connection()
        except BaseException:
            self._lanes -= 1
            self._flush_if_waiting()
            raise
        self._connected += 1
        sent = Sent(self, call, connection)
        pipe = pipe_for(connection) if script.sha in self._loaded else None
        if pipe is not None:
            try:
                call.future = pipe.send([call.packed])
            except RedisConnectionError:
                pass  # lost while it was kept: answered below, on a fresh connection
            else:
                sent._written = True
                self.stats.round_trips += 1
                if pipe.flushed():
                    return sent
        # Not in the kernel's hands yet, or a script the server may not hold: answered
        # before the caller goes on.
        try:
            await sent.settle_first()
        except BaseException:
            await sent.release()
            raise
        self._loaded.add(script.sha)
        return sent

    async def drain(self) -> None:
        """Wait until every call already made has been answered."""
        while self._in_flight or self._queue:
            await asyncio.gather(*self._in_flight, asyncio.sleep(0), return_exceptions=True)

    async def close(self) -> None:
        """Answer every call already made, then give the kept connection back to the pool."""
        self._closed = True  # a lane still running gives its connection back, keeps none
        await self.drain()
        while self._idle:
            await self._release(self._idle.pop())

    async def _lead(self, call: Call, loop: asyncio.AbstractEventLoop) -> Any:
        """Send the first call made while nothing is in flight from its caller's own task.

        If anything else is ready to run in this turn of the loop, the caller lets it run
        first (one ``sleep(0)``), so that calls made in the same turn still share a round
        trip: if any came, they and this call go to lanes as usual. So does a caller
        with a cancellation requested: it arrives at that ``sleep(0)``, before anything
        is sent. Otherwise no other call can join before the loop next polls, so the
        call is sent at once: one call at a time pays for no extra turn of the loop.
        Alone, it goes with no flush and no lane task.
        """
        self._lanes += 1  # counted as a lane: calls made meanwhile queue behind it
        if _turn_has_more(loop) or _cancel_pending(loop):
            try:
                await asyncio.sleep(0)
            except BaseException:
                self._lanes -= 1
                call.future.cancel()  # never sent: the queue skips it
                self._flush_if_waiting()
                raise
        if len(self._queue) > 1 or self._queue[0] is not call:
            self._lanes -= 1  # company came: every queued call goes to the lanes
            self._flush_if_waiting()
            return await _answer(call.future)
        self._queue.popleft()
        try:
            connection = self._idle.pop() if self._idle else await self._connection()
        except BaseException:
            self._lanes -= 1
            self._flush_if_waiting()
            raise
        self._connected += 1
        try:
            (reply,) = await send_batch([call], connection, self._limit, self.stats)
        except BaseException:
            # Cut off mid-exchange (the caller cancelled, or Redis failed): whatever was
            # left unread must not answer the next call on this connection.
            await connection.disconnect(nowait=True)
            raise
        finally:
            self._lanes -= 1
            self._connected -= 1
            self._flush_if_waiting()
            if not self._kept(connection):
                await self._release(connection)
        if isinstance(reply, Exception):
            raise reply
        return reply

    def _flush_if_waiting(self) -> None:
        """Start lanes for calls still queued, if no lane or flush will take them."""
        queue = self._queue
        waiting = queue and not self._lanes and any(not call.future.done() for call in queue)
        if waiting and not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _kept(self, connection: Connection) -> bool:
        """Keep a lane's connection for the next lane if the pool can spare it (True).

        False: it must go back to the pool. A pool no larger than the lanes could be
        emptied by the batcher alone, and any other command of the store would wait for
        it: nothing is kept from such a pool. (Not a coroutine: keeping, the usual case,
        awaits nothing.)
        """
        if len(self._idle) < self._keep and not self._closed:
            self._idle.append(connection)
            return True
        return False

    async def _release(self, connection: Connection) -> None:
        connection.socket_timeout = self._limit_s
        if not release_pipe(connection):  # replies still due: it cannot be read as before
            await connection.disconnect(nowait=True)
        await self._pool.release(connection)

    def _flush(self) -> None:
        self._flush_scheduled = False
        wanted = -(-len(self._queue) // self._pipeline_size())
        loop = asyncio.get_running_loop()
        for _ in range(min(wanted, self._max_lanes - self._lanes)):
            self._lanes += 1
            task = loop.create_task(self._lane())
            self._in_flight.add(task)
            task.add_done_callback(self._lane_done)

    def _lane_done(self, task: asyncio.Task[None]) -> None:
        """Forget a finished lane and retrieve how it ended, so nothing is left unretrieved.

        A lane settles every call it takes and swallows their errors; only a cancellation
        (the loop shutting down) ends one early. Anything else would be a bug here: it is
        logged by type, never left for the garbage collector to report.
        """
        self._in_flight.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            log.error("batch_lane_failed", error=type(error).__name__)

    def _pipeline_size(self) -> int:
        """How many calls the next pipeline takes, at most (see the module doc)."""
        outstanding = len(self._queue) + self._sending
        if not self._by_load or outstanding <= self._max_batch:
            return self._max_batch
        sizing = self._sizing
        return min(self._max_batch, max(sizing.fewest, -(-outstanding // sizing.pipelines)))

    def _take(self) -> list[Call]:
        """The next pipeline: up to :meth:`_pipeline_size` queued calls still awaited."""
        queue, batch, size = self._queue, list[Call](), self._pipeline_size()
        while queue and len(batch) < size:
            call = queue.popleft()
            if not call.future.done():  # a caller cancelled before sending never reaches Redis
                batch.append(call)
        return batch

    async def _lane(self) -> None:
        """Send pipelines on one connection until the queue is empty, then give it back.

        The connection comes first and the calls after: a lane waiting for the pool holds
        no calls, so a small pool shared with busy lanes delays nobody.
        """
        connection: Connection | None = None
        try:
            while self._queue:
                if connection is None:
                    if self._idle:
                        connection = self._idle.pop()
                    else:
                        try:
                            connection = await self._connection()
                        except Exception as exc:
                            if self._connected:  # the lanes that have one serve the queue
                                return
                            _settle_failed(self._take(), exc)  # no connection: it fails
                            continue
                    self._connected += 1
                batch = self._take()
                if batch:
                    await self._send(batch, connection, self._limit)
        finally:
            # Counted out before any await: a call queued from now on starts a new lane.
            self._lanes -= 1
            if connection is not None:
                self._connected -= 1
            # The last lane leaves nothing behind (it only can if it was cancelled).
            self._flush_if_waiting()
            if connection is not None and not self._kept(connection):
                await self._release(connection)

    async def _connection(self) -> Connection:
        """A connection from the pool, its socket timeout taken over by the batcher."""
        connection = cast(Connection, await self._pool.get_connection())
        # The batcher bounds each exchange, writes and reads together, with one timer of
        # this length; with its own timeout set, redis-py would wrap every write in a task
        # of its own (wait_for) and every read in a timer.
        self._limit_s, connection.socket_timeout = connection.socket_timeout, None
        if self._limit_s and (self._limit is None or self._limit.seconds != self._limit_s):
            self._limit = Deadlines(self._limit_s)
        return connection

    async def _send(
        self, batch: list[Call], connection: Connection, limit: Deadlines | None
    ) -> None:
        self._sending += len(batch)
        try:
            replies = await send_batch(batch, connection, limit, self.stats)
        except BaseException as exc:
            self._sending -= len(batch)
            # Whatever was left unread must not answer the next pipeline: drop it (the
            # next send reconnects).
            await connection.disconnect(nowait=True)
            _settle_failed(batch, exc)
            if not isinstance(exc, Exception):
                raise
            return
        self._sending -= len(batch)
        for call, reply in zip(batch, replies, strict=True):
            if call.future.done():
                continue
            if isinstance(reply, Exception):
                call.future.set_exception(reply)
            else:
                call.future.set_result(reply)


def _turn_has_more(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether anything else may still run in this turn of ``loop``, before its next poll.

    asyncio's own loops keep what is ready to run in ``_ready``; a loop without it
    (uvloop) is taken to have more, which costs one ``sleep(0)`` and nothing else.
    """
    ready = getattr(loop, "_ready", None)
    return ready is None or bool(ready)


def _cancel_pending(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the running task of ``loop`` has a cancellation requested."""
    task = asyncio.current_task(loop)
    return task is not None and task.cancelling() > 0


class SentCall(Protocol):
    """A script call written ahead of its answer (:class:`Sent`, or a cluster's)."""

    async def then(
        self, script: AsyncScript, keys: Sequence[KeyT], args: Iterable[EncodableT]
    ) -> tuple[Any, Any]:
        """Send the call that follows it; both replies, in order."""
        ...

    async def answer(self) -> Any:
        """Its reply alone, when no call follows it."""
        ...


class ScriptCalls(Protocol):
    """What the store's scripts ask of a batcher: one server's or a cluster's.

    :class:`ScriptBatcher` (and :class:`~eventstore.wire.replication.ReplicaAcknowledgedCalls`)
    and :class:`~eventstore.wire.cluster_batching.ClusterScriptBatcher` both keep it.
    """

    stats: BatchStats

    async def call(
        self, script: AsyncScript, keys: Sequence[KeyT], args: Iterable[EncodableT]
    ) -> Any:
        """Run ``script``, coalesced with the calls made meanwhile; its reply."""
        ...

    async def send(
        self, script: AsyncScript, keys: Sequence[KeyT], args: Iterable[EncodableT]
    ) -> SentCall:
        """Write ``script``'s call now, to be answered with the call that follows it."""
        ...

    async def drain(self) -> None:
        """Wait until every call already made has been answered."""
        ...

    async def close(self) -> None:
        """Answer every call already made, then give back the connections it keeps."""
        ...


class Sent:
    """The first of two ordered script calls of one invocation, written ahead of its answer.

    Made by :meth:`ScriptBatcher.send`; ended by :meth:`then` (the call that follows it,
    both answered together) or :meth:`answer` (its answer alone). Until then it may hold
    one of the batcher's connections, as a lone call in flight does.
    """

    __slots__ = ("_batcher", "_call", "_connection", "_ended", "_replies", "_written")

    def __init__(
        self,
        batcher: ScriptBatcher,
        call: Call | None,
        connection: Connection | None = None,
        *,
        replies: list[Any] | None = None,
    ) -> None:
        self._batcher = batcher
        self._call = call
        self._connection = connection
        # Its replies once read; until then, on a held connection, call.future is the
        # pipe's exchange (written) or the caller's own (not written yet).
        self._replies = replies
        self._written = False  # set by ScriptBatcher.send once the pipe took the call
        self._ended = False

    async def then(
        self, script: AsyncScript, keys: Sequence[KeyT], args: Iterable[EncodableT]
    ) -> tuple[Any, Any]:
        """Send the call that follows this one; return both replies, in order.

        On a held connection the second is written behind the first and both answers are
        waited for together, within the batcher's time limit; a connection error or a
        timeout sends whatever is unanswered again, in order, as the client's ``Retry``
        says (the store's scripts are idempotent by event id), and NOSCRIPT reloads and
        re-sends the refused calls in order. Otherwise the first's answer is waited for
        and the second goes as any call does (:meth:`ScriptBatcher.call`).

        Raises:
            redis.exceptions.RedisError: an error reply (the first's before the second's),
                or the connection's after the retries.

        """
        self._end()
        batcher = self._batcher
        if self._connection is None:  # queued with others, or not batched
            if self._replies is None:
                assert self._call is not None
                if not self._call.future.done():
                    batcher.stats.waits += 1
                first = await _answer(self._call.future)
            else:
                first = _reply(self._replies)
            return first, await batcher.call(script, keys, args)
        loop = asyncio.get_running_loop()
        packed_args = (len(keys), *keys, *args)
        second = Call(
            script, packed_args, pack_evalsha(script.sha, packed_args), loop.create_future()
        )
        replies = await self._ordered(second)
        return _reply(replies[:1]), _reply(replies[1:])

    async def answer(self) -> Any:
        """Wait for this call's reply alone, when no call will follow it.

        Raises:
            redis.exceptions.RedisError: its error reply, or the connection's after the
                client's retries.

        """
        self._end()
        if self._connection is not None:
            try:
                await self.settle_first()
            finally:
                await self.release()
        elif self._replies is None:
            assert self._call is not None
            self._batcher.stats.waits += 1
            return await _answer(self._call.future)
        assert self._replies is not None
        return _reply(self._replies)

    def _end(self) -> None:
        if self._ended:
            raise RuntimeError("a sent call is followed or answered once")
        self._ended = True

    async def settle_first(self) -> None:
        """Read (or send, if it was not written) the first call's reply on the held connection."""
        call, connection = self._call, self._connection
        assert call is not None and connection is not None
        if self._replies is not None:
            return
        batcher = self._batcher
        stats, limit = batcher.stats, batcher._limit
        stats.waits += 1
        try:
            if not self._written:
                replies = await send_batch([call], connection, limit, stats)
            else:
                try:
                    replies = await _within(call.future, limit, connection)
                except Exception as exc:  # the Retry decides what is retried
                    _forget(call.future)
                    replies = await retried(exc, connection, [call.packed], limit, stats)
                if any(isinstance(reply, NoScriptError) for reply in replies):
                    replies = await reloaded([call], replies, connection, limit, stats)
        except BaseException:
            await connection.disconnect(nowait=True)  # replies may still be due: never reused
            if self._written:
                _forget(call.future)
            raise
        self._replies = replies

    async def _ordered(self, second: Call) -> list[Any]:
        """Both replies: the second written behind the first on the held connection."""
        first, connection = self._call, self._connection
        assert first is not None and connection is not None
        batcher = self._batcher
        stats, limit = batcher.stats, batcher._limit
        stats.calls += 1
        stats.waits += 1
        stats.round_trips += 1
        try:
            if _cancel_pending(asyncio.get_running_loop()):
                await asyncio.sleep(0)  # a cancellation requested arrives before the second
            try:
                if self._replies is not None:  # answered already: the second goes alone
                    replies = [
                        *self._replies,
                        *await send_batch([second], connection, limit, stats, reload=False),
                    ]
                else:
                    pipe = pipe_for(connection)
                    if pipe is None:
                        raise RedisConnectionError("Connection closed by server.")
                    later = pipe.send([second.packed])
                    done = await _within(later, limit, connection)
                    replies = [*first.future.result(), *done]
            except Exception as exc:  # the Retry decides what is retried, in order
                answered = self._replies if self._replies is not None else _settled(first.future)
                unanswered = [second] if answered is not None else [first, second]
                again = await retried(exc, connection, [c.packed for c in unanswered], limit, stats)
                replies = [*(answered or []), *again]
            if any(isinstance(reply, NoScriptError) for reply in replies):
                replies = await reloaded([first, second], replies, connection, limit, stats)
        except BaseException:
            await connection.disconnect(nowait=True)  # replies may still be due: never reused
            if self._written:
                _forget(first.future)
            raise
        finally:
            await self.release()
        return replies

    async def release(self) -> None:
        """Give the held connection back to the batcher (kept, or to the pool)."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        batcher = self._batcher
        batcher._lanes -= 1
        batcher._connected -= 1
        batcher._flush_if_waiting()
        if not batcher._kept(connection):
            await batcher._release(connection)


async def _within(
    future: asyncio.Future[list[Any]], limit: Deadlines | None, connection: Connection
) -> list[Any]:
    """Await an exchange's replies within ``limit``; past it, drop the connection."""
    if limit is None:
        return await future
    try:
        return await limit.run(future)
    except TimeoutError:
        raise await timed_out(connection) from None


def _settled(future: asyncio.Future[list[Any]] | None) -> list[Any] | None:
    """The replies of an exchange that was answered, else None (its error retrieved)."""
    if future is None:
        return None
    _forget(future)
    if not future.done() or future.cancelled() or future.exception() is not None:
        return None
    return future.result()


def _forget(future: asyncio.Future[Any] | None) -> None:
    """Retrieve the error of a failed exchange, now or when it comes.

    A dropped connection fails its exchanges a turn later: nothing is left unretrieved.
    """
    if future is None:
        return
    if future.done():
        _retrieve(future)
    else:
        future.add_done_callback(_retrieve)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _reply(replies: list[Any]) -> Any:
    """The one reply of ``replies``; an error reply raised."""
    (reply,) = replies
    if isinstance(reply, Exception):
        raise reply
    return reply


async def _answer(future: asyncio.Future[Any]) -> Any:
    """Wait for a queued call's reply; a caller who leaves retrieves what came meanwhile."""
    try:
        return await future
    except asyncio.CancelledError:
        if future.done() and not future.cancelled():
            future.exception()  # retrieved: the reply came, its caller left
        raise


def _settle_failed(batch: list[Call], exc: BaseException) -> None:
    """Fail every call of ``batch`` still waiting: cancelled with its lane, else with ``exc``."""
    for call in batch:
        if call.future.done():
            continue
        if isinstance(exc, Exception):
            call.future.set_exception(exc)
        else:
            call.future.cancel()
