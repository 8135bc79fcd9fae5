"""Sending a batch of script calls on one asyncio connection, without redis-py's per-call costs.

The batcher (:mod:`eventstore.wire.batching`) decides which calls go together and on which
connection; here they are sent: EVALSHA commands packed by hiredis in C, one exchange
(every command written, then every reply read, through the connection's
:class:`~eventstore.wire.pipe.Pipe`) bounded by one shared timer, error
replies in place of their call's reply, NOSCRIPT answered by loading the script and
re-sending only the refused calls, and connection errors and timeouts retried with the
client's ``Retry`` as redis-py retries a pipeline.

:func:`read_many` sends a wide read the same way (a run's thousands of ``HMGET``): through
a redis-py pipeline each reply costs its own timer and parser call, several times what
Redis spends on it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import hiredis
from redis.asyncio import Redis
from redis.asyncio.connection import Connection
from redis.commands.core import AsyncScript
from redis.exceptions import DataError, NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT

from eventstore.wire.deadlines import Deadlines
from eventstore.wire.pipe import pipe_for, release_pipe
from eventstore.wire.replies import reply_text


@dataclass(slots=True)
class BatchStats:
    """Counters of one batcher, for tests and the benchmark.

    Attributes:
        calls: script calls made through the batcher.
        round_trips: pipelines and single EVALSHA commands sent (re-sends included).
        resends: batches sent again whole after a connection error or a timeout.
        reloads: scripts loaded again after the server answered NOSCRIPT.
        largest_batch: the most calls one round trip carried.
        redirects: calls sent again after MOVED, ASK, TRYAGAIN or a connection error, on
            a cluster (:mod:`eventstore.wire.cluster_batching`).
        waits: times a caller waited for Redis's answer: one per call sent alone or in a
            pipeline, one per pair of ordered calls (:class:`~eventstore.wire.batching.Sent`),
            whose first is written without waiting. The round trips a lone agent feels.

    """

    calls: int = 0
    round_trips: int = 0
    resends: int = 0
    reloads: int = 0
    largest_batch: int = 0
    redirects: int = 0
    waits: int = 0


@dataclass(slots=True)
class Call:
    """One queued script call: its script, its arguments packed, and its caller's future."""

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


async def load_script(connection: Connection, source: EncodableT, limit: Deadlines | None) -> str:
    """``SCRIPT LOAD`` on ``connection``; return the script's SHA."""
    command = cast(bytes, hiredis.pack_command(("SCRIPT", "LOAD", source)))  # type: ignore[arg-type]
    (sha,) = await exchange(connection, [command], limit)
    if isinstance(sha, Exception):
        raise sha
    return reply_text(sha)


async def exchange(
    connection: Connection, packed: list[bytes], limit: Deadlines | None
) -> list[Any]:
    """Write every command, then read one reply per command (all of them, always).

    ``limit`` bounds the whole exchange (``None``: unbounded) with the batcher's one shared
    timer (:mod:`eventstore.wire.deadlines`), where redis-py would start a task for the write
    and arm a timer per reply, and ``asyncio.timeout`` a timer per exchange.
    """
    pipe = pipe_for(connection)
    # Through redis-py: a connection a pipe cannot take over (eventstore.wire.pipe), or one not
    # connected yet (redis-py connects it; its next exchange has a pipe).
    replies = pipe.send(packed) if pipe is not None else _through_redis_py(connection, packed)
    if limit is None:
        return await replies
    try:
        return await limit.run(replies)
    except TimeoutError:
        raise await timed_out(connection) from None


async def timed_out(connection: Connection) -> RedisTimeoutError:
    """Drop ``connection`` after a timeout; the error to raise for it.

    As redis-py does for its own timeouts: the connection is dropped (its replies are out
    of step now) and the error is one its Retry re-sends after.
    """
    await connection.disconnect(nowait=True)
    return RedisTimeoutError("Timeout talking to Redis")


async def _through_redis_py(connection: Connection, packed: list[bytes]) -> list[Any]:
    replies: list[Any] = []
    await connection.send_packed_command(packed, check_health=False)
    for _ in packed:
        try:
            replies.append(await connection.read_response(timeout=math.inf))
        except ResponseError as exc:
            replies.append(exc)
    return replies


