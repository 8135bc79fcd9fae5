"""The last failure reason of a delivered feed entry, kept beside the delivery in Redis.

An entry whose projection raises stays pending and is retried, maybe by another consumer
after the first was killed; the one that finally dead-letters it must still say why. So
each failed attempt writes its error type (a class name, never a message: it could hold
a payload) to ``keys.failure(shard, projection, entry_id)``, a small hash that expires
with the feed's retention (an entry is never delivered after it is trimmed), in one
MULTI with its expiry so it can never be left without one. Recording is best effort:
when Redis is what failed, the process's own memory still has the reason.
"""

from __future__ import annotations

from typing import cast

from eventstore.errors import CanonError, redis_errors
from eventstore.logs import get_logger
from eventstore.store import Store
from eventstore.writer import now_ms

log = get_logger("canon.projections")


class FailureLog:
    """Reads and writes the last failure reason of the feed entries of a store's shards.

    Args:
        store: the store whose shard feeds the projections read.

    """

    def __init__(self, store: Store) -> None:
        self.store = store

    async def record(self, shard: int, projection: str, entry_id: str, error: str) -> None:
        """Keep ``error`` (an exception type name) as the entry's last failure reason.

        ``projection`` is the projection's name (its consumer group).
        """
        try:
            key = self.store.keys.failure(shard, projection, entry_id)
            async with redis_errors(), self.store.client.pipeline(transaction=True) as pipe:
                pipe.hset(key, mapping={"error": error, "at_ms": now_ms()})
                pipe.pexpireat(key, now_ms() + self.store.settings.feed_retention_ms)
                await pipe.execute()
        except CanonError as exc:
            log.info("failure_not_recorded", projection=projection, error=type(exc).__name__)

    async def last(self, shard: int, projection: str, entry_id: str) -> str | None:
        """Return the entry's last recorded failure reason in ``projection``.

        None when none was recorded, or it cannot be read.
        """
        try:
            key = self.store.keys.failure(shard, projection, entry_id)
            async with redis_errors():
                value = cast(bytes | None, await self.store.client.hget(key, "error"))
        except CanonError:
            return None
        return None if value is None else value.decode("utf-8", "replace")
