"""``Store``: one namespace of canonical records on one Redis (or Redis Cluster).

The store wires the key layout, the scripts, the Writer, the Reader and the run registry
onto one client. Redis access stays inside this package; nothing agent-facing exposes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from types import TracebackType
from typing import Final, Self

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from eventstore.errors import InvalidArgument, NamespaceMismatch, redis_errors
from eventstore.keys import DEFAULT_NAMESPACE, DEFAULT_SHARDS, Keys
from eventstore.reader import InvocationRecord, Reader, StoredEvent
from eventstore.runs import OpenedRun, RunInfo, RunRegistry
from eventstore.scripts import Scripts
from eventstore.writer import Writer, now_ms
from machine.ids import is_safe_id
from machine.limits import Limits

DEFAULT_TTL: Final = timedelta(days=1)
#: Feed entries are kept this long past the record TTL before age trimming removes them.
FEED_GRACE: Final = timedelta(hours=1)


def _ms(value: timedelta) -> int:
    return int(value.total_seconds() * 1000)


class Store:
    """The canonical invocation store of one namespace.

    Use :meth:`from_url` to build one; ``async with`` checks the namespace settings and
    closes the connection pool at the end.
    """

    def __init__(
        self,
        client: Redis,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        shards: int = DEFAULT_SHARDS,
        ttl: timedelta = DEFAULT_TTL,
        limits: Limits | None = None,
        timeout_s: float = 2.0,
    ) -> None:
        if ttl <= timedelta(0):
            raise InvalidArgument("ttl must be positive")
        self.client = client
        self.keys = Keys(namespace, shards)
        self.ttl_ms = _ms(ttl)
        self.limits = limits or Limits()
        self.timeout_s = timeout_s
        self.feed_retention_ms = self.ttl_ms + _ms(FEED_GRACE)
        self.scripts = Scripts(client)
        self.writer = Writer(
            client,
            self.keys,
            self.scripts,
            ttl_ms=self.ttl_ms,
            feed_retention_ms=self.feed_retention_ms,
        )
        self.reader = Reader(client, self.keys)
        self.runs = RunRegistry(client, self.keys, self.scripts, ttl_ms=self.ttl_ms)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        shards: int = DEFAULT_SHARDS,
        ttl: timedelta = DEFAULT_TTL,
        limits: Limits | None = None,
        timeout_s: float = 2.0,
        max_connections: int = 64,
    ) -> Store:
        """Build a store on ``redis://``, ``rediss://`` or ``unix://`` ``url``.

        Every command is bounded by ``timeout_s``; connection errors are retried a few
        times with backoff, which is safe because every write is idempotent by event id.
        """
        client = Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(ExponentialBackoff(cap=0.25, base=0.01), 3),
            retry_on_error=[RedisConnectionError, RedisTimeoutError],
            max_connections=max_connections,
            decode_responses=False,
        )
        return cls(
            client,
            namespace=namespace,
            shards=shards,
            ttl=ttl,
            limits=limits,
            timeout_s=timeout_s,
        )

    async def __aenter__(self) -> Self:
        try:
            await self.check_namespace()
        except BaseException:
            # ``async with`` skips __aexit__ when entering fails; the pool is ours to close.
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.client.aclose()

    async def check_namespace(self) -> None:
        """Record this namespace's shard count, or refuse a store built with another one.

        Raises:
            NamespaceMismatch: the namespace already exists with a different shard count.

        """
        meta = self.keys.meta()
        async with redis_errors():
            await self.client.hsetnx(meta, "shards", self.keys.shards)
            stored = await self.client.hget(meta, "shards")
        if stored is not None and int(stored) != self.keys.shards:
            raise NamespaceMismatch(
                f"namespace has {int(stored)} shards; this store was built with {self.keys.shards}"
            )

    async def open_run(
        self,
        run_id: str,
        *,
        deadline: datetime | timedelta,
        budget: int | None = None,
        tools: Mapping[str, int | None] | None = None,
    ) -> OpenedRun:
        """Register a run; see :meth:`RunRegistry.open`. ``deadline`` may be relative."""
        if isinstance(deadline, timedelta):
            deadline_ms = now_ms() + _ms(deadline)
        else:
            if deadline.tzinfo is None:
                raise InvalidArgument("deadline must be timezone-aware")
            deadline_ms = int(deadline.timestamp() * 1000)
        return await self.runs.open(run_id, deadline_ms=deadline_ms, budget=budget, tools=tools)

    async def close_run(self, run_id: str) -> bool:
        """Mark a run inactive; False when the run is unknown."""
        return await self.runs.close(run_id)

    async def run_info(self, run_id: str) -> RunInfo | None:
        """Return a run's registry entry, or None."""
        return await self.runs.info(run_id)

    async def set_paused(self, paused: bool) -> None:
        """Pause or resume tool execution in the whole namespace (every shard's switch)."""
        async with redis_errors(), self.client.pipeline(transaction=False) as pipe:
            for shard in range(self.keys.shards):
                pipe.hset(self.keys.control(shard), "paused", int(paused))
            await pipe.execute()

    async def is_paused(self) -> bool:
        """Tell whether execution is paused."""
        async with redis_errors():
            value = await self.client.hget(self.keys.control(0), "paused")
        return value == b"1"

    async def get(self, run_id: str, tool_call_id: str) -> InvocationRecord | None:
        """Return the canonical record, or None when absent, expired or the ids are unsafe.

        Read-only: never changes the record's expiry.
        """
        if not (is_safe_id(run_id) and is_safe_id(tool_call_id)):
            return None
        return await self.reader.get(run_id, tool_call_id)

    async def events(self, run_id: str, tool_call_id: str) -> list[StoredEvent]:
        """Return the invocation's stored events in order (read-only)."""
        if not (is_safe_id(run_id) and is_safe_id(tool_call_id)):
            return []
        return await self.reader.events(run_id, tool_call_id)
