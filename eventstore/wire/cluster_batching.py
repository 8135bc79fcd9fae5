"""Auto-pipelining on a Redis Cluster: one batcher per primary, calls routed by slot.

Every key of one script call carries its run's shard hash tag, so a call touches one
slot (``keyslot(keys[0])``) and one primary serves it. :class:`ClusterScriptBatcher`
keeps one :class:`~eventstore.wire.batching.ScriptBatcher` per primary, over that node's
own connections, and hands each call to the batcher of its slot's owner (redis-py's slot
table): calls for one node in one turn of the loop share its pipelines, as on a single
server, with kept connections and replies read by a :class:`~eventstore.wire.pipe.Pipe`.
A node carries only its share of the calls, so its pipelines are sized for that
(:data:`NODE_SIZING`): sized as one server's, N masters would each send pipelines N times
smaller, and every round trip's fixed costs, on the client and on Redis, would be paid N
times as often.
What redis-py's cluster ``execute_command`` does per call (its routing, a connection
taken from the node's pool and given back, its reply parsing, its retry frames) is done
here once per pipeline or not at all.

A reply is one call's own, so redirects are handled per call, never per pipeline:

* **MOVED**: the slot's owner is updated in redis-py's table (``move_slot``) and the call
  goes to the new owner's batcher.
* **ASK**: the call is sent once to the node named, as ``ASKING`` then ``EVALSHA`` on one
  connection, outside the batchers (a pipeline cannot carry ASKING for one call only).
* **TRYAGAIN, CLUSTERDOWN** (a slot in migration, a failover): the call is sent again
  after a short pause.
* **A connection error or timeout** (the node's connections retry nothing themselves):
  the slot table is read again and the call re-sent, with the client's ``Retry``'s
  count and a backoff.

A MOVED, ASK, TRYAGAIN or CLUSTERDOWN reply means the script did not run, so the re-sent
call is applied once. A call cut off by a connection error may have run; its re-send is
answered "applied" because the store's scripts are idempotent by event id. Redirects
and pauses stop after ``redirect_budget_s``: then the last error is the caller's.
NOSCRIPT is answered per node by that node's batcher (or, for an ASK, on the connection
that carried it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from typing import Any, Final, cast

import hiredis
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import Connection
from redis.commands.core import AsyncScript
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    MovedError,
    NoScriptError,
    RedisClusterUnreachableError,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT, KeyT

from eventstore.logs import get_logger
from eventstore.wire.batching import DEFAULT_MAX_LANES, LoadSizing, ScriptBatcher, Sent
from eventstore.wire.exchange import BatchStats, pack_evalsha

log = get_logger("canon.cluster_batching")

#: Replies and errors after which a call is sent again (see the module doc).
_REDIRECTS: Final = (AskError, TryAgainError, ClusterDownError, SlotNotCoveredError)
#: A refresh of the slot table that reached no node counts as one more connection error.
_CONNECTION_ERRORS: Final = (RedisConnectionError, RedisTimeoutError, RedisClusterUnreachableError)
_RESENT: Final = (*_REDIRECTS, *_CONNECTION_ERRORS)
_ASKING: Final = cast(bytes, hiredis.pack_command(("ASKING",)))
#: First and longest pause before a call answered TRYAGAIN or CLUSTERDOWN is sent again.
_FIRST_DELAY_S: Final = 0.01
_MAX_DELAY_S: Final = 0.1
#: A node's pipelines: about two in flight, up to 16 calls each. On 3 masters at 64 tasks
#: they carry about 8 calls per round trip, as one server's do at the same load, where a
#: single server's sizing gave about 4.3 (docs/perf-log/2026-12-cluster-pipelining.md).
NODE_SIZING: Final = LoadSizing(pipelines=2, fewest=4, most=16)


class _NodePool:
    """One cluster node's connections, as a batcher takes them (``ConnectionSource``)."""

    __slots__ = ("max_connections", "node")

    def __init__(self, node: ClusterNode) -> None:
        self.node = node
        self.max_connections = node.max_connections

    async def get_connection(self) -> Connection:
        """A connection of the node (redis-py's ``MaxConnectionsError`` when none is left)."""
        return self.node.acquire_connection()

    async def release(self, connection: Connection) -> None:
        """Give ``connection`` back to the node."""
        self.node.release(connection)


