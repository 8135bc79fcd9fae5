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
are never in flight together (each append awaits the previous one).

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
from redis.typing import EncodableT, KeyT

from eventstore.errors import InvalidArgument
from eventstore.logs import get_logger
from eventstore.wire.deadlines import Deadlines
from eventstore.wire.exchange import BatchStats, Call, pack_evalsha, send_batch
from eventstore.wire.pipe import release_pipe

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
        if pool is None:
            pool = getattr(client, "connection_pool", None)  # a cluster client has none
        self._pool: Any = pool
        pool_size = int(getattr(pool, "max_connections", 0) or 0)
        self._keep = max(0, min(max_lanes, pool_size - max_lanes))
        self._limit_s: float | None = None
        self._limit: Deadlines | None = None
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
        self.stats.calls += 1
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

    async def drain(self) -> None:
        """Wait until every call already made has been answered."""
        while self._in_flight or self._queue:
            await asyncio.gather(*self._in_flight, asyncio.sleep(0), return_exceptions=True)

    async def close(self) -> None:
        """Answer every call already made, then give the kept connection back to the pool."""
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
        if len(self._idle) < self._keep:
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
