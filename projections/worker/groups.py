"""The consumer-group commands a worker issues on one shard feed, errors translated.

Redis errors become :class:`StoreUnavailable` carrying only the exception type; a read
from a group deleted under a running worker (NOGROUP) raises :class:`GroupMissing`, and
the worker decides whether to create it again or to leave it (a rebuild retired it).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

import redis.exceptions
from redis.asyncio import ConnectionPool, Redis
from redis.typing import KeyT, StreamIdT

from eventstore.errors import AccessDenied, CanonError, StoreUnavailable, redis_errors
from eventstore.store import Store
from eventstore.wire.replies import reply_text

#: A delivered entry: its id and fields (None or empty when the stream entry is gone).
Entry = tuple[str, dict[bytes, bytes] | None]


class GroupMissing(CanonError):
    """Raised when a feed has no such consumer group (it was deleted, or never created)."""


@contextlib.asynccontextmanager
async def _group_errors() -> AsyncIterator[None]:
    """Like ``redis_errors``, but NOGROUP becomes :class:`GroupMissing` for the worker."""
    try:
        yield
    except redis.exceptions.NoPermissionError:
        raise AccessDenied("NoPermissionError") from None
    except redis.exceptions.ResponseError as exc:
        if "NOGROUP" in str(exc):
            raise GroupMissing() from None
        raise StoreUnavailable(type(exc).__name__) from None
    except (redis.exceptions.RedisError, OSError) as exc:
        raise StoreUnavailable(type(exc).__name__) from None


async def ensure_group(client: Redis, feed: str, group: str) -> None:
    """Create ``group`` on ``feed`` from its first entry (the feed too); keep an existing one."""
    try:
        await client.xgroup_create(feed, group, id="0", mkstream=True)
    except redis.exceptions.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise StoreUnavailable(type(exc).__name__) from None
    except (redis.exceptions.RedisError, OSError) as exc:
        raise StoreUnavailable(type(exc).__name__) from None


async def read_group(
    client: Redis,
    feed: str,
    group: str,
    consumer: str,
    *,
    start: str,
    count: int,
    block_ms: int | None,
) -> list[Entry]:
    """XREADGROUP on one feed: ``start`` ``>`` for new entries, ``0``.. for own pending ones.

    Raises:
        GroupMissing: the feed has no such group.
        StoreUnavailable: Redis failed or timed out.

    """
    read = await read_groups(client, {feed: start}, group, consumer, count=count, block_ms=block_ms)
    return read.get(feed, [])


async def read_groups(
    client: Redis,
    starts: Mapping[str, str],
    group: str,
    consumer: str,
    *,
    count: int,
    block_ms: int | None,
) -> dict[str, list[Entry]]:
    """One XREADGROUP on several feeds of one server (or of one cluster slot).

    ``starts`` maps each feed to where to read from, as in :func:`read_group`; ``count``
    bounds the entries of each feed. Returns the entries read, by feed (feeds with none
    are left out).

    Raises:
        GroupMissing: one of the feeds has no such group.
        StoreUnavailable: Redis failed or timed out.

    """
    streams: dict[KeyT, StreamIdT] = {feed: start for feed, start in starts.items()}
    async with _group_errors():
        reply: Any = await client.xreadgroup(group, consumer, streams, count=count, block=block_ms)
    by_feed = reply.items() if isinstance(reply, dict) else reply or ()  # RESP3 or RESP2
    return {
        reply_text(feed): [(reply_text(entry_id), fields) for entry_id, fields in entries]
        for feed, entries in by_feed
        if entries
    }


async def claim_idle(
    client: Redis,
    feed: str,
    group: str,
    consumer: str,
    *,
    min_idle_ms: int,
    cursor: str,
    count: int,
) -> tuple[str, list[Entry], int]:
    """XAUTOCLAIM one page; return the next cursor, the named entries and the page size.

    Redis 6.2 answers entries deleted from the stream as nil (they stay pending, now
    ours); they are counted in the page size but cannot be named here.

    Raises:
        GroupMissing: the feed has no such group (a server restarted without its data).
        StoreUnavailable: Redis failed or timed out.

    """
    async with _group_errors():
        reply = await client.xautoclaim(feed, group, consumer, min_idle_ms, cursor, count=count)
    named = [
        (reply_text(entry_id), fields) for entry_id, fields in reply[1] if entry_id is not None
    ]
    return reply_text(reply[0]), named, len(reply[1])


async def deliveries(
    client: Redis, feed: str, group: str, consumer: str, entries: list[Entry]
) -> dict[str, int]:
    """Return the delivery count of each entry pending for ``consumer``."""
    if not entries:
        return {}
    async with redis_errors(), client.pipeline(transaction=False) as pipe:
        for entry_id, _ in entries:
            pipe.xpending_range(feed, group, entry_id, entry_id, 1, consumer)
        replies = cast(list[list[dict[str, Any]]], await pipe.execute())
    return {
        reply_text(row["message_id"]): int(row["times_delivered"])
        for reply in replies
        for row in reply
    }


async def retire_consumer(client: Redis, feed: str, group: str, consumer: str) -> bool:
    """Delete ``consumer`` from ``group`` if it has no pending entry; True when deleted.

    A group that no longer exists (a rebuild retired it) has nobody left to delete.
    """
    try:
        consumers = await client.xinfo_consumers(feed, group)
    except redis.exceptions.ResponseError as exc:
        if "NOGROUP" in str(exc) or "no such key" in str(exc):
            return False
        raise StoreUnavailable(type(exc).__name__) from None
    except (redis.exceptions.RedisError, OSError) as exc:
        raise StoreUnavailable(type(exc).__name__) from None
    async with redis_errors():
        mine = [c for c in consumers if reply_text(c["name"]) == consumer]
        if not mine or int(mine[0]["pending"]) != 0:
            return False
        await client.xgroup_delconsumer(feed, group, consumer)
    return True


def blocking_client(store: Store, block_ms: int, connections: int) -> tuple[Redis, int]:
    """A client for blocking reads whose socket timeout exceeds the block, and the block.

    On a single server a pool of its own is opened (close it with ``aclose``); a cluster
    client shares the store's timeout, so the store's client is returned with a block
    well under that timeout.
    """
    if store.cluster is not None:
        return store.client, max(1, min(block_ms, int(store.settings.timeout_s * 500)))
    pool = store.client.connection_pool
    kwargs = dict(pool.connection_kwargs)
    kwargs["socket_timeout"] = block_ms / 1000 + store.settings.timeout_s
    connection_pool = ConnectionPool(
        connection_class=pool.connection_class, max_connections=connections, **kwargs
    )
    return Redis.from_pool(connection_pool), block_ms