class ClusterScriptBatcher:
    """Coalesces concurrent script calls on a cluster client into pipelines per primary.

    The same interface as :class:`~eventstore.wire.batching.ScriptBatcher` (``call``,
    ``drain``, ``close``, ``stats``), and meant, like it, for idempotent scripts only.

    Args:
        cluster: the cluster client; its slot table routes each call.
        max_batch: commands per pipeline, per node (see ``ScriptBatcher``).
        max_lanes: pipelines in flight at once, per node.
        redirect_budget_s: how long one call keeps following redirects and waiting out
            TRYAGAIN (default: the client's own ``redirect_budget_s``, else 2 s).

    """

    def __init__(
        self,
        cluster: RedisCluster,
        *,
        max_batch: int | None = None,
        max_lanes: int = DEFAULT_MAX_LANES,
        redirect_budget_s: float | None = None,
    ) -> None:
        self._cluster = cluster
        self._max_batch = max_batch
        self._max_lanes = max_lanes
        if redirect_budget_s is None:
            redirect_budget_s = float(getattr(cluster, "redirect_budget_s", 2.0))
        self.redirect_budget_s = redirect_budget_s
        # By node name: the node object it was built for, and its batcher.
        self._batchers: dict[str, tuple[ClusterNode, ScriptBatcher]] = {}
        self._retired: list[ScriptBatcher] = []  # for nodes the slot table has replaced
        self.stats = BatchStats()

    @property
    def batching(self) -> bool:
        """Whether calls are coalesced (always, per node)."""
        return True

    def __repr__(self) -> str:
        s = self.stats
        return (
            f"<ClusterScriptBatcher nodes={len(self._batchers)} calls={s.calls} "
            f"round_trips={s.round_trips} redirects={s.redirects}>"
        )

    async def call(
        self, script: AsyncScript, keys: Sequence[KeyT], args: Iterable[EncodableT]
    ) -> Any:
        """Run ``script`` on the primary of ``keys``'s slot, in that node's pipelines.

        Returns:
            The script's reply, exactly as ``EVALSHA`` returns it.

        Raises:
            redis.exceptions.RedisError: this call's own error reply, or the redirect or
                connection error still answered when the retries ran out.

        """
        cluster = self._cluster
        if cluster._initialize:  # the slot table is loaded before a first burst
            await cluster.initialize()
        args = tuple(args)  # sent again after a redirect
        slot = cluster.keyslot(keys[0])
        try:
            node = cluster.nodes_manager.get_node_from_slot(slot)
            return await self._batcher_of(node).call(script, keys, args)
        except _RESENT as exc:
            return await self._resend(exc, slot, script, keys, args)

    async def send(
        self, script: AsyncScript, keys: Sequence[KeyT], args: Iterable[EncodableT]
    ) -> ClusterSent:
        """Write ``script``'s call on its slot's primary now; see :meth:`ScriptBatcher.send`.

        Raises:
            redis.exceptions.RedisError: the call was answered here and failed past its
                redirects and retries.

        """
        cluster = self._cluster
        if cluster._initialize:
            await cluster.initialize()
        args = tuple(args)
        slot = cluster.keyslot(keys[0])
        first = (script, keys, args)
        try:
            node = cluster.nodes_manager.get_node_from_slot(slot)
            return ClusterSent(self, slot, first, await self._batcher_of(node).send(*first))
        except _RESENT as exc:
            return ClusterSent(self, slot, first, None, await self._resend(exc, slot, *first))

    async def drain(self) -> None:
        """Wait until every call already made has been answered."""
        batchers = [batcher for _, batcher in self._batchers.values()]
        await asyncio.gather(*(batcher.drain() for batcher in [*batchers, *self._retired]))

    async def close(self) -> None:
        """Answer every call already made, then give every kept connection back."""
        batchers = [batcher for _, batcher in self._batchers.values()]
        for batcher in [*batchers, *self._retired]:
            await batcher.close()
        self._batchers.clear()
        self._retired.clear()

    def _batcher_of(self, node: ClusterNode) -> ScriptBatcher:
        entry = self._batchers.get(node.name)
        if entry is not None and entry[0] is node:
            return entry[1]
        if entry is not None:  # the slot table was read again and holds a new node object
            self._retired.append(entry[1])
        batcher = ScriptBatcher(
            cast(Redis, self._cluster),
            max_batch=self._max_batch,
            max_lanes=self._max_lanes,
            pool=_NodePool(node),
            sizing=NODE_SIZING,
        )
        batcher.stats = self.stats  # one set of counters for every node
        self._batchers[node.name] = (node, batcher)
        return batcher

    async def _resend(
        self,
        error: Exception,
        slot: int,
        script: AsyncScript,
        keys: Sequence[KeyT],
        args: tuple[EncodableT, ...],
    ) -> Any:
        """Send a call again after ``error`` until it is answered (see the module doc)."""
        cluster = self._cluster
        deadline = time.monotonic() + self.redirect_budget_s
        delay = _FIRST_DELAY_S
        failures = 0
        while True:
            self.stats.redirects += 1
            ask: ClusterNode | None = None
            if isinstance(error, MovedError):
                await cluster.nodes_manager.move_slot(_with_host(error, cluster, slot))
            elif isinstance(error, AskError):
                ask = _node_at(cluster, _with_host(error, cluster, slot))
            elif isinstance(error, _CONNECTION_ERRORS):
                failures += 1
                if failures > cluster.retry.get_retries():
                    raise _redis_error(error)
                await asyncio.sleep(min(delay * failures, _MAX_DELAY_S))
                unreached = await _read_slots_again(cluster)
                if unreached is not None:
                    error = unreached
                    continue
            else:  # TRYAGAIN, CLUSTERDOWN, a slot not covered: wait, then look again
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    log.warning("cluster_call_abandoned", error_type=type(error).__name__)
                    raise _redis_error(error)
                await asyncio.sleep(min(delay, remaining))
                delay = min(delay * 2, _MAX_DELAY_S)
                if isinstance(error, (ClusterDownError, SlotNotCoveredError)):
                    unreached = await _read_slots_again(cluster)
                    if unreached is not None:
                        error = unreached
                        continue
            if time.monotonic() >= deadline:
                log.warning("cluster_call_abandoned", error_type=type(error).__name__)
                raise _redis_error(error)
            try:
                if ask is not None:
                    return await self._asking(ask, script, keys, args)
                node = cluster.nodes_manager.get_node_from_slot(slot)
                self.stats.calls -= 1  # sent again, still one call
                return await self._batcher_of(node).call(script, keys, args)
            except _RESENT as exc:
                error = exc

    async def _asking(
        self,
        node: ClusterNode,
        script: AsyncScript,
        keys: Sequence[KeyT],
        args: tuple[EncodableT, ...],
    ) -> Any:
        """Send one call to ``node`` as ``ASKING`` + ``EVALSHA`` on one of its connections.

        NOSCRIPT loads the script on that connection and sends the pair once more.
        """
        packed_args = (len(keys), *keys, *args)
        connection = node.acquire_connection()
        try:
            for attempt in range(2):
                self.stats.round_trips += 1
                await connection.send_packed_command(
                    [_ASKING, pack_evalsha(script.sha, packed_args)], check_health=False
                )
                asked, reply = [await _reply(connection), await _reply(connection)]
                if isinstance(asked, Exception):
                    raise asked
                if isinstance(reply, NoScriptError) and attempt == 0:
                    await connection.send_command("SCRIPT", "LOAD", script.script)
                    script.sha = _text(await connection.read_response())
                    self.stats.reloads += 1
                    continue
                if isinstance(reply, Exception):
                    raise reply
                return reply
            raise NoScriptError("the script was refused after it was loaded")  # pragma: no cover
        except BaseException as exc:
            if not isinstance(exc, ResponseError):  # cut off: replies may still be due
                await connection.disconnect(nowait=True)
            raise
        finally:
            node.release(connection)


