"""``Store``: one namespace of canonical records on one Redis (or Redis Cluster).

The store wires the key layout, the scripts, the Writer, the Reader and the run registry
onto one client. Redis access stays inside this package; nothing agent-facing exposes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from types import TracebackType
from typing import Final, Self

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from eventstore.batching import ScriptBatcher
from eventstore.cluster import (
    cluster_client,
    cluster_of,
    split_cluster_parameter,
    store_client,
)
from eventstore.durability import DurabilityMode, DurabilityReport, check_durability
from eventstore.errors import InvalidArgument, NamespaceMismatch, redis_errors
from eventstore.keys import DEFAULT_NAMESPACE, DEFAULT_SHARDS, Keys
from eventstore.reader import InvocationRecord, Reader, StoredEvent
from eventstore.replication import (
    DEFAULT_REPLICA_TIMEOUT_MS,
    ReplicaAcknowledgedCalls,
    validate_replicas,
)
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
    closes the connection pool at the end. On a Redis Cluster, ``cluster`` is the
    cluster client (``client`` is the same object; see :mod:`eventstore.cluster`).
    """

    def __init__(
        self,
        client: Redis | RedisCluster,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        shards: int = DEFAULT_SHARDS,
        ttl: timedelta = DEFAULT_TTL,
        limits: Limits | None = None,
        timeout_s: float = 2.0,
        durability: DurabilityMode = "warn",
        replicas: int = 0,
        replica_timeout_ms: int = DEFAULT_REPLICA_TIMEOUT_MS,
        read_only: bool = False,
    ) -> None:
        if ttl <= timedelta(0):
            raise InvalidArgument("ttl must be positive")
        validate_replicas(
            replicas,
            replica_timeout_ms,
            timeout_s=timeout_s,
            cluster=cluster_of(client) is not None,
        )
        self.durability: DurabilityMode = durability
        self.replicas = replicas
        self.read_only = read_only
        self.cluster = cluster_of(client)
        self.client = store_client(client)
        self.keys = Keys(namespace, shards)
        self.ttl_ms = _ms(ttl)
        self.limits = limits or Limits()
        self.timeout_s = timeout_s
        self.feed_retention_ms = self.ttl_ms + _ms(FEED_GRACE)
        self.scripts = Scripts(self.client)
        self.batcher = (
            ReplicaAcknowledgedCalls(self.client, replicas=replicas, timeout_ms=replica_timeout_ms)
            if replicas
            else ScriptBatcher(self.client)
        )
        self.writer = Writer(
            self.client,
            self.keys,
            self.scripts,
            ttl_ms=self.ttl_ms,
            feed_retention_ms=self.feed_retention_ms,
            batcher=self.batcher,
        )
        self.reader = Reader(self.client, self.keys)
        self.runs = RunRegistry(self.client, self.keys, self.scripts, ttl_ms=self.ttl_ms)

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
        cluster: bool = False,
        durability: DurabilityMode = "warn",
        replicas: int = 0,
        replica_timeout_ms: int = DEFAULT_REPLICA_TIMEOUT_MS,
        read_only: bool = False,
    ) -> Store:
        """Build a store on ``redis://``, ``rediss://`` or ``unix://`` ``url``.

        Every command is bounded by ``timeout_s``; connection errors are retried a few
        times with backoff, which is safe because every write is idempotent by event id.
        With ``cluster`` (or ``?cluster=1`` in the URL), ``url`` names any node of a
        Redis Cluster; the other nodes are discovered from it.

        ``durability`` (``warn``, ``strict`` or ``off``) decides what entering the store
        does about a server that could lose or evict records (see
        :mod:`eventstore.durability`). With ``replicas`` > 0 an append is acknowledged
        only once that many replicas have it, waiting at most ``replica_timeout_ms``
        (see :mod:`eventstore.replication`).

        A ``read_only`` store is for processes that only read (``canon serve`` without
        workers, a reader ACL user): entering it writes nothing, not even the namespace
        metadata, and runs no durability preflight (a reader commits nothing to lose).
        """
        url, cluster_in_url = split_cluster_parameter(url)
        client: Redis | RedisCluster
        if cluster or cluster_in_url:
            client = cluster_client(url, timeout_s=timeout_s, max_connections=max_connections)
        else:
            # A blocking pool makes a burst beyond max_connections wait (up to timeout_s)
            # for a free connection instead of failing at once.
            pool = BlockingConnectionPool.from_url(
                url,
                timeout=timeout_s,
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
                retry=Retry(ExponentialBackoff(cap=0.25, base=0.01), 3),
                retry_on_error=[RedisConnectionError, RedisTimeoutError],
                max_connections=max_connections,
                decode_responses=False,
            )
            client = Redis.from_pool(pool)
        return cls(
            client,
            namespace=namespace,
            shards=shards,
            ttl=ttl,
            limits=limits,
            timeout_s=timeout_s,
            durability=durability,
            replicas=replicas,
            replica_timeout_ms=replica_timeout_ms,
            read_only=read_only,
        )

    async def __aenter__(self) -> Self:
        try:
            await self.check_namespace()
            if not self.read_only:
                await self.check_durability()
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
        await self.batcher.drain()
        await self.client.aclose()

    async def check_namespace(self) -> None:
        """Refuse a store built with another shard count than its namespace's.

        A writing store records the shard count of a namespace that has none yet; a
        read-only one only reads it (a namespace nobody wrote yet is then taken as built
        with this store's count).

        Raises:
            NamespaceMismatch: the namespace already exists with a different shard count.
            AccessDenied: the ACL user may not read (or, writing, record) the metadata.

        """
        meta = self.keys.meta()
        async with redis_errors():
            stored = await self.client.hget(meta, "shards")
            if stored is None and not self.read_only:
                await self.client.hsetnx(meta, "shards", self.keys.shards)
                stored = await self.client.hget(meta, "shards")
        if stored is not None and int(stored) != self.keys.shards:
            raise NamespaceMismatch(
                f"namespace has {int(stored)} shards; this store was built with {self.keys.shards}"
            )

    async def check_durability(self, mode: DurabilityMode | None = None) -> DurabilityReport | None:
        """Judge the server's persistence, eviction policy and replicas (default: own mode).

        Raises:
            DurabilityError: in strict mode, records could be lost or evicted.

        """
        return await check_durability(
            self.client, mode or self.durability, cluster=self.cluster, replicas=self.replicas
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

    async def revoke_token(self, run_id: str) -> bool:
        """Withdraw a run's access token (receipts stop answering it); False when unknown."""
        return await self.runs.revoke_token(run_id)

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
