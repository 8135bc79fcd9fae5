"""Scale-out: the writer and the boundary at 64 tasks on a Redis Cluster, against one server.

A private cluster of three masters (:class:`~eventstore.server.embedded_cluster.EmbeddedCluster`)
and a private single server run side by side; each repeat runs both modes on both, in
rotating order, so the cluster's figures are compared with the single server's pair by
pair, as the throughput section compares modes with the floors. Redis CPU per invocation
on the cluster is the sum of every master's ``used_cpu_user + used_cpu_sys`` over the
window, divided by the invocations, and each master's share of it is given.

On a machine with fewer cores than masters plus a client, the cluster's measured rate
says little about its capacity. What its CPU implies does: a master that spends C µs of
CPU per invocation serves at most 1e6 / C invocations/s on one core, so ``masters`` of
them, with the load spread evenly, 1e6 / C x masters (and 1e6 / (C x largest share)
with the shares measured). Both are implied, not measured.

The capacity curve puts the implied capacities side by side: one server, the 3-master
cluster, and (a full run only) a 6-master one, measured with the writer, each against the
single server's (``x_single``, the busiest master's capacity over the single server's):
N masters should give at least 0.9 x N.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
from collections.abc import Callable
from typing import Any, Final

from redis.asyncio import Redis

from canon.bench.report import spread
from canon.bench.throughput import ThroughputBench
from canon.bench.timing import Sample, bare_server_cpu
from canon.bench.workload import Payloads
from eventstore.server.embedded_cluster import EmbeddedCluster
from eventstore.store import Store

#: Concurrent tasks of every scale-out run.
TASKS: Final = 64
#: The modes measured on both sites.
MODES: Final = ("writer", "boundary")
_MAX_CONNECTIONS: Final = 256


class _Site:
    """One system under test: its store, its benchmark and the clients that read its CPU."""

    def __init__(self, store: Store, bench: ThroughputBench, clients: list[Redis]) -> None:
        self.store = store
        self.bench = bench
        self.clients = clients

    async def close(self) -> None:
        try:
            await self.bench.close()
            await self.store.aclose()
        finally:
            for client in self.clients:
                await client.aclose()


def _single(url: str, namespace: str) -> _Site:
    bare = Redis.from_url(url)
    store = Store.from_url(url, namespace=namespace, max_connections=_MAX_CONNECTIONS)
    return _Site(store, ThroughputBench(store, Payloads.of(), bare=bare), [bare])


def _cluster(cluster: EmbeddedCluster, namespace: str) -> _Site:
    nodes = [node.client() for node in cluster.nodes]

    async def server_cpu() -> list[float]:
        per_node = await asyncio.gather(*(bare_server_cpu(client) for client in nodes))
        return [seconds for reading in per_node for seconds in reading]

    store = Store.from_url(
        f"{cluster.url}?cluster=1", namespace=namespace, max_connections=_MAX_CONNECTIONS
    )
    return _Site(store, ThroughputBench(store, Payloads.of(), server_cpu=server_cpu), nodes)


def _point(samples: list[Sample], masters: int) -> dict[str, Any]:
    """One site's figures for one mode: spreads, each master's share, the implied capacity."""
    cpu = statistics.median(s.server_cpu_us for s in samples)
    shares = [
        statistics.median(
            s.server_cpu_split_us[i] / s.server_cpu_us if s.server_cpu_us else 0.0 for s in samples
        )
        for i in range(masters)
    ]
    return {
        "invocations_per_s": spread([s.invocations_per_s for s in samples]),
        "client_cpu_us": spread([s.client_cpu_us for s in samples]),
        "server_cpu_us": spread([s.server_cpu_us for s in samples]),
        "master_shares": [round(share, 3) for share in shares],
        "implied_capacity_per_s": round(1e6 / cpu * masters) if cpu else 0,
        "busiest_master_capacity_per_s": round(1e6 / (cpu * max(shares))) if cpu else 0,
        "invocations": sum(s.invocations for s in samples),
    }


#: The mode of the capacity curve (the writer's Redis CPU is what a master's capacity is).
CURVE_MODE: Final = "writer"
#: Capacity goal of N masters: at least this x N the single server's.
CURVE_TARGET: Final = 0.9


def _curve_point(point: dict[str, Any], single: dict[str, Any], masters: int) -> dict[str, Any]:
    """One point of the capacity curve: implied capacities and their ratio to one server."""
    base = single["busiest_master_capacity_per_s"]
    busiest = point["busiest_master_capacity_per_s"]
    return {
        "masters": masters,
        "measured": True,
        "implied_capacity_per_s": point["implied_capacity_per_s"],
        "busiest_master_capacity_per_s": busiest,
        "largest_share": max(point["master_shares"]),
        "x_single": round(busiest / base, 2) if base else 0.0,
        "target_x_single": round(CURVE_TARGET * masters, 2),
    }


async def measure_scale_out(
    single_url: str,
    cluster: EmbeddedCluster,
    *,
    namespace: str,
    repeats: int,
    warmup_s: float,
    duration_s: float,
    progress: Callable[[str], None],
    larger: EmbeddedCluster | None = None,
    larger_reason: str = "",
) -> dict[str, Any]:
    """Measure the writer and the boundary at 64 tasks on the cluster and on one server.

    ``larger`` (a cluster of more masters) is measured with the writer only, for the
    capacity curve; without it the curve says why (``larger_reason``).
    """
    sites = {"single": _single(single_url, namespace), "cluster": _cluster(cluster, namespace)}
    runs = list(itertools.product(sites, MODES))
    if larger is not None:
        sites["larger"] = _cluster(larger, namespace)
        runs.append(("larger", CURVE_MODE))
    samples: dict[tuple[str, str], list[Sample]] = {run: [] for run in runs}
    try:
        for site in sites.values():
            await site.store.__aenter__()
            await site.bench.prepare()
        for repeat in range(repeats):
            progress(f"scale-out: writer and boundary at {TASKS} tasks, repeat {repeat + 1}")
            # Rotating the order spreads any drift across sites and modes.
            order = runs[repeat % len(runs) :] + runs[: repeat % len(runs)]
            for name, mode in order:
                sample = await sites[name].bench.run(mode, repeat, TASKS, warmup_s, duration_s)
                samples[(name, mode)].append(sample)
    finally:
        for site in sites.values():
            await site.close()
    masters = len(cluster.nodes)
    result: dict[str, Any] = {"measured": True, "masters": masters, "tasks": TASKS, "modes": {}}
    single_point = _point(samples[("single", CURVE_MODE)], 1)
    curve = [_curve_point(single_point, single_point, 1)]
    curve.append(
        _curve_point(_point(samples[("cluster", CURVE_MODE)], masters), single_point, masters)
    )
    if larger is not None:
        more = len(larger.nodes)
        curve.append(
            _curve_point(_point(samples[("larger", CURVE_MODE)], more), single_point, more)
        )
    else:
        curve.append({"masters": 6, "measured": False, "reason": larger_reason})
    result["curve"] = curve
    for mode in MODES:
        single, clustered = samples[("single", mode)], samples[("cluster", mode)]
        result["modes"][mode] = {
            "single": _point(single, 1),
            "cluster": _point(clustered, masters),
            "cluster_x_single": {
                metric: spread(
                    [
                        getattr(c, metric) / getattr(s, metric)
                        for c, s in zip(clustered, single, strict=True)
                        if getattr(s, metric)
                    ]
                )
                for metric in ("invocations_per_s", "server_cpu_us")
            },
        }
    return result
