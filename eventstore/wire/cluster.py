"""Redis Cluster support: the client a :class:`~eventstore.store.Store` uses on a cluster.

Every key of one run carries the run's shard hash tag, so each script, each read and each
pipeline of the store touches one slot, and the store needs nothing from a cluster but a
client that follows redirects. redis-py's ``RedisCluster`` follows MOVED and ASK itself;
:class:`ClusterClient` adds what the store's guarantees need on top:

* **Slot migrations are waited out.** While a slot moves, a script whose keys are split
  between the two nodes (or that would create a key on the importing node) is answered
  TRYAGAIN, and an ASK redirect can miss because redis-py sends ASKING as a separate
  pooled command. redis-py gives up after sixteen quick attempts (about half a second);
  this client keeps trying for ``redirect_budget_s``. That is safe: TRYAGAIN, MOVED and
  ASK mean the command did not run, and every write is idempotent by event id anyway.
* **In-flight commands are never cut off.** redis-py closes every connection of every
  node after each fifth MOVED reply (``reinitialize_steps``), failing commands that are
  in flight on them; after a slot moved, a busy client sees many MOVED at once. Here a
  MOVED only updates that slot's owner (``reinitialize_steps=0``), connection errors
  still refresh the whole table, and the slot table is loaded before a first burst.
* **Node flags route as asked.** ``execute_command(..., target_nodes="primaries")`` of a
  command redis-py cannot map to a slot fails once the client is initialized (redis-py
  then looks for a key anyway); the flag is resolved into the nodes it names first.
* **A connection error re-reads the slot table only.** After a timeout or a lost
  connection redis-py reloads both of its tables before the next command runs: which
  node serves which slot (``CLUSTER SLOTS``), and where each command's keys are
  (``COMMAND``: every command the server knows, hundreds of entries to parse). The second
  changes only with the servers' version, and a command it does not know still reloads
  it; reloaded after every error, it made the first call after an outage miss a short
  timeout on a busy client.
* **Bursts wait for a connection.** redis-py's asyncio cluster pool raises
  ``MaxConnectionsError`` instead of waiting; here at most ``max_connections`` commands
  are in flight per client, so a burst queues as it does on a single server. Pipelines
  (at most one connection per node each) have a reserve of their own, and so have the
  store's script batcher's lanes (:mod:`eventstore.wire.cluster_batching`), per node.

``Store.client`` stays typed as :class:`redis.asyncio.Redis`: the commands the store
issues exist with the same signatures on ``RedisCluster``, so one type keeps every call
site checked. Cluster-only operations go through ``Store.cluster``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Final, Self, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from redis._parsers import AsyncCommandsParser
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ClusterError, RedisClusterException, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT

from eventstore.errors import InvalidArgument, NotACluster
from eventstore.logs import get_logger
from eventstore.wire.batching import DEFAULT_MAX_LANES
from eventstore.wire.connections import keeping_cancellation

log = get_logger("canon.cluster")

#: URL query parameter that selects the cluster client (``redis://host:port/0?cluster=1``).
CLUSTER_PARAMETER: Final = "cluster"
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})
#: Connections per node kept for pipelines beyond the in-flight command bound.
PIPELINE_RESERVE: Final = 8
#: First and longest pause between two attempts while a slot is in migration.
_FIRST_DELAY_S: Final = 0.01
_MAX_DELAY_S: Final = 0.1


class ClusterClient(RedisCluster):
    """A ``RedisCluster`` that waits out slot migrations and queues bursts.

    Attributes:
        redirect_budget_s: how long one command keeps retrying TRYAGAIN (and redirect
            chains redis-py gave up on) before the error is raised.
        commands_retried: how many times a command was sent again after such an answer.
        max_in_flight: how many commands may be in flight at once; the others wait.

    """

    def __init__(
        self,
        *args: Any,
        redirect_budget_s: float = 2.0,
        max_in_flight: int = 64,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        # Every node's connections (the startup nodes' and those found later) keep a
        # cancellation that redis-py's write would lose (see eventstore.wire.connections).
        manager = self.nodes_manager
        kept = keeping_cancellation(manager.connection_kwargs["connection_class"])
        for options in (self.connection_kwargs, manager.connection_kwargs):
            options["connection_class"] = kept
        for node in manager.startup_nodes.values():
            node.connection_class = kept
        self.redirect_budget_s = redirect_budget_s
        self.commands_retried = 0
        self.max_in_flight = max_in_flight
        self._commands = asyncio.Semaphore(max_in_flight)
        self._pipelines = asyncio.Semaphore(PIPELINE_RESERVE)
        self.commands_parser = _CommandTable()

    def __repr__(self) -> str:
        return f"<ClusterClient commands_retried={self.commands_retried}>"

    async def initialize(self, *args: Any, **kwargs: Any) -> Self:
        """Load the slot table; a server that is no cluster node is said so, in one line.

        Raises:
            NotACluster: the node given answers that its cluster support is disabled.
            ClusterError: no node could be reached or agreed (redis-py's client-side
                ``RedisClusterException``, which is not a Redis error, re-raised as one so
                the store translates it; the connection error stays its cause).

        """
        # Named before: a first load that fails closes the startup nodes.
        nodes = ", ".join(self.nodes_manager.startup_nodes) or "the node given"
        try:
            await super().initialize(*args, **kwargs)
        except RedisClusterException as exc:
            if _cluster_disabled(exc):
                raise NotACluster(nodes) from None
            raise ClusterError(type(exc).__name__) from exc
        return self

    async def execute_command(self, *args: EncodableT, **kwargs: Any) -> Any:
        """Run one command, retrying for a bounded time while its slot is migrating.

        Raises:
            ClusterError: the cluster kept answering TRYAGAIN (or redirecting) past the
                budget, or could not route the command (client-side cluster errors are
                re-raised as this Redis error so the store translates them).

        """
        if self._initialize:
            # Uninitialized, redis-py routes keyed commands to any node; the MOVED storm
            # of a concurrent first burst would make it close in-flight connections.
            await self.initialize()
        flag = kwargs.get("target_nodes")
        if isinstance(flag, str) and self._is_node_flag(flag):
            # Once initialized, redis-py looks for a key slot even when a node flag names
            # the targets ("Missing key" for CONFIG GET ...); named nodes route as asked.
            kwargs["target_nodes"] = self._nodes_of(flag)
        deadline: float | None = None
        delay = _FIRST_DELAY_S
        while True:
            try:
                async with self._commands:
                    return await super().execute_command(*args, **kwargs)
            except (TryAgainError, ClusterError) as exc:
                now = time.monotonic()
                deadline = deadline if deadline is not None else now + self.redirect_budget_s
                if now >= deadline:
                    log.warning("cluster_command_abandoned", error_type=type(exc).__name__)
                    raise
                self.commands_retried += 1
                await asyncio.sleep(min(delay, deadline - now))
                delay = min(delay * 2, _MAX_DELAY_S)
            except RedisClusterException as exc:
                # Not a RedisError: without this it would escape the store's translation.
                raise ClusterError(type(exc).__name__) from exc

    def _nodes_of(self, flag: str) -> list[ClusterNode]:
        if flag == self.PRIMARIES:
            return self.get_primaries()
        if flag == self.REPLICAS:
            return self.get_replicas()
        if flag == self.ALL_NODES:
            return self.get_nodes()
        if flag == self.RANDOM:
            return [self.get_random_node()]
        return [self.get_default_node()]

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> Any:
        """Return a pipeline that waits for a pipeline slot before it executes."""
        if shard_hint:
            raise ClusterError("shard_hint is not supported in cluster mode")
        # redis-py's stubs mark ClusterPipeline abstract (its own pipeline() builds one
        # exactly like this); nothing abstract is left at run time.
        return _BoundedPipeline(self, transaction)  # type: ignore[abstract]


def _cluster_disabled(exc: BaseException) -> bool:
    """Tell whether a failed slot-table load met a server without cluster support.

    redis-py turns the server's ``ERR This instance has cluster support disabled`` into a
    ``RedisClusterException`` of its own, the cause of the one it raises.
    """
    seen: BaseException | None = exc
    while seen is not None:
        text = str(seen)
        if "Cluster mode is not enabled" in text or "cluster support disabled" in text:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class _CommandTable(AsyncCommandsParser):
    """redis-py's table of where each command's keys are, read from the servers once."""

    __slots__ = ()

    async def initialize(self, node: ClusterNode | None = None) -> None:
        """Read the table unless it is loaded; always take ``node`` for key lookups.

        redis-py calls this with the new default node each time it re-reads the slot
        table, and without a node when a command is missing from the table (the servers
        were upgraded), which still reloads it.
        """
        if node is not None and self.commands:
            self.node = node
            return
        await super().initialize(node)


class _BoundedPipeline(ClusterPipeline):
    """A cluster pipeline that counts against its client's pipeline reserve."""

    async def execute(
        self, raise_on_error: bool = True, allow_redirections: bool = True
    ) -> list[Any]:
        client = cast(ClusterClient, self.cluster_client)
        async with client._pipelines:
            return await super().execute(raise_on_error, allow_redirections)


