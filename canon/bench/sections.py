"""One throughput section: every mode at every concurrency, repeated, on one server.

Used for the section without persistence and for each durability column. Within each
repeat the modes run in :func:`~canon.bench.modes.run_order`, each goal's mode beside its
floor, forward and backward in turn, and every mode's samples are compared with each
reference's (:data:`~canon.bench.modes.REFERENCES`) pair by pair: repeat *i* against the
reference's repeat *i* at the same concurrency, which cancels most of a shared
machine's drift.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from canon.bench.modes import MODES, RATIO_METRICS, REFERENCES, run_order
from canon.bench.report import spread
from canon.bench.scale import delete_namespace
from canon.bench.throughput import ThroughputBench
from canon.bench.timing import Sample
from canon.bench.workload import Payloads
from eventstore.store import Store

_MAX_CONNECTIONS = 256
#: How long a rewrite of the append-only file of an emptied server may take.
_REWRITE_TIMEOUT_S = 60.0
#: Samples by mode key, then by concurrency, in repeat order.
Samples = dict[str, dict[int, list[Sample]]]


@dataclass(frozen=True, slots=True)
class Timing:
    """How many repeats of each cell, and the warm-up and window of each run."""

    repeats: int
    warmup_s: float
    duration_s: float


def summary(samples: list[Sample]) -> dict[str, Any]:
    """A cell's spreads over its repeats, and the invocations it counted."""
    return {
        "invocations_per_s": spread([s.invocations_per_s for s in samples]),
        "p50_ms": spread([s.p50_ms for s in samples]),
        "p99_ms": spread([s.p99_ms for s in samples]),
        "client_cpu_us": spread([s.client_cpu_us for s in samples]),
        "server_cpu_us": spread([s.server_cpu_us for s in samples]),
        "waits_per_invocation": spread([s.waits_per_invocation for s in samples]),
        "invocations": sum(s.invocations for s in samples),
    }


def pair_ratios(samples: Samples, concurrency: tuple[int, ...]) -> dict[str, Any]:
    """``{reference: {mode: {tasks: {metric: spread}}}}`` of the pair-by-pair ratios."""
    ratios: dict[str, Any] = {}
    for reference in REFERENCES:
        ratios[reference] = {
            mode: {
                str(c): {
                    metric: spread(
                        [
                            getattr(s, metric) / getattr(r, metric)
                            for s, r in zip(by_c[c], samples[reference][c], strict=True)
                            if getattr(r, metric)
                        ]
                    )
                    for metric in RATIO_METRICS
                }
                for c in concurrency
            }
            for mode, by_c in samples.items()
            if mode != reference
        }
    return ratios


async def rewrite_append_only_file(client: Redis) -> None:
    """Rewrite the server's append-only file now and wait until the rewrite is done.

    Called between repeats, when the namespace has just been deleted: the rewrite is
    then a short fork of a near-empty data set, and the next repeat starts from a small
    file. Left to Redis's automatic rewrite, the file is rewritten mid-window, with
    hundreds of MB live, by a forked child that takes one of this machine's cores from
    whichever mode is being timed.
    """
    try:
        await client.bgrewriteaof()
    except ResponseError as exc:  # one already running is as good as ours
        if "in progress" not in str(exc):
            raise
    async with asyncio.timeout(_REWRITE_TIMEOUT_S):
        while True:
            info = await client.info("persistence")
            if not info.get("aof_rewrite_in_progress") and not info.get("aof_rewrite_scheduled"):
                return
            await asyncio.sleep(0.05)


async def measure_throughput(
    url: str,
    concurrency: tuple[int, ...],
    timing: Timing,
    progress: Callable[[str], None],
    *,
    rewrite_between_repeats: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run every mode on ``url``; return ``{"throughput", "ratios"}`` and batching stats.

    With ``rewrite_between_repeats`` (servers with ``appendonly yes`` and automatic
    rewrites off) the append-only file is rewritten after each repeat's data is deleted,
    outside every timed window.
    """
    samples: Samples = {mode.key: {c: [] for c in concurrency} for mode in MODES}
    namespace = "bench" + secrets.token_hex(4)
    bare = Redis.from_url(url)
    store = Store.from_url(url, namespace=namespace, max_connections=_MAX_CONNECTIONS)
    try:
        async with store:
            bench = ThroughputBench(store, Payloads.of(), bare=bare, url=url)
            try:
                await bench.prepare()
                for repeat in range(timing.repeats):
                    progress(f"throughput: repeat {repeat + 1} of {timing.repeats}")
                    for tasks in concurrency:
                        for mode in run_order(repeat):
                            sample = await bench.run(
                                mode, repeat, tasks, timing.warmup_s, timing.duration_s
                            )
                            samples[mode][tasks].append(sample)
                    await delete_namespace(bare, namespace)
                    if rewrite_between_repeats:
                        await rewrite_append_only_file(bare)
                    await store.check_namespace()
            finally:
                await bench.close()
            stats = store.batch_stats
    finally:
        await delete_namespace(bare, namespace)
        await bare.aclose()
    section = {
        "throughput": {
            m: {str(c): summary(s) for c, s in by_c.items()} for m, by_c in samples.items()
        },
        "ratios": pair_ratios(samples, concurrency),
    }
    batching = {
        "calls": stats.calls,
        "round_trips": stats.round_trips,
        "calls_per_round_trip": round(stats.calls / max(stats.round_trips, 1), 2),
        "resends": stats.resends,
        "reloads": stats.reloads,
        "largest_batch": stats.largest_batch,
    }
    return section, batching
