"""Scale-out: the writer and the boundary at 64 tasks on a Redis Cluster, against one server.

A private cluster of three masters (:class:`~canon.bench.embedded_cluster.EmbeddedCluster`)
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

C must be read at the load a master carries near its capacity. With the 64 tasks spread
over N masters, each master carries 1/N of the single server's load, and a lightly
loaded Redis spends more CPU per call (each round trip wakes it, and it finds less work
each time): three plain servers sharing the load, no cluster at all, spend as much more
as the cluster does (docs/perf-log/2026-12-cluster-pipelining.md). So each repeat also
loads one master alone, with the same 64 tasks on runs whose shards it holds (the
masters take turns across repeats): its CPU per invocation, summed over every master,
is C, read at the single server's load. ``x_single`` is the busiest master's capacity
with that C over the single server's; ``x_single_at_split_load`` uses the CPU read with
the load spread, for comparison.

The capacity curve puts the implied capacities side by side: one server, the 3-master
cluster, and (a full run only) a 6-master one, measured with the writer, each against the
single server's: N masters should give at least 0.9 x N.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
from collections.abc import Callable
from typing import Any, Final, cast

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from canon.bench.embedded_cluster import EmbeddedCluster
from canon.bench.report import spread
from canon.bench.throughput import RunSelector, ThroughputBench
from canon.bench.timing import Sample, bare_server_cpu
from canon.bench.workload import Payloads
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
#: The runs of the curve's mode with one master loaded alone (see the module doc).
LOADED: Final = "writer, one master loaded"
#: Capacity goal of N masters: at least this x N the single server's.
CURVE_TARGET: Final = 0.9


def _curve_point(
    point: dict[str, Any], single: dict[str, Any], masters: int, loaded: list[Sample] | None
) -> dict[str, Any]:
    """One point of the capacity curve: implied capacities and their ratio to one server.

    ``loaded``: the samples with one master loaded alone (None for the single server,
    which is loaded so in every sample).
    """
    base = single["busiest_master_capacity_per_s"]
    largest_share = max(point["master_shares"])
    at_split_load = point["busiest_master_capacity_per_s"]
    single_cpu = single["server_cpu_us"]["median"]
    cpu = single_cpu if loaded is None else statistics.median(s.server_cpu_us for s in loaded)
    busiest = round(1e6 / (cpu * largest_share)) if cpu else 0
    return {
        "masters": masters,
        "measured": True,
        "loaded_server_cpu_us": (
            spread([s.server_cpu_us for s in loaded]) if loaded else single["server_cpu_us"]
        ),
        "loaded_server_cpu_x_single": round(cpu / single_cpu, 3) if single_cpu else 0.0,
        "implied_capacity_per_s": round(1e6 / cpu * masters) if cpu else 0,
        "busiest_master_capacity_per_s": busiest,
        "largest_share": largest_share,
        "x_single": round(busiest / base, 2) if base else 0.0,
        "x_single_at_split_load": round(at_split_load / base, 2) if base else 0.0,
        "target_x_single": round(CURVE_TARGET * masters, 2),
    }


async def _runs_on_masters(store: Store, cluster: EmbeddedCluster) -> list[RunSelector]:
    """One filter per master of ``cluster``: the run ids whose shard that master holds."""
    client = cast(RedisCluster, store.client)
    await client.initialize()  # the slot table, read once (nothing moves during the bench)

    def on(port: int) -> RunSelector:
        def holds(run_id: str) -> bool:
            slot = client.keyslot(store.keys.feed_of(run_id))
            return client.nodes_manager.get_node_from_slot(slot).port == port

        return holds

    return [on(node.port) for node in cluster.nodes]


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
    clusters = {"cluster": cluster}
    runs = [*itertools.product(sites, MODES), ("cluster", LOADED)]
    if larger is not None:
        sites["larger"] = _cluster(larger, namespace)
        clusters["larger"] = larger
        runs += [("larger", CURVE_MODE), ("larger", LOADED)]
    samples: dict[tuple[str, str], list[Sample]] = {run: [] for run in runs}
    try:
        for site in sites.values():
            await site.store.__aenter__()
            await site.bench.prepare()
        on_master = {
            name: await _runs_on_masters(sites[name].store, nodes)
            for name, nodes in clusters.items()
        }
        for repeat in range(repeats):
            progress(f"scale-out: writer and boundary at {TASKS} tasks, repeat {repeat + 1}")
            # Rotating the order spreads any drift across sites and modes.
            order = runs[repeat % len(runs) :] + runs[: repeat % len(runs)]
            for name, mode in order:
                bench = sites[name].bench
                if mode == LOADED:  # the masters take turns, one per repeat
                    where = on_master[name][repeat % len(on_master[name])]
                    sample = await bench.run(
                        CURVE_MODE, repeat, TASKS, warmup_s, duration_s, runs_where=where
                    )
                else:
                    sample = await bench.run(mode, repeat, TASKS, warmup_s, duration_s)
                samples[(name, mode)].append(sample)
    finally:
        for site in sites.values():
            await site.close()
    masters = len(cluster.nodes)
    result: dict[str, Any] = {"measured": True, "masters": masters, "tasks": TASKS, "modes": {}}
    single_point = _point(samples[("single", CURVE_MODE)], 1)
    curve = [_curve_point(single_point, single_point, 1, None)]
    for name, measured in clusters.items():  # the 3 masters, then the larger cluster
        count = len(measured.nodes)
        point = _point(samples[(name, CURVE_MODE)], count)
        curve.append(_curve_point(point, single_point, count, samples[(name, LOADED)]))
    if larger is None:
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
