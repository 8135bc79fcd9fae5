"""Durability preflight: could the server lose or evict what the store commits?

A store trusts Redis to keep every committed event. At start (``Store.__aenter__``, so the
writer and every ``canon workers`` process) :func:`check_durability` reads ``appendonly``,
``appendfsync`` and ``maxmemory-policy`` with ``CONFIG GET`` (or, when an ACL or a managed
service forbids CONFIG, the ``INFO persistence`` and ``INFO memory`` sections) and judges:

==================================== ===================================================
risk                                 why records could be lost or evicted
==================================== ===================================================
``appendonly=no``                    a restart loses everything since the last snapshot
``appendfsync=no``                   the OS flushes when it likes: a host crash loses
                                     up to about 30 seconds of commits
``maxmemory-policy=<policy>``        any policy but ``noeviction`` may evict records and
                                     streams (``volatile-*`` ones pick exactly them)
``replicas=<connected>/<required>``  fewer replicas connected than appends must reach
==================================== ===================================================

A setting that cannot be read is *unverified*. Mode ``warn`` (the default) logs one
``durability_warning`` (once per process for a server and what it reports, not at every
store open); ``strict`` raises :class:`DurabilityError` for any risk or
unverified setting; ``off`` reads nothing. The server is told apart with commands the
documented ACL users may run (docs/acl.md): its address and data directory (``CONFIG GET
dir``, read with the settings), or its ``run_id`` when only INFO is allowed, never a
command the user was not seen to be granted. ``appendfsync everysec`` is accepted: it loses
at most about one second of commits, and only when the host itself fails.

With ``replicas=N`` the preflight also counts the connected replicas; making each append
wait for them is :mod:`eventstore.wire.replication`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, cast

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from eventstore.errors import CanonError, InvalidArgument, redis_errors
from eventstore.logs import get_logger
from eventstore.server.config_checks import SETTING_NAMES, server_settings_warnings
from eventstore.wire.replies import reply_text

log = get_logger("canon.durability")

DurabilityMode = Literal["off", "warn", "strict"]
MODES: Final = ("off", "warn", "strict")
#: Settings the preflight judges; the cost settings of ``server_settings`` are read too.
DURABILITY_SETTINGS: Final = ("appendonly", "appendfsync", "maxmemory-policy")
#: Read with the settings only to tell servers apart (never judged, never logged).
_IDENTITY_SETTINGS: Final = ("dir",)


class DurabilityError(CanonError):
    """Raised when, in strict mode, the server could lose or evict records.

    Attributes:
        risks: the risks found (see the module table) and ``<setting>=unverified`` for
            settings that could not be read. Names and values of settings only.

    """

    def __init__(self, risks: Sequence[str]) -> None:
        self.risks = tuple(risks)
        super().__init__(
            "the Redis server could lose or evict records ("
            + ", ".join(self.risks)
            + "); see docs/guarantees.md"
        )


@dataclass(frozen=True, slots=True)
class DurabilityReport:
    """What the server says about persistence, eviction and replicas (None: unreadable).

    Attributes:
        appendonly: ``yes`` or ``no``.
        appendfsync: ``always``, ``everysec`` or ``no``.
        maxmemory_policy: the eviction policy.
        connected_replicas: replicas connected to the server.
        replicas_required: replicas every append must reach (0: no WAIT).
        source: ``config`` (CONFIG GET), ``info`` (INFO fallback) or ``none``.
        setting_warnings: cost warnings of :func:`server_settings_warnings`.

    """

    appendonly: str | None
    appendfsync: str | None
    maxmemory_policy: str | None
    connected_replicas: int | None
    replicas_required: int = 0
    source: str = "config"
    setting_warnings: tuple[str, ...] = field(default=())

    @property
    def risks(self) -> list[str]:
        """Settings known to put committed records at risk, as ``name=value``."""
        risks = []
        if self.appendonly == "no":
            risks.append("appendonly=no")
        if self.appendonly != "no" and self.appendfsync == "no":
            risks.append("appendfsync=no")
        if self.maxmemory_policy not in (None, "noeviction"):
            risks.append(f"maxmemory-policy={self.maxmemory_policy}")
        replicas = self.connected_replicas
        if self.replicas_required and replicas is not None and replicas < self.replicas_required:
            risks.append(f"replicas={replicas}/{self.replicas_required}")
        return risks

    @property
    def unverified(self) -> list[str]:
        """Settings that could not be read, as ``name=unverified``."""
        values: dict[str, object] = {
            "appendonly": self.appendonly,
            "appendfsync": self.appendfsync if self.appendonly != "no" else "n/a",
            "maxmemory-policy": self.maxmemory_policy,
        }
        if self.replicas_required:
            values["replicas"] = self.connected_replicas
        return [f"{name}=unverified" for name, value in values.items() if value is None]


def _config_values(replies: Iterable[Any]) -> dict[str, str]:
    """Merge CONFIG GET replies of one server; error replies (CONFIG refused) are skipped."""
    values: dict[str, str] = {}
    for reply in replies:
        if isinstance(reply, Mapping):
            values.update({reply_text(name): reply_text(value) for name, value in reply.items()})
    return values


#: For each judged setting, its values from weakest to strongest.
_WEAKEST_FIRST: Final = {
    "appendonly": ("no", "yes"),
    "appendfsync": ("no", "everysec", "always"),
}


def _weakest(name: str, values: list[str]) -> str:
    """The value of the node that puts records most at risk."""
    if name == "maxmemory-policy":
        return next((value for value in values if value != "noeviction"), values[0])
    order = _WEAKEST_FIRST.get(name)
    if order is None:
        return values[0]
    return min(values, key=lambda value: order.index(value) if value in order else -1)


async def _config(client: Redis, cluster: RedisCluster | None) -> dict[str, str]:
    """Read every setting in one round trip; on a cluster, every primary's weakest value.

    A single server's ``dir`` is read too (:func:`_server_identity`); a cluster's
    primaries are named by the cluster client without a command.
    """
    names = (*DURABILITY_SETTINGS, *SETTING_NAMES)
    if cluster is None:
        async with client.pipeline(transaction=False) as pipe:
            for name in (*names, *_IDENTITY_SETTINGS):
                pipe.config_get(name)
            return _config_values(await pipe.execute(raise_on_error=False))
    values: dict[str, str] = {}
    for name in names:
        try:
            per_node = await cluster.execute_command(
                "CONFIG", "GET", name, target_nodes=RedisCluster.PRIMARIES
            )
        except ResponseError:
            continue
        found = [
            value
            for node_reply in cast(Mapping[Any, Any], per_node).values()
            for value in _config_values([node_reply]).values()
        ]
        if found:
            values[name] = _weakest(name, found)
    return values


async def _info(client: Redis, section: str) -> dict[str, Any] | None:
    try:
        return await client.info(section)
    except ResponseError:
        return None


@dataclass(frozen=True, slots=True)
class _Reading:
    """A report and what the reading learned about telling the server apart."""

    report: DurabilityReport
    data_dir: str | None  # CONFIG GET dir, when CONFIG was allowed
    info_allowed: bool  # an INFO call was answered, so INFO server may be sent


async def _read(client: Redis, cluster: RedisCluster | None, replicas: int) -> _Reading:
    """:func:`read_durability`, keeping what :func:`_server_identity` may use."""
    info_allowed = False

    async def info(section: str) -> dict[str, Any] | None:
        nonlocal info_allowed
        reply = await _info(client, section)
        info_allowed = info_allowed or reply is not None
        return reply

    async with redis_errors():
        config = await _config(client, cluster)
        data_dir = config.pop("dir", None)
        source = "config" if config else "none"
        appendonly, policy = config.get("appendonly"), config.get("maxmemory-policy")
        if appendonly is None:
            persistence = await info("persistence")
            if persistence is not None and "aof_enabled" in persistence:
                appendonly, source = ("yes" if int(persistence["aof_enabled"]) else "no"), "info"
        if policy is None:
            memory = await info("memory")
            if memory is not None and "maxmemory_policy" in memory:
                policy, source = reply_text(memory["maxmemory_policy"]), "info"
        connected = None
        if replicas:
            replication = await info("replication")
            if replication is not None and "connected_slaves" in replication:
                connected = int(replication["connected_slaves"])
    costs = {
        name: value
        for name, value in config.items()
        if name in SETTING_NAMES and name not in DURABILITY_SETTINGS
    }
    report = DurabilityReport(
        appendonly=appendonly,
        appendfsync=config.get("appendfsync"),
        maxmemory_policy=policy,
        connected_replicas=connected,
        replicas_required=replicas,
        source=source,
        setting_warnings=tuple(server_settings_warnings(costs)),
    )
    return _Reading(report=report, data_dir=data_dir, info_allowed=info_allowed)


async def read_durability(
    client: Redis, *, cluster: RedisCluster | None = None, replicas: int = 0
) -> DurabilityReport:
    """Read the server's durability settings; CONFIG GET first, INFO when CONFIG is refused.

    Args:
        client: the store's client.
        cluster: the cluster client when the store runs on a Redis Cluster (every primary
            is read and the weakest value wins).
        replicas: replicas every append must reach; their count is read only when > 0.

    Raises:
        StoreUnavailable: Redis cannot be reached.

    """
    return (await _read(client, cluster, replicas)).report


async def check_durability(
    client: Redis,
    mode: DurabilityMode,
    *,
    cluster: RedisCluster | None = None,
    replicas: int = 0,
) -> DurabilityReport | None:
    """Read and judge the server's durability; warn or (``strict``) refuse.

    Returns:
        The report, or None in mode ``off`` (nothing is read).

    Raises:
        DurabilityError: ``strict`` and a risk or an unverified setting was found.
        StoreUnavailable: Redis cannot be reached.

    """
    if mode not in MODES:
        raise InvalidArgument(f"durability must be one of {', '.join(MODES)}")
    if mode == "off":
        return None
    reading = await _read(client, cluster, replicas)
    report = reading.report
    problems = report.risks + report.unverified
    if problems and mode == "strict":
        raise DurabilityError(problems)
    if (problems or report.setting_warnings) and _first_warning(
        await _server_identity(client, cluster, reading), report
    ):
        if problems:
            log.warning(
                "durability_warning",
                risks=report.risks,
                unverified=report.unverified,
                appendonly=report.appendonly,
                appendfsync=report.appendfsync,
                maxmemory_policy=report.maxmemory_policy,
                source=report.source,
            )
        for line in report.setting_warnings:
            log.warning("server_setting_warning", advice=line)
    return report


#: (server, report) pairs already warned about in this process.
_warned: set[tuple[str, DurabilityReport]] = set()
_warned_lock: Final = threading.Lock()


def _first_warning(server: str, report: DurabilityReport) -> bool:
    """True the first time this process sees ``report`` for ``server``.

    Every store open (each worker, each short-lived store of a harness) reads the
    settings; saying the same thing about the same server again only buries it.
    """
    with _warned_lock:
        if (server, report) in _warned:
            return False
        _warned.add((server, report))
        return True


async def _server_identity(client: Redis, cluster: RedisCluster | None, reading: _Reading) -> str:
    """Name the server with commands this user was seen to be allowed, never another.

    A cluster by its primaries. A single server by its address and data directory when
    CONFIG was allowed (the documented writer and workers users may not run INFO), by its
    ``run_id`` (new at every start) when INFO answered instead, else by its address alone:
    a denied command would land in the server's ACL LOG at every store open.
    """
    if cluster is not None:
        return ",".join(sorted(node.name for node in cluster.get_primaries()))
    options = client.connection_pool.connection_kwargs
    address = f"{options.get('host')}:{options.get('port')}:{options.get('path')}"
    if reading.data_dir is not None:
        return f"{address}:{reading.data_dir}"
    if reading.info_allowed:
        try:
            async with redis_errors():
                server = await client.info("server")
            return str(server["run_id"])
        except (CanonError, ResponseError, KeyError):
            pass
    return address
