"""``Store``: one namespace of canonical records on one Redis (or Redis Cluster).

The store wires the key layout, the scripts, the Writer, the Reader and the run registry
onto one client, configured by one :class:`~eventstore.settings.StoreSettings`. Redis
access stays inside this package and the packages built on it (see the seam in the
:class:`Store` docstring); nothing agent-facing exposes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import datetime, timedelta
from types import TracebackType
from typing import Self, Unpack, cast

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from eventstore.decisions import Decision, Decisions
from eventstore.errors import InvalidArgument, NamespaceMismatch, WrongEventLoop, redis_errors
from eventstore.reader import InvocationRecord, Reader, StoredEvent
from eventstore.runs import OpenedRun, Refusal, RunInfo, RunRegistry
from eventstore.server.durability import DurabilityMode, DurabilityReport, check_durability
from eventstore.settings import (
    DEFAULT_TTL,
    FEED_GRACE,
    StoreOptions,
    StoreSettings,
    milliseconds,
)
from eventstore.wire.batching import ScriptBatcher
from eventstore.wire.cluster import (
    cluster_client,
    cluster_of,
    split_cluster_parameter,
    store_client,
)
from eventstore.wire.cluster_batching import ClusterScriptBatcher
from eventstore.wire.exchange import BatchStats
from eventstore.wire.keys import LAYOUT, LAYOUTS, LEGACY_LAYOUT, Keys
from eventstore.wire.replication import ReplicaAcknowledgedCalls, validate_replicas
from eventstore.wire.scripts import Scripts
from eventstore.writer import Writer, now_ms
from machine.ids import is_run_id

__all__ = ["DEFAULT_TTL", "FEED_GRACE", "Store", "StoreSettings"]

#: Connections (on a cluster, commands in flight) of a store built by ``from_url``; a
#: cluster store adds two per shard for the projection workers' blocking reads.
DEFAULT_MAX_CONNECTIONS = 64


def namespace_keys(keys: Keys, layout: bytes | None) -> Keys:
    """Return ``keys`` in the layout a namespace's metadata names (None: the legacy one).

    Raises:
        NamespaceMismatch: the metadata names a layout this version does not know.

    """
    number = LEGACY_LAYOUT if layout is None else int(layout) if layout.isdigit() else 0
    if number not in LAYOUTS:
        raise NamespaceMismatch("namespace uses a key layout this version does not know")
    return keys if number == keys.layout else Keys(keys.namespace, keys.shards, number)


class Store:
    """The canonical invocation store of one namespace.

    Use :meth:`from_url` to build one; ``async with`` checks the namespace settings and
    closes the connection pool at the end.

    Its public methods are the API of the harness and of operators (``open_run``,
    ``get``, ``events``, ``set_paused`` ...). The packages built on the store
    (``projections``, the audit tools, the ``canon`` command and its benchmark) may also
    use this seam, and nothing else of it:

    * ``settings``: the :class:`~eventstore.settings.StoreSettings` it was built with
      (TTL, limits, timeouts), so that what they derive (a receipt's result bound, a
      feed trim horizon, a read timeout) agrees with the store's own writes.
    * ``keys``: the key layout (:class:`~eventstore.wire.keys.Keys`); every key they touch
      comes from it, since only :mod:`eventstore.wire.keys` formats or parses a key.
    * ``client``: the Redis (or cluster) client, for the reads, scripts and consumer
      groups of their own (their calls go through :func:`~eventstore.errors.redis_errors`);
      ``cluster`` is the cluster client, or None on a single server, for what must be
      done per node or cannot be one transaction across slots.
    * ``writer``: the :class:`~eventstore.writer.Writer`, for code that writes an
      invocation's events itself rather than through ``ToolBoundary`` (the boundary,
      the benchmark's write load).
    * ``runs``: the run registry, to authenticate a run's token and resolve an
      invocation id to its tool call id (the receipt API, ``canon inspect``).
    * ``reader``: read-only access to records and streams, never touching a TTL (the
      boundary's replayed retries and closing of interrupted calls).
    * ``batch_stats``: what the auto-pipelining did (the benchmark reports it).

    The scripts and the batcher stay private: they are how the store does
    its work, not something to build on.

    A store belongs to the event loop of its first call: from any other loop its methods
    (and ``ToolBoundary.invoke``) raise :class:`~eventstore.errors.WrongEventLoop`. Plain
    threads use :class:`eventstore.sync.SyncStore`.
    """

    def __init__(
        self,
        client: Redis | RedisCluster,
        settings: StoreSettings | None = None,
        **options: Unpack[StoreOptions],
    ) -> None:
        """Build a store on ``client`` with ``settings``, and ``options`` on top of them.

        Raises:
            InvalidArgument: a setting is out of range (``ttl``, ``namespace``,
                ``shards``, ``replicas``).

        """
        settings = (settings or StoreSettings()).with_options(**options)
        validate_replicas(
            settings.replicas,
            settings.replica_timeout_ms,
            timeout_s=settings.timeout_s,
            cluster=cluster_of(client) is not None,
        )
        self.settings = settings
        self.cluster = cluster_of(client)
        self.client = store_client(client)
        self._batcher: ScriptBatcher | ClusterScriptBatcher
        if settings.replicas:
            self._batcher = ReplicaAcknowledgedCalls(
                self.client, replicas=settings.replicas, timeout_ms=settings.replica_timeout_ms
            )
        elif self.cluster is not None:  # one batcher per primary, calls routed by slot
            self._batcher = ClusterScriptBatcher(self.cluster)
        else:
            self._batcher = ScriptBatcher(self.client)
        self._scripts = Scripts(self.client, self._batcher)
        self.use_keys(Keys(settings.namespace, settings.shard_count))
        self._loop: asyncio.AbstractEventLoop | None = None

    def use_keys(self, keys: Keys) -> None:
        """Read and write through ``keys`` from now on (another layout of the namespace).

        :meth:`check_namespace` calls it with the layout the namespace records; the
        read-only audit tools do the same.
        """
        self.keys = keys
        self.writer = Writer(
            self.client,
            keys,
            self._scripts,
            ttl_ms=self.settings.ttl_ms,
            feed_retention_ms=self.settings.feed_retention_ms,
            refusals_kept=self.settings.refusals_kept,
        )
        self._reader = Reader(self.client, keys)
        self.runs = RunRegistry(self.client, keys, self._scripts, ttl_ms=self.settings.ttl_ms)
        #: Operators' decisions and runs' pause switches (:mod:`eventstore.decisions`).
        self.decisions = Decisions(self._reader, self.writer, self.runs, self.settings.limits)

    @classmethod
    def from_url(
        cls,
        url: str,
        settings: StoreSettings | None = None,
        *,
        max_connections: int | None = None,
        cluster: bool = False,
        **options: Unpack[StoreOptions],
    ) -> Store:
        """Build a store on ``redis://``, ``rediss://`` or ``unix://`` ``url``.

        ``settings`` (default: the defaults) with ``options`` applied on top: the keyword
        arguments are the fields of :class:`~eventstore.settings.StoreSettings`
        (``namespace``, ``shards``, ``ttl``, ``limits``, ``timeout_s``, ``durability``,
        ``replicas``, ``replica_timeout_ms``).

        Every command is bounded by ``timeout_s``; connection errors are retried a few
        times with backoff, which is safe because every write is idempotent by event id.
        With ``cluster`` (or ``?cluster=1`` in the URL), ``url`` names any node of a
        Redis Cluster; the other nodes are discovered from it. At most
        ``max_connections`` connections are open at once (commands in flight on a
        cluster); by default 64, and on a cluster two more per shard: there a
        projection worker holds a blocking read per shard (a command cannot span the
        feeds' slots), and ``canon workers`` runs two on one store.

        ``durability`` (``warn``, ``strict`` or ``off``) decides what entering the store
        does about a server that could lose or evict records (see
        :mod:`eventstore.server.durability`). With ``replicas`` > 0 an append is acknowledged
        only once that many replicas have it, waiting at most ``replica_timeout_ms``
        (see :mod:`eventstore.wire.replication`).

        A ``read_only`` store is for processes that only read (``canon serve`` without
        workers, a reader ACL user): entering it writes nothing, not even the namespace
        metadata, and runs no durability preflight (a reader commits nothing to lose).
        """
        settings = (settings or StoreSettings()).with_options(**options)
        timeout_s = settings.timeout_s
        url, cluster_in_url = split_cluster_parameter(url)
        client: Redis | RedisCluster
        if cluster or cluster_in_url:
            if max_connections is None:
                max_connections = DEFAULT_MAX_CONNECTIONS + 2 * settings.shard_count
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
                max_connections=max_connections or DEFAULT_MAX_CONNECTIONS,
                decode_responses=False,
            )
            client = Redis.from_pool(pool)
        return cls(client, settings)

    @property
    def reader(self) -> Reader:
        """The read-only access to records and streams (never touches a TTL).

        For the boundary's replayed retries and the closing of interrupted calls, which
        read a record the way the store's own ``get`` does, without the id checks.
        """
        return self._reader

    @property
    def batch_stats(self) -> BatchStats:
        """What the auto-pipelining of script calls did so far (calls, round trips ...)."""
        return self._batcher.stats

    def check_loop(self) -> None:
        """Bind the store to the running event loop on its first call; then refuse others.

        Raises:
            WrongEventLoop: the store already runs in another event loop.

        """
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # the only cost on the hot path: one comparison
            if self._loop is not None:
                raise WrongEventLoop
            self._loop = loop

    async def __aenter__(self) -> Self:
        self.check_loop()
        try:
            await self.check_namespace()
            if not self.settings.read_only:
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
        self.check_loop()
        await self._batcher.close()
        await self.client.aclose()

    async def check_namespace(self) -> None:
        """Record a new namespace's shard count and key layout, or adopt an existing one's.

        An existing namespace's shard count is adopted when this store was given none
        (``shards=None``, the default); one given that differs is refused.

        A namespace created here records :data:`~eventstore.wire.keys.LAYOUT`; one whose
        metadata names no layout was created before layouts were recorded and is read and
        written in :data:`~eventstore.wire.keys.LEGACY_LAYOUT` (:meth:`use_keys`). A read-only
        store only reads the metadata (a namespace nobody wrote yet is then taken as built
        with this store's shard count, in the current layout).

        Raises:
            NamespaceMismatch: the namespace already exists with a different shard count
                (a shard count never changes: no key is remapped), or with a key layout
                this version does not know.
            AccessDenied: the ACL user may not read (or, writing, record) the metadata.

        """
        self.check_loop()
        meta = self.keys.meta()
        async with redis_errors():
            reply = await self.client.hmget(meta, ["shards", "layout"])
            if reply[0] is None and not self.settings.read_only:
                # The layout goes in before the shard count: whoever sees the shard count
                # of a namespace this version created also sees its layout.
                async with self.client.pipeline(transaction=False) as pipe:
                    pipe.hsetnx(meta, "layout", LAYOUT)
                    pipe.hsetnx(meta, "shards", self.keys.shards)
                    pipe.hmget(meta, ["shards", "layout"])
                    reply = (await pipe.execute())[-1]
        stored, layout = cast(tuple[bytes | None, bytes | None], reply)
        if stored is None:
            return  # read-only, and no writer created the namespace yet
        if int(stored) != self.keys.shards and self.settings.shards is None:
            # Nobody asked for a count: the namespace's own is the one its keys are named by.
            self.use_keys(Keys(self.keys.namespace, int(stored), self.keys.layout))
        if int(stored) != self.keys.shards:
            # Never remapped: every key of the namespace is named by its shard count.
            raise NamespaceMismatch(
                f"namespace {self.keys.namespace!r} has {int(stored)} shards; this store was"
                f" built with {self.keys.shards}. A namespace keeps the shard count it was"
                f" created with: open it with shards={int(stored)} (canon: --shards"
                f" {int(stored)}, or CANON_SHARDS), or create another namespace"
            )
        keys = namespace_keys(self.keys, layout)
        if keys != self.keys:
            self.use_keys(keys)

    async def check_durability(self, mode: DurabilityMode | None = None) -> DurabilityReport | None:
        """Judge the server's persistence, eviction policy and replicas (default: own mode).

        Raises:
            DurabilityError: in strict mode, records could be lost or evicted.

        """
        self.check_loop()
        return await check_durability(
            self.client,
            mode or self.settings.durability,
            cluster=self.cluster,
            replicas=self.settings.replicas,
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
        self.check_loop()
        if isinstance(deadline, timedelta):
            deadline_ms = now_ms() + milliseconds(deadline)
        else:
            if deadline.tzinfo is None:
                raise InvalidArgument("deadline must be timezone-aware")
            deadline_ms = int(deadline.timestamp() * 1000)
        return await self.runs.open(run_id, deadline_ms=deadline_ms, budget=budget, tools=tools)

    async def close_run(self, run_id: str) -> bool:
        """Mark a run inactive; False when the run is unknown."""
        self.check_loop()
        return await self.runs.close(run_id)

    async def revoke_token(self, run_id: str) -> bool:
        """Withdraw a run's access token (receipts stop answering it); False when unknown."""
        self.check_loop()
        return await self.runs.revoke_token(run_id)

    async def run_info(self, run_id: str) -> RunInfo | None:
        """Return a run's registry entry, or None."""
        self.check_loop()
        return await self.runs.info(run_id)

    async def refusals(self, run_id: str, *, limit: int = 100) -> list[Refusal]:
        """Return the run's latest refusals, newest first (at most ``limit``).

        A refusal is a call turned away before any record existed (preflight, the run's
        state, a duplicate, a budget); the run keeps its last ``refusals_kept`` and counts
        every one per code (:attr:`RunInfo.refused`). Read-only: no TTL changes. Empty for
        an unknown, expired or unsafe run id.

        Raises:
            InvalidArgument: ``limit`` is not a whole number of at least 1.

        """
        self.check_loop()
        return await self.runs.refusals(run_id, limit=limit)

    async def set_paused(self, paused: bool) -> None:
        """Pause or resume tool execution in the whole namespace (every shard's switch)."""
        self.check_loop()
        async with redis_errors(), self.client.pipeline(transaction=False) as pipe:
            for shard in range(self.keys.shards):
                pipe.hset(self.keys.control(shard), "paused", int(paused))
            await pipe.execute()

    async def is_paused(self) -> bool:
        """Tell whether execution is paused."""
        self.check_loop()
        async with redis_errors():
            value = await self.client.hget(self.keys.control(0), "paused")
        return value == b"1"

    async def decide(
        self,
        run_id: str,
        tool_call_id: str,
        *,
        approve: bool,
        by: str,
        reason: str,
        decision_id: str | None = None,
    ) -> Decision:
        """Approve or deny a governed call waiting for a decision; the first one wins.

        For a harness that authenticates its own operators: ``by`` is whom it
        authenticated. See :meth:`eventstore.decisions.Decisions.decide`.

        Raises:
            InvalidArgument: ``by`` or ``reason`` is empty, not printable or too long.
            NotAwaitingApproval: no such governed call, or it never awaited a decision.
            StoreUnavailable: Redis failed or timed out.

        """
        self.check_loop()
        return await self.decisions.decide(
            run_id,
            tool_call_id,
            approve=approve,
            by=by,
            reason=reason,
            decision_id=decision_id,
        )

    async def pause_run(self, run_id: str, *, by: str, reason: str) -> bool:
        """Pause one run: none of its calls is recorded or dispatched until unpaused.

        Beside the namespace's pause (:meth:`set_paused`); decisions, receipts, replay and
        the console keep working. Who, when and why are kept on the run. False when the
        run is unknown or expired.

        Raises:
            InvalidArgument: ``by`` or ``reason`` is empty, not printable or too long.
            StoreUnavailable: Redis failed or timed out.

        """
        self.check_loop()
        return await self.decisions.set_run_paused(run_id, True, by=by, reason=reason)

    async def unpause_run(self, run_id: str, *, by: str, reason: str) -> bool:
        """Lift one run's pause (who, when and why are kept). False when the run is unknown."""
        self.check_loop()
        return await self.decisions.set_run_paused(run_id, False, by=by, reason=reason)

    async def get(self, run_id: str, tool_call_id: str) -> InvocationRecord | None:
        """Return the canonical record, or None when absent, expired or the ids are unsafe.

        Read-only: never changes the record's expiry.
        """
        self.check_loop()
        if not (is_run_id(run_id) and self.keys.accepts_tool_call_id(tool_call_id)):
            return None
        return await self._reader.get(run_id, tool_call_id)

    async def events(self, run_id: str, tool_call_id: str) -> list[StoredEvent]:
        """Return the invocation's stored events in order (read-only)."""
        self.check_loop()
        if not (is_run_id(run_id) and self.keys.accepts_tool_call_id(tool_call_id)):
            return []
        return await self._reader.events(run_id, tool_call_id)