def cluster_client(
    url: str,
    *,
    timeout_s: float = 2.0,
    max_connections: int = 64,
    redirect_budget_s: float | None = None,
) -> ClusterClient:
    """Build a cluster client from the ``redis://`` or ``rediss://`` URL of any node.

    The other nodes are discovered from that one. Commands are bounded by ``timeout_s``;
    connection errors are retried a few times with backoff; at most ``max_connections``
    commands are in flight; a command in a migrating slot keeps retrying for
    ``redirect_budget_s`` (default: ``timeout_s``).
    """
    client = ClusterClient.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(ExponentialBackoff(cap=0.25, base=0.01), 3),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
        max_connections=max_connections + PIPELINE_RESERVE + DEFAULT_MAX_LANES,
        max_in_flight=max_connections,
        reinitialize_steps=0,
        decode_responses=False,
        redirect_budget_s=timeout_s if redirect_budget_s is None else redirect_budget_s,
    )
    assert isinstance(client, ClusterClient)  # from_url is typed as returning the base class
    return client


def split_cluster_parameter(url: str) -> tuple[str, bool]:
    """Remove the ``cluster`` query parameter from ``url``; tell whether it asked for one.

    ``?cluster=1`` lets every tool that takes a URL reach a cluster without a flag of its
    own. The parameter is ours: redis-py would refuse it as an unknown connection option.

    Raises:
        InvalidArgument: the parameter is not one of 1/0, true/false, yes/no, on/off (the
            message never repeats the URL, which may hold a password).

    """
    parts = urlsplit(url)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    values = [value.strip().lower() for name, value in pairs if name == CLUSTER_PARAMETER]
    if not values:
        return url, False
    if any(value not in _TRUE | _FALSE for value in values):
        raise InvalidArgument("the cluster URL parameter must be 1 or 0 (true/false, yes/no)")
    rest = urlencode([(name, value) for name, value in pairs if name != CLUSTER_PARAMETER])
    return urlunsplit(parts._replace(query=rest)), values[-1] in _TRUE


def store_client(client: Redis | RedisCluster) -> Redis:
    """Return ``client`` typed as the one client type the store's modules are written for.

    A ``RedisCluster`` offers the same command methods (and a non-transactional pipeline
    across slots); what differs is only routing, which its keys' hash tags make local.
    """
    return cast(Redis, client)


def cluster_of(client: Redis | RedisCluster) -> RedisCluster | None:
    """Return ``client`` when it is a cluster client, else None."""
    return client if isinstance(client, RedisCluster) else None
