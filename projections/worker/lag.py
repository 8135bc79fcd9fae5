"""Lag figures of a projection per shard, and the feed trimming that respects every group.

Redis 7 reports a group's lag in XINFO GROUPS; Redis 6.2 does not, so the entries after
the group's last-delivered id are counted instead (up to :data:`LAG_SCAN_CAP`). Redis
6.2 and 7.x have no trimming that knows about acknowledgements, so :func:`trim_feeds`
computes a watermark over all groups itself.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
import redis.exceptions

from eventstore.errors import StoreUnavailable, redis_errors
from eventstore.store import Store
from eventstore.wire.replies import reply_text
from eventstore.writer import now_ms

#: Most entries counted when the server does not report a group's lag.
LAG_SCAN_CAP: Final = 10_000


class ShardLag(msgspec.Struct, frozen=True, kw_only=True):
    """Where one projection's group stands on one shard feed.

    Attributes:
        shard: the shard.
        projection: the projection (its group name).
        pending: entries delivered and not yet acknowledged.
        lag: entries in the feed not yet delivered to the group.
        oldest_unacked_ms: age of the oldest pending entry (0 when none is pending).
        last_delivered_id: the group's last-delivered feed entry id.

    """

    shard: int
    projection: str
    pending: int
    lag: int
    oldest_unacked_ms: int
    last_delivered_id: str


def parse_entry_id(entry_id: str) -> tuple[int, int]:
    """Split a stream entry id ``<ms>-<seq>`` into its two numbers."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


async def feed_groups(store: Store, feed: str) -> list[dict[str, Any]]:
    """XINFO GROUPS of a feed ([] when the feed does not exist yet)."""
    try:
        return await store.client.xinfo_groups(feed)
    except redis.exceptions.ResponseError:
        return []
    except (redis.exceptions.RedisError, OSError) as exc:
        raise StoreUnavailable(type(exc).__name__) from None


async def shard_lag(store: Store, shard: int, projection: str) -> ShardLag:
    """Return the lag figures of ``projection`` on one shard feed.

    Raises:
        StoreUnavailable: Redis failed or timed out.

    """
    feed = store.keys.feed(shard)
    groups = await feed_groups(store, feed)
    info = next((g for g in groups if reply_text(g["name"]) == projection), None)
    if info is None:
        async with redis_errors():
            length = int(await store.client.xlen(feed))
        return ShardLag(
            shard=shard,
            projection=projection,
            pending=0,
            lag=length,
            oldest_unacked_ms=0,
            last_delivered_id="0-0",
        )
    pending = int(info["pending"])
    last = reply_text(info["last-delivered-id"])
    lag = info.get("lag")
    async with redis_errors():
        if lag is None:
            start = "-" if last == "0-0" else f"({last}"
            behind = await store.client.xrange(feed, min=start, max="+", count=LAG_SCAN_CAP)
            lag = len(behind or [])
        oldest = 0
        if pending:
            summary = await store.client.xpending(feed, projection)
            if summary["min"] is not None:
                oldest = max(0, now_ms() - parse_entry_id(reply_text(summary["min"]))[0])
    return ShardLag(
        shard=shard,
        projection=projection,
        pending=pending,
        lag=int(lag),
        oldest_unacked_ms=oldest,
        last_delivered_id=last,
    )


async def trim_feeds(store: Store, *, keep_ms: int | None = None) -> int:
    """Trim every shard feed below the oldest entry any group still needs; return removed.

    The MINID of a feed is the smallest, over all its groups, of the oldest pending entry
    and the entry after the last delivered one, and never above ``now - keep_ms`` (default
    the record TTL), so an entry still pending in any group, not yet delivered to every
    group, or younger than ``keep_ms`` is kept.

    Raises:
        StoreUnavailable: Redis failed or timed out.

    """
    keep = store.settings.ttl_ms if keep_ms is None else keep_ms
    removed = 0
    for shard in range(store.keys.shards):
        feed = store.keys.feed(shard)
        watermark = (max(0, now_ms() - keep), 0)
        for info in await feed_groups(store, feed):
            name = reply_text(info["name"])
            if int(info["pending"]):
                async with redis_errors():
                    summary = await store.client.xpending(feed, name)
                bound = parse_entry_id(reply_text(summary["min"]))
            else:
                ms, seq = parse_entry_id(reply_text(info["last-delivered-id"]))
                bound = (ms, seq + 1)
            watermark = min(watermark, bound)
        async with redis_errors():
            removed += int(
                await store.client.xtrim(
                    feed, minid=f"{watermark[0]}-{watermark[1]}", approximate=False
                )
            )
    return removed