class ClusterSent:
    """A call written ahead of its answer on one node (:class:`~eventstore.wire.batching.Sent`).

    A redirect or a connection error of the pair sends the first again (alone, as
    :meth:`ClusterScriptBatcher.call` would), then the second: still in order.
    """

    __slots__ = ("_batcher", "_first", "_reply", "_sent", "_slot")

    def __init__(
        self,
        batcher: ClusterScriptBatcher,
        slot: int,
        first: tuple[AsyncScript, Sequence[KeyT], tuple[EncodableT, ...]],
        sent: Sent | None,
        reply: Any = None,
    ) -> None:
        self._batcher = batcher
        self._slot = slot
        self._first = first
        self._sent = sent
        self._reply = reply  # when sent is None: the first's reply, answered already

    async def then(
        self, script: AsyncScript, keys: Sequence[KeyT], args: Iterable[EncodableT]
    ) -> tuple[Any, Any]:
        """Send the call that follows; both replies, in order (see :meth:`Sent.then`)."""
        batcher = self._batcher
        if self._sent is not None:
            try:
                return await self._sent.then(script, keys, args)
            except _RESENT as exc:
                self._reply = await batcher._resend(exc, self._slot, *self._first)
        return self._reply, await batcher.call(script, keys, args)

    async def answer(self) -> Any:
        """The first call's reply alone (see :meth:`Sent.answer`)."""
        if self._sent is not None:
            try:
                return await self._sent.answer()
            except _RESENT as exc:
                return await self._batcher._resend(exc, self._slot, *self._first)
        return self._reply


