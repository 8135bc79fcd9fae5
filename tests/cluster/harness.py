"""A real three-master Redis Cluster on loopback ports, for the cluster suite.

The cluster itself (nodes, forming, stopping) is :mod:`canon.bench.embedded_cluster`, which
the benchmark uses too; this adds what the suite asks of it: who owns which slot, and
``redis-cli --cluster reshard`` to move slots between masters, as an operator would.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass

from canon.bench.embedded_cluster import (
    ClusterNode,
    ClusterSetupError,
    EmbeddedCluster,
    free_ports,
    redis_cli,
)

__all__ = ["ClusterNode", "ClusterSetupError", "LocalCluster", "free_ports", "redis_cli"]

#: A line redis-cli prints as it moves one slot (the plan names node ids, not addresses).
_MOVING_SLOT = re.compile(r"Moving slot (\d+) from [\d.]+:\d+ to ")


@dataclass
class LocalCluster(EmbeddedCluster):
    """The private cluster, with slot ownership and resharding for the tests."""

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
