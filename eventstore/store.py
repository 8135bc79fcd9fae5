"""``Store``: one namespace of canonical records on one Redis (or Redis Cluster).

The store wires the key layout, the scripts, the Writer, the Reader and the run registry
onto one client, configured by one :class:`~eventstore.settings.StoreSettings`. Redis
access stays inside this package and the packages built on it (see the seam in the
:class:`Store` docstring); nothing agent-facing exposes it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from types import TracebackType
from typing import Any, Concatenate, Final, ParamSpec, Self, TypeVar, Unpack, cast

import msgspec
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from eventstore.decisions import Decision, DecisionRequest, Decisions
from eventstore.erasure import Erasure, erase_run
from eventstore.errors import (
    NamespaceMismatch,
    NoSuchDatabase,
    StoreUnavailable,
    WrongEventLoop,
    redis_errors,
)
from eventstore.keyring import Keyring
from eventstore.reader import InvocationRecord, Reader, StoredEvent
from eventstore.runs import Deadline, OpenedRun, Refusal, RunInfo, RunRegistry, deadline_ms
from eventstore.sealing import Seals
from eventstore.server.durability import DurabilityMode, DurabilityReport, check_durability
from eventstore.settings import (
    DEFAULT_TTL,
    FEED_GRACE,
    StoreOptions,
    StoreSettings,
)
from eventstore.settlements import Settlement, SettlementRequest, Settlements
from eventstore.wire.batching import ScriptBatcher, ScriptCalls
from eventstore.wire.cluster import (
    cluster_client,
    cluster_of,
    split_cluster_parameter,
    store_client,
)
from eventstore.wire.cluster_batching import ClusterScriptBatcher
from eventstore.wire.connections import StorePool, keeping_cancellation
from eventstore.wire.exchange import BatchStats
from eventstore.wire.keys import LAYOUT, LAYOUTS, LEGACY_LAYOUT, Keys
from eventstore.wire.replication import ReplicaAcknowledgedCalls, validate_replicas
from eventstore.wire.scripts import Scripts
from eventstore.writer import Writer, now_ms
from machine.ids import is_run_id
from machine.limits import Limits, decode_limits, encode_limits

__all__ = ["DEFAULT_TTL", "FEED_GRACE", "Store", "StoreSettings"]

#: Connections (on a cluster, commands in flight) of a store built by ``from_url``; a
#: cluster store adds two per shard for the projection workers' blocking reads.
DEFAULT_MAX_CONNECTIONS = 64


_P = ParamSpec("_P")
_R = TypeVar("_R")


def server_address(client: Redis | RedisCluster) -> tuple[str, int | None]:
    """Where ``client`` connects: ``host:port`` (or ``unix socket PATH``), and its database.

    Read from the client's settings, never from its URL: no user name or password. On a
    cluster, the nodes it was given (and no database).
    """
    cluster = cluster_of(client)
    if cluster is not None:
        return ", ".join(cluster.nodes_manager.startup_nodes) or "a Redis Cluster", None
    settings = cast(Redis, client).connection_pool.connection_kwargs
    database = settings.get("db")
    number = int(database) if isinstance(database, int | str) and str(database).isdigit() else 0
    if settings.get("path"):
        return f"unix socket {settings['path']}", number
    return f"{settings.get('host', 'localhost')}:{settings.get('port', 6379)}", number


def _naming_server(
    method: Callable[Concatenate[Store, _P], Awaitable[_R]],
) -> Callable[Concatenate[Store, _P], Coroutine[Any, Any, _R]]:
    """A public method of the store whose :class:`StoreUnavailable` names the server."""

    @functools.wraps(method)
    async def named(store: Store, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return await method(store, *args, **kwargs)
        except StoreUnavailable as exc:
            store.name_server(exc)
            raise

    return named


def namespace_keys(keys: Keys, layout: bytes | None) -> Keys:
    """Return ``keys`` in the layout a namespace's metadata names (None: the legacy one).

    Raises:
        NamespaceMismatch: the metadata names a layout this version does not know.

    """
    number = LEGACY_LAYOUT if layout is None else int(layout) if layout.isdigit() else 0
    if number not in LAYOUTS:
        raise NamespaceMismatch("namespace uses a key layout this version does not know")
    return keys if number == keys.layout else Keys(keys.namespace, keys.shards, number)


#: ``{ns}:meta`` field of the limits the namespace's records were written under.
NAMESPACE_LIMITS_FIELD: Final = "limits"


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
    * ``keyring`` and ``seals``: the keyring payloads are encrypted with, and the runs'
      data keys (:mod:`eventstore.sealing`), both None without one: for the audit tools
      that open payloads, ``canon keys rewrap`` and the console's ``encrypted`` label.

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
        *,
        keys: Keyring | None = None,
        **options: Unpack[StoreOptions],
    ) -> None:
        """Build a store on ``client`` with ``settings``, and ``options`` on top of them.

        ``keys``: a keyring (:mod:`eventstore.keyring`): payloads are then encrypted at
        rest, and read back opened (see :meth:`from_url`).

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
        #: Where the store connects (``host:port``, ``unix socket PATH``, or the cluster
        #: nodes it was given), and the database number (None on a cluster): what its
        #: :class:`~eventstore.errors.StoreUnavailable` errors name. Never a password.
        self.address, self.database = server_address(client)
        self.cluster = cluster_of(client)
        self.client = store_client(client)
        self._batcher: ScriptCalls
        if settings.replicas:
            self._batcher = ReplicaAcknowledgedCalls(
                self.client, replicas=settings.replicas, timeout_ms=settings.replica_timeout_ms
            )
        elif self.cluster is not None:  # one batcher per primary, calls routed by slot
            self._batcher = ClusterScriptBatcher(self.cluster)
        else:
            self._batcher = ScriptBatcher(self.client)
        self._scripts = Scripts(self.client, self._batcher)
        #: The keyring payloads are encrypted with, or None (stored as given).
        self.keyring = keys
        self.use_keys(Keys(settings.namespace, settings.shard_count))
        self._loop: asyncio.AbstractEventLoop | None = None

    def use_keys(self, keys: Keys) -> None:
        """Read and write through ``keys`` from now on (another layout of the namespace).

        :meth:`check_namespace` calls it with the layout the namespace records; the
        read-only audit tools do the same.
        """
        self.keys = keys
        #: The runs' data keys (None without a keyring), shared by writer and reader.
        self.seals = (
            None if self.keyring is None else Seals(self.client, keys, self._scripts, self.keyring)
        )
        self.writer = Writer(
            self.client,
            keys,
            self._scripts,
            ttl_ms=self.settings.ttl_ms,
            feed_retention_ms=self.settings.feed_retention_ms,
            refusals_kept=self.settings.refusals_kept,
            lease_ms=self.settings.lease_ms,
            seals=self.seals,
        )
        self._reader = Reader(self.client, keys, self.seals)
        # Writes that outlived their caller (see finish_before_closing).
        self._finishing: set[asyncio.Task[Any]] = set()
        self.runs = RunRegistry(self.client, keys, self._scripts, ttl_ms=self.settings.ttl_ms)
        #: Operators' decisions and runs' pause switches (:mod:`eventstore.decisions`).
        self.decisions = Decisions(self._reader, self.writer, self.runs, self.settings.limits)
        #: Operators' settlements of calls whose process died, and calls requested again
        #: (:mod:`eventstore.settlements`).
        self.settlements = Settlements(self._reader, self.writer, self.settings.ttl_ms)

    @classmethod
    def from_url(
        cls,
        url: str,
        settings: StoreSettings | None = None,
        *,
        max_connections: int | None = None,
        cluster: bool = False,
        keys: Keyring | None = None,
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

        With ``keys`` (a :class:`~eventstore.keyring.Keyring`), every payload (request,
        frozen arguments, raw response, agent result, failure detail, settlement
        evidence) is encrypted before it leaves the process, with a data key per run
        wrapped by the keyring's current key; reads through this store open them. Without
        one, payloads are stored as given (see ``docs/encryption.md``).

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
            pool = StorePool.from_url(
                url,
                timeout=timeout_s,
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
                retry=Retry(ExponentialBackoff(cap=0.25, base=0.01), 3),
                retry_on_error=[RedisConnectionError, RedisTimeoutError],
                max_connections=max_connections or DEFAULT_MAX_CONNECTIONS,
                decode_responses=False,
            )
            # (The scheme chose the class: plain, TLS or unix socket.)
            pool.connection_class = keeping_cancellation(pool.connection_class)
            client = Redis.from_pool(pool)
        return cls(client, settings, keys=keys)

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

    def name_server(self, error: StoreUnavailable) -> None:
        """Name this store's server (and database) in ``error``, unless it names one."""
        if error.server is None:
            error.server = self.address
        if isinstance(error, NoSuchDatabase) and error.database is None:
            error.database = self.database

    @_naming_server
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
        """Close the connection pool, once the writes under way are done.

        First the writes that outlived their callers end (see
        :meth:`finish_before_closing`), then every script call already made is answered.
        """
        self.check_loop()
        try:
            if self._finishing:  # each bounded by its own timeout
                await asyncio.wait(set(self._finishing))
            await self._batcher.close()
        finally:
            # Also when the close is cancelled while calls are answered: no connection
            # is left open for the garbage collector to find.
            await self.client.aclose()

    def finish_before_closing(self, task: asyncio.Task[Any]) -> None:
        """Make :meth:`aclose` wait for ``task``, a write that outlived its caller.

        The closing of a call cut short goes on after a second cancellation of its caller
        (:mod:`eventstore.boundary.interrupts`); a store closed meanwhile would otherwise
        see its write reopen a connection the close had closed, and leave it open.
        """
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    @_naming_server
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
            if self.settings.limits != Limits() and not self.settings.read_only:
                # Limits of its own (canon mcp-proxy's suit files and images): recorded, so
                # every reader judges this namespace's records by them (namespace_limits).
                await self.client.hset(
                    meta, NAMESPACE_LIMITS_FIELD, encode_limits(self.settings.limits)
                )
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

    @_naming_server
    async def namespace_limits(self) -> Limits:
        """The limits the namespace's records were written under (read-only, no TTL touched).

        Those a store opened with limits of its own recorded (the latest such store's, as
        ``canon mcp-proxy`` records its flags' sizes), else this store's own: what the
        console judges a record's sizes by.

        Raises:
            StoreUnavailable: Redis failed or timed out.

        """
        self.check_loop()
        async with redis_errors():
            stored = cast(
                bytes | None, await self.client.hget(self.keys.meta(), NAMESPACE_LIMITS_FIELD)
            )
        if stored is None:
            return self.settings.limits
        try:
            return decode_limits(stored)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
            return self.settings.limits

    @_naming_server
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

    @_naming_server
    async def open_run(
        self,
        run_id: str,
        *,
        deadline: Deadline,
        budget: int | None = None,
        tools: Mapping[str, int | None] | None = None,
    ) -> OpenedRun:
        """Register a run; see :meth:`RunRegistry.open`.

        ``deadline`` is how long from now the run accepts calls (a ``timedelta``, or a
        number of seconds such as ``300``), or when it stops (a timezone-aware
        ``datetime``).

        Raises:
            InvalidArgument: ``deadline`` is none of those (a naive ``datetime``, a string,
                NaN ...), or the run id, a tool name or a budget is not acceptable.
            DeadlinePassed: the deadline has passed (an InvalidArgument).
            RunExists: the run id is already registered.
            StoreUnavailable: Redis failed or timed out.

        """
        self.check_loop()
        absolute_ms = deadline_ms(deadline, now_ms())
        return await self.runs.open(run_id, deadline_ms=absolute_ms, budget=budget, tools=tools)

    @_naming_server
    async def close_run(self, run_id: str) -> bool:
        """Mark a run inactive; False when the run is unknown."""
        self.check_loop()
        return await self.runs.close(run_id)

    @_naming_server
    async def revoke_token(self, run_id: str) -> bool:
        """Withdraw a run's access token (receipts stop answering it); False when unknown."""
        self.check_loop()
        return await self.runs.revoke_token(run_id)

    @_naming_server
    async def run_info(self, run_id: str) -> RunInfo | None:
        """Return a run's registry entry, or None."""
        self.check_loop()
        return await self.runs.info(run_id)

    @_naming_server
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

    @_naming_server
    async def set_paused(self, paused: bool) -> None:
        """Pause or resume tool execution in the whole namespace (every shard's switch)."""
        self.check_loop()
        async with redis_errors(), self.client.pipeline(transaction=False) as pipe:
            for shard in range(self.keys.shards):
                pipe.hset(self.keys.control(shard), "paused", int(paused))
            await pipe.execute()

    @_naming_server
    async def is_paused(self) -> bool:
        """Tell whether execution is paused."""
        self.check_loop()
        async with redis_errors():
            value = await self.client.hget(self.keys.control(0), "paused")
        return value == b"1"

    @_naming_server
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
        authenticated, and is recorded as the approver as given (canon's own operator
        doors pass the name an operator's credential names instead). The identity that
        requested the call never approves it; a call that needs several approvals gets
        each from a distinct ``by``. See :meth:`eventstore.decisions.Decisions.decide`.

        Raises:
            InvalidArgument: ``by`` or ``reason`` is empty, not printable or too long, or
                ``by`` is a run's identity (``run:...``).
            RequesterCannotApprove: ``by`` requested the call.
            NotAwaitingApproval: no such governed call, or it never awaited a decision.
            StoreUnavailable: Redis failed or timed out.

        """
        self.check_loop()
        return await self.decisions.decide(
            run_id,
            tool_call_id,
            DecisionRequest(
                approve=approve,
                by=by,
                reason=reason,
                decision_id=decision_id,
            ),
        )

    @_naming_server
    async def erase_run(
        self, run_id: str, *, by: str, reason: str, wait_s: float = 30.0, force: bool = False
    ) -> Erasure:
        """Erase a run's payloads from Redis, atomically, leaving its tombstone.

        Closes the run; deletes the request, raw response, agent result and failure
        detail of each of its records, and the run's data key when payloads are
        encrypted (every other copy of them is then unreadable); keeps who, when and why
        on the run. Events,
        digests and the chain stay, so replay and verify judge the run intact and say
        it was erased; a governed call of it never runs (``RUN_ERASED``). Waits up to
        ``wait_s`` for calls still running (``force`` erases them too). See
        :mod:`eventstore.erasure`.

        Raises:
            InvalidArgument: an unsafe run id, or ``by``/``reason`` empty or too long.
            RunNotFound: the run is not in Redis.
            CallsInFlight: a call was still running after ``wait_s``.
            StoreUnavailable: Redis failed or timed out.

        """
        self.check_loop()
        erasure = await erase_run(
            self.client,
            self.keys,
            self._scripts,
            run_id,
            by=by,
            reason=reason,
            wait_s=wait_s,
            force=force,
        )
        if self.seals is not None:
            self.seals.forget(run_id)  # its data key is deleted: not kept here either
        return erasure

    @_naming_server
    async def settle(
        self,
        run_id: str,
        tool_call_id: str,
        *,
        executed: bool,
        by: str,
        evidence: str,
    ) -> Settlement:
        """Settle a call whose process died after its dispatch: it ran, or it did not.

        For a harness that authenticates its own operators (canon's doors pass the name
        an operator's credential names): ``by`` is recorded as given, with the digest of
        ``evidence``, in the call's chain. The call ends ERROR RECONCILED_EXECUTED (it
        ran; its result is not recorded) or RECONCILED_NOT_EXECUTED (it did not run; it
        is never run again by itself), once its lease lapsed; the first settlement wins.
        See :meth:`eventstore.settlements.Settlements.settle`.

        Raises:
            InvalidArgument: ``by`` or ``evidence`` is empty, not printable or too long.
            NotInFlight: no such call, or it is not in flight.
            CallStillRunning: its process still holds its lease.
            RawResponseRecorded: settled as not executed, but its raw response is recorded.
            StoreUnavailable: Redis failed or timed out.

        """
        self.check_loop()
        return await self.settlements.settle(
            run_id,
            tool_call_id,
            SettlementRequest(executed=executed, by=by, evidence=evidence),
        )

    @_naming_server
    async def pause_run(self, run_id: str, *, by: str, reason: str) -> bool:
        """Pause one run: none of its calls is recorded or dispatched until unpaused.

        Beside the namespace's pause (:meth:`set_paused`); decisions, receipts, replay and
        the console keep working. Who, when and why are kept on the run; a run paused
        already stays paused as it was (its who, why and when are kept). False when the
        run is unknown or expired (``store.decisions.set_run_paused`` says more).

        Raises:
            InvalidArgument: ``by`` or ``reason`` is empty, not printable or too long.
            RunClosed: the run is closed or past its deadline.
            StoreUnavailable: Redis failed or timed out.

        """
        self.check_loop()
        done = await self.decisions.set_run_paused(run_id, True, by=by, reason=reason)
        return done is not None

    @_naming_server
    async def unpause_run(self, run_id: str, *, by: str, reason: str) -> bool:
        """Lift one run's pause (who, when and why are kept). False when the run is unknown."""
        self.check_loop()
        done = await self.decisions.set_run_paused(run_id, False, by=by, reason=reason)
        return done is not None

    @_naming_server
    async def get(self, run_id: str, tool_call_id: str) -> InvocationRecord | None:
        """Return the canonical record, or None when absent, expired or the ids are unsafe.

        Read-only: never changes the record's expiry.
        """
        self.check_loop()
        if not (is_run_id(run_id) and self.keys.accepts_tool_call_id(tool_call_id)):
            return None
        return await self._reader.get(run_id, tool_call_id)

    @_naming_server
    async def events(self, run_id: str, tool_call_id: str) -> list[StoredEvent]:
        """Return the invocation's stored events in order (read-only)."""
        self.check_loop()
        if not (is_run_id(run_id) and self.keys.accepts_tool_call_id(tool_call_id)):
            return []
        return await self._reader.events(run_id, tool_call_id)