async def _read_slots_again(cluster: RedisCluster) -> Exception | None:
    """Read the slot table again; the error if no node answered (None: read).

    A refresh that reaches no node (all of them stalled, or cut off while it asked) is
    one more connection error for the call that needed it, tried again within the
    client's retries, not an error of its own that would escape them.
    """
    try:
        await cluster.nodes_manager.initialize()
    except _CONNECTION_ERRORS as exc:
        return exc
    return None


async def _reply(connection: Connection) -> Any:
    """The next reply on ``connection``; an error reply returned in its place."""
    try:
        return await connection.read_response()
    except ResponseError as exc:
        return exc


def _redis_error(error: Exception) -> Exception:
    """``error`` as a Redis error the store translates (a slot not covered is not one)."""
    if isinstance(error, RedisError):
        return error
    wrapped = ClusterError(type(error).__name__)
    wrapped.__cause__ = error
    return wrapped


def _text(reply: Any) -> str:
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def _with_host(error: AskError, cluster: RedisCluster, slot: int) -> AskError:
    """``error`` with its host filled in (``MOVED 12 :6380`` names only a port)."""
    if not error.host:
        node = cluster.nodes_manager.get_node_from_slot(slot)
        error.host = node.host
        error.node_addr = (error.host, error.port)
    return error


def _node_at(cluster: RedisCluster, error: AskError) -> ClusterNode:
    """The node an ASK redirect names, added to the client's table if it is new."""
    host, port = cluster.nodes_manager.remap_host_port(error.host, error.port)
    node = cluster.nodes_manager.get_node(host=host, port=port)
    if node is None:
        node = ClusterNode(host, port, "primary", **cluster.nodes_manager.connection_kwargs)
        cluster.nodes_manager.set_nodes(cluster.nodes_manager.nodes_cache, {node.name: node})
    return node