async def send_batch(
    batch: list[Call],
    connection: Connection,
    limit: Deadlines | None,
    stats: BatchStats,
    *,
    reload: bool = True,
) -> list[Any]:
    """Send ``batch`` on ``connection`` within ``limit``; its replies (errors in place).

    Connection errors and timeouts are retried with the connection's ``Retry`` (the
    client's), as redis-py retries a pipeline: the connection is dropped and the whole
    batch is sent again on a fresh one. With ``reload``, NOSCRIPT is answered by loading
    each refused script once, on this connection, and re-sending only the refused calls
    (a refused EVALSHA did not run).
    """
    stats.largest_batch = max(stats.largest_batch, len(batch))
    stats.round_trips += 1
    packed = [call.packed for call in batch]
    pipe = pipe_for(connection)
    try:
        # The first attempt. On a pipe, the exchange is written out here: every write of
        # a tool call comes this way, and each coroutine between it and its reply is
        # suspended and resumed once per round trip.
        if pipe is None:
            replies = await exchange(connection, packed, limit)
        elif limit is None:
            replies = await pipe.send(packed)
        else:
            try:
                replies = await limit.run(pipe.send(packed))
            except TimeoutError:
                raise await timed_out(connection) from None
    except Exception as exc:  # the Retry decides what is retried
        replies = await retried(exc, connection, packed, limit, stats)
    if reload:
        for reply in replies:
            if isinstance(reply, NoScriptError):
                return await reloaded(batch, replies, connection, limit, stats)
    return replies  # the usual case: every script was known


async def retried(
    failure: Exception,
    connection: Connection,
    packed: list[bytes],
    limit: Deadlines | None,
    stats: BatchStats,
) -> list[Any]:
    """Go on after a first attempt that raised ``failure``, as the connection's Retry says.

    The first attempt was made outside the Retry (no closure, no retry frame while all
    goes well): its failure is replayed as the Retry's first attempt, so the Retry counts,
    backs off, disconnects and gives up exactly as if it had made it.
    """
    first: Exception | None = failure

    async def attempt() -> list[Any]:
        nonlocal first
        if first is not None:
            error, first = first, None
            raise error
        stats.round_trips += 1
        stats.resends += 1
        return await exchange(connection, packed, limit)

    replies: list[Any] = await connection.retry.call_with_retry(
        attempt, lambda _error: connection.disconnect()
    )
    return replies


async def reloaded(
    batch: list[Call],
    replies: list[Any],
    connection: Connection,
    limit: Deadlines | None,
    stats: BatchStats,
) -> list[Any]:
    """``replies`` with every NOSCRIPT replaced by its call's reply once its script is loaded."""
    refused = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    scripts = {id(batch[i].script): batch[i].script for i in refused}
    for script in scripts.values():
        # On the lane's own connection: with a small pool held by busy lanes, one
        # more connection could be long in coming.
        script.sha = await connection.retry.call_with_retry(
            lambda: load_script(connection, script.script, limit),  # noqa: B023 - awaited here
            lambda _error: connection.disconnect(),
        )
        stats.reloads += 1
    again = [batch[i] for i in refused]
    for call in again:
        call.packed = pack_evalsha(call.script.sha, call.args)
    resent = await send_batch(again, connection, limit, stats, reload=False)
    for i, reply in zip(refused, resent, strict=True):
        replies[i] = reply
    return replies


async def read_many(
    client: Redis, commands: Sequence[tuple[EncodableT, ...]], timeout_s: float
) -> list[Any]:
    """Send read-only ``commands`` on one pooled connection in one exchange; their replies.

    Packed by hiredis, read by the connection's pipe, the whole exchange bounded by
    ``timeout_s``; an error reply stands in place of its command's reply. A connection
    error or a timeout is retried with the connection's ``Retry``, the whole exchange
    again (reads: sending one twice changes nothing). For a single server's client (a
    cluster client has no pool: use its pipeline).

    Raises:
        redis.exceptions.RedisError: the connection failed or timed out past the retries.
        redis.exceptions.DataError: an argument is not bytes, str, int or float.

    """
    if not commands:
        return []
    try:
        packed = [cast(bytes, hiredis.pack_command(command)) for command in commands]  # type: ignore[arg-type]
    except TypeError as exc:
        raise DataError(str(exc)) from None
    pool: Any = client.connection_pool  # get_connection is untyped in redis-py
    connection: Connection = await pool.get_connection()
    limit = Deadlines(timeout_s)
    try:
        replies: list[Any] = await connection.retry.call_with_retry(
            lambda: exchange(connection, packed, limit),
            lambda _error: connection.disconnect(),
        )
    except BaseException:
        await connection.disconnect(nowait=True)  # replies may be due: never reuse it
        raise
    finally:
        if not release_pipe(connection):
            await connection.disconnect(nowait=True)
        await pool.release(connection)
    return replies
