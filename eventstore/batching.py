"""Auto-pipelining: script calls issued in the same event-loop turn share one round trip.

Every concurrent ``await batcher.call(script, keys, args)`` is queued; the first call of
a turn schedules a flush with ``loop.call_soon``, and the flush starts as many *lanes* as
the queue needs, at most ``max_lanes``. A lane takes one pooled connection and sends the
queue, ``max_batch`` calls at a time, as non-transactional pipelines of EVALSHA
commands, until the queue is empty; then it gives the connection back. Under load a lane
keeps its connection from one pipeline to the next (taking one from the pool and giving
it back costs more than the rest of a round trip), and calls queued while every lane is
busy go with the next pipeline a lane sends. Each caller gets its own reply or its own
exception: one failing script never fails its neighbours. No task or future is ever left
with an exception nobody retrieves: every future is settled by the lane that took it or
cancelled with its caller, and every lane's end is retrieved when it finishes.

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

Redis Cluster clients are not batched: a cluster pipeline splits by node and retries
per node, so :class:`ScriptBatcher` sends each call on its own there.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import hiredis
from redis.asyncio import Redis
from redis.asyncio.connection import Connection
from redis.commands.core import AsyncScript
from redis.exceptions import DataError, NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT, KeyT

from eventstore.errors import InvalidArgument
from eventstore.logs import get_logger
from eventstore.replies import reply_text

log = get_logger("canon.batching")

#: Most commands per pipeline. A larger turn is split so that several pipelines are in
#: flight: Redis runs one while the client reads and prepares another (the measurements
#: that chose 8 are in docs/performance.md).
DEFAULT_MAX_BATCH: Final = 8
#: Most pipelines in flight at once (one connection each).
DEFAULT_MAX_LANES: Final = 8


async def call_script(script: AsyncScript, keys: Sequence[KeyT], args: Iterable[EncodableT]) -> Any:
    """Run ``script`` on its own client, unbatched (the signature of :meth:`ScriptBatcher.call`)."""
    return await script(keys=keys, args=args)


@dataclass(slots=True)
class BatchStats:
    """Counters of one batcher, for tests and the benchmark.

    Attributes:
        calls: script calls made through the batcher.
        round_trips: pipelines and single EVALSHA commands sent (re-sends included).
        resends: batches sent again whole after a connection error or a timeout.
        reloads: scripts loaded again after the server answered NOSCRIPT.
        largest_batch: the most calls one round trip carried.

    """

    calls: int = 0
    round_trips: int = 0
    resends: int = 0
    reloads: int = 0
    largest_batch: int = 0


@dataclass(slots=True)
class _Call:
    script: AsyncScript
    args: tuple[EncodableT, ...]
    packed: bytes
    future: asyncio.Future[Any]


def pack_evalsha(sha: str, args: tuple[EncodableT, ...]) -> bytes:
    """Return one EVALSHA command in the Redis protocol (``args`` starts with numkeys).

    hiredis packs in C; redis-py's asyncio connection packs in Python, which costs more
    than the rest of an append.

    Raises:
        redis.exceptions.DataError: an argument is not bytes, str, int or float.

    """
    try:
        return cast(bytes, hiredis.pack_command(("EVALSHA", sha, *args)))  # type: ignore[arg-type]
    except TypeError as exc:
        raise DataError(str(exc)) from None


class ScriptBatcher:
    """Coalesces concurrent script calls on one client into pipelines.

    Meant for idempotent scripts only (see the module doc: a pipeline cut off by a
    connection error is sent again whole).

    Args:
        client: the asyncio client; a cluster client is not batched (see module doc).
        max_batch: most commands per pipeline.
        max_lanes: most pipelines in flight at once, each on its own pooled connection.

    """

    def __init__(
        self,
        client: Redis,
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_lanes: int = DEFAULT_MAX_LANES,
    ) -> None:
        if max_batch < 1 or max_lanes < 1:
            raise InvalidArgument("max_batch and max_lanes must be at least 1")
        self._client = client
        self._max_batch = max_batch
        self._max_lanes = max_lanes
        self._enabled = isinstance(client, Redis)
        self._queue: deque[_Call] = deque()
        self._flush_scheduled = False
        self._lanes = 0
        self._connected = 0  # lanes holding a connection
        self._in_flight: set[asyncio.Task[None]] = set()
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
        self._queue.append(_Call(script, packed_args, packed, future))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                future.exception()  # retrieved: the reply came, its caller left
            raise

    async def drain(self) -> None:
        """Wait until every call already made has been answered."""
        while self._in_flight or self._queue:
            await asyncio.gather(*self._in_flight, asyncio.sleep(0), return_exceptions=True)

    def _flush(self) -> None:
        self._flush_scheduled = False
        wanted = -(-len(self._queue) // self._max_batch)
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

    def _take(self) -> list[_Call]:
        """The next pipeline: up to ``max_batch`` queued calls whose callers still wait."""
        queue, batch = self._queue, list[_Call]()
        while queue and len(batch) < self._max_batch:
            call = queue.popleft()
            if not call.future.done():  # a caller cancelled before sending never reaches Redis
                batch.append(call)
        return batch

    async def _lane(self) -> None:
        """Send pipelines on one connection until the queue is empty, then give it back.

        The connection comes first and the calls after: a lane waiting for the pool holds
        no calls, so a small pool shared with busy lanes delays nobody.
        """
        pool = self._client.connection_pool
        connection: Connection | None = None
        limit_s: float | None = None
        try:
            while self._queue:
                if connection is None:
                    try:
                        connection = cast(Connection, await pool.get_connection())  # type: ignore[no-untyped-call]
                    except Exception as exc:
                        if self._connected:  # the lanes that have one serve the queue
                            return
                        _settle_failed(self._take(), exc)  # no connection: this pipeline fails
                        continue
                    self._connected += 1
                    # The lane bounds each exchange, writes and reads together, with one
                    # timer of this length; with its own timeout set, redis-py would wrap
                    # every write in a task of its own (wait_for) and every read in a timer.
                    limit_s, connection.socket_timeout = connection.socket_timeout, None
                batch = self._take()
                if batch:
                    await self._send(batch, connection, limit_s)
        finally:
            # Counted out before any await: a call queued from now on starts a new lane.
            self._lanes -= 1
            if connection is not None:
                self._connected -= 1
            # The last lane leaves nothing behind (it only can if it was cancelled).
            waiting = not self._lanes and any(not call.future.done() for call in self._queue)
            if waiting and not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)
            if connection is not None:
                connection.socket_timeout = limit_s
                await pool.release(connection)

    async def _send(
        self, batch: list[_Call], connection: Connection, limit_s: float | None
    ) -> None:
        try:
            replies = await self._execute(batch, connection, limit_s)
        except BaseException as exc:
            # Whatever was left unread must not answer the next pipeline: drop it (the
            # next send reconnects).
            await connection.disconnect(nowait=True)
            _settle_failed(batch, exc)
            if not isinstance(exc, Exception):
                raise
            return
        for call, reply in zip(batch, replies, strict=True):
            if call.future.done():
                continue
            if isinstance(reply, Exception):
                call.future.set_exception(reply)
            else:
                call.future.set_result(reply)

    async def _execute(
        self, batch: list[_Call], connection: Connection, limit_s: float | None
    ) -> list[Any]:
        replies = await self._round_trip(batch, connection, limit_s)
        refused = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if refused:
            scripts = {id(batch[i].script): batch[i].script for i in refused}
            for script in scripts.values():
                # On the lane's own connection: with a small pool held by busy lanes, one
                # more connection could be long in coming.
                script.sha = await connection.retry.call_with_retry(
                    lambda: _load(connection, script.script, limit_s),  # noqa: B023 - awaited here
                    lambda _error: connection.disconnect(),
                )
                self.stats.reloads += 1
            again = [batch[i] for i in refused]
            for call in again:
                call.packed = pack_evalsha(call.script.sha, call.args)
            resent = await self._round_trip(again, connection, limit_s)
            for i, reply in zip(refused, resent, strict=True):
                replies[i] = reply
        return replies

    async def _round_trip(
        self, batch: list[_Call], connection: Connection, limit_s: float | None
    ) -> list[Any]:
        """Send ``batch`` on ``connection`` within ``limit_s`` seconds; errors come back in place.

        Connection errors and timeouts are retried with the connection's ``Retry``
        (the client's), as redis-py retries a pipeline: the connection is dropped and the
        whole batch is sent again on a fresh one.
        """
        stats = self.stats
        stats.largest_batch = max(stats.largest_batch, len(batch))
        packed = [call.packed for call in batch]
        attempts = 0

        async def exchange() -> list[Any]:
            nonlocal attempts
            attempts += 1
            stats.round_trips += 1
            stats.resends += attempts > 1
            return await _exchange(connection, packed, limit_s)

        replies: list[Any] = await connection.retry.call_with_retry(
            exchange, lambda _error: connection.disconnect()
        )
        return replies


async def _load(connection: Connection, source: EncodableT, limit_s: float | None) -> str:
    """``SCRIPT LOAD`` on ``connection``; return the script's SHA."""
    command = cast(bytes, hiredis.pack_command(("SCRIPT", "LOAD", source)))  # type: ignore[arg-type]
    (sha,) = await _exchange(connection, [command], limit_s)
    if isinstance(sha, Exception):
        raise sha
    return reply_text(sha)


def _settle_failed(batch: list[_Call], exc: BaseException) -> None:
    """Fail every call of ``batch`` still waiting: cancelled with its lane, else with ``exc``."""
    for call in batch:
        if call.future.done():
            continue
        if isinstance(exc, Exception):
            call.future.set_exception(exc)
        else:
            call.future.cancel()


async def _exchange(
    connection: Connection, packed: list[bytes], limit_s: float | None
) -> list[Any]:
    """Write every command, then read one reply per command (all of them, always).

    One timer bounds the whole exchange (``None``: unbounded), where redis-py would start
    a task for the write and arm a timer per reply.
    """
    replies: list[Any] = []
    try:
        async with asyncio.timeout(limit_s):
            await connection.send_packed_command(packed, check_health=False)
            for _ in packed:
                try:
                    replies.append(await connection.read_response(timeout=math.inf))
                except ResponseError as exc:
                    replies.append(exc)
    except TimeoutError:
        # As redis-py does for its own timeouts: the connection is dropped (its replies
        # are out of step now) and the error is one its Retry re-sends after.
        await connection.disconnect(nowait=True)
        raise RedisTimeoutError("Timeout talking to Redis") from None
    return replies
