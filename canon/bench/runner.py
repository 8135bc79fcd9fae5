"""Runs every section of the benchmark and assembles the JSON report.

Without a URL it starts its own servers (EmbeddedRedis): one with the recommended
settings for throughput, lag and memory, one with Redis's defaults for memory, and a
fresh one for scale; each is stopped when its section ends. With a URL everything runs
there in fresh namespaces that are deleted afterwards (nothing is ever flushed), and
memory is measured under the server's settings as they are.
"""

from __future__ import annotations

import contextlib
import os
import platform
import secrets
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Final

import redis
from redis.asyncio import Redis
from redis.utils import HIREDIS_AVAILABLE

from canon.bench import memory, scale
from canon.bench.report import evaluate_goals, spread
from canon.bench.throughput import MODES, Sample, ThroughputBench
from canon.bench.workload import Payloads
from canon.logs import configure_logging
from eventstore.binaries import ServerBinary, binary_version
from eventstore.embedded import EmbeddedRedis
from eventstore.server_settings import (
    REDIS_DEFAULTS,
    read_server_settings,
    server_settings_warnings,
)
from eventstore.store import Store

SCHEMA: Final = "canon.bench.v1"
Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """What to run; :meth:`quick_run` and :meth:`full_run` are the two presets."""

    quick: bool
    repeats: int
    warmup_s: float
    duration_s: float
    concurrency: tuple[int, ...]
    memory_invocations: int
    scale_sizes: tuple[int, ...]
    scale_repeats: int
    scale_duration_s: float
    lag_duration_s: float
    redis_url: str | None = None
    redis_server: str | None = None

    @classmethod
    def quick_run(cls) -> BenchOptions:
        """CI-size numbers in well under a minute."""
        return cls(True, 2, 0.1, 0.4, (1, 16, 64), 500, (2_000, 10_000), 1, 0.3, 1.5)

    @classmethod
    def full_run(cls) -> BenchOptions:
        """The figures of docs/performance.md (several minutes; 1M stored needs ~4 GB)."""
        # Scale: many short rounds, so each pair of samples compared is close in time.
        sizes = (10_000, 100_000, 1_000_000)
        return cls(False, 5, 0.3, 2.0, (1, 16, 64), 5_000, sizes, 10, 1.0, 10.0)

    def on(self, redis_url: str | None, redis_server: str | None) -> BenchOptions:
        """These options against ``redis_url`` or with a given ``redis-server`` binary."""
        return replace(self, redis_url=redis_url, redis_server=redis_server)


def _binary(options: BenchOptions) -> ServerBinary | None:
    if options.redis_server is None:
        return None
    return ServerBinary(options.redis_server, binary_version(options.redis_server))


@contextlib.contextmanager
def _server(
    options: BenchOptions, progress: Progress, settings: dict[str, str] | None = None
) -> Iterator[str]:
    """The URL to benchmark: ``redis_url``, else a private server stopped on exit.

    A private server is announced through ``progress`` with its URL and data folder.
    """
    if options.redis_url is not None:
        yield options.redis_url
        return
    extra = [arg for name, value in (settings or {}).items() for arg in (f"--{name}", value)]
    with EmbeddedRedis(_binary(options), extra_args=extra) as server:
        progress(f"private Redis at {server.url} (data in {server.data_dir}, removed at its end)")
        yield server.url


def _quiet_production_logging() -> None:
    """Production logging (JSON, INFO) into /dev/null: its cost is measured, not its output."""
    saved = sys.stderr
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the loggers keep writing to it
    try:
        configure_logging(json=True, level="INFO")
    finally:
        sys.stderr = saved


def _summary(samples: list[Sample]) -> dict[str, Any]:
    return {
        "invocations_per_s": spread([s.invocations_per_s for s in samples]),
        "p50_ms": spread([s.p50_ms for s in samples]),
        "p99_ms": spread([s.p99_ms for s in samples]),
        "client_cpu_us": spread([s.client_cpu_us for s in samples]),
        "server_cpu_us": spread([s.server_cpu_us for s in samples]),
        "invocations": sum(s.invocations for s in samples),
    }


async def _throughput(
    url: str, options: BenchOptions, progress: Progress, report: dict[str, Any]
) -> None:
    samples: dict[str, dict[int, list[Sample]]] = {
        m: {c: [] for c in options.concurrency} for m in MODES
    }
    namespace = "bench" + secrets.token_hex(4)
    bare = Redis.from_url(url)
    store = Store.from_url(url, namespace=namespace, max_connections=256)
    try:
        async with store:
            bench = ThroughputBench(store, bare, Payloads.of())
            await bench.prepare()
            for repeat in range(options.repeats):
                progress(f"throughput: repeat {repeat + 1} of {options.repeats}")
                for concurrency in options.concurrency:
                    # Rotating the order spreads any drift across the modes.
                    order = MODES[repeat % len(MODES) :] + MODES[: repeat % len(MODES)]
                    for mode in order:
                        sample = await bench.run(
                            mode, repeat, concurrency, options.warmup_s, options.duration_s
                        )
                        samples[mode][concurrency].append(sample)
                await scale.delete_namespace(bare, namespace)
                await store.check_namespace()
            stats = store.batch_stats
    finally:
        await scale.delete_namespace(bare, namespace)
        await bare.aclose()
    report["throughput"] = {
        m: {str(c): _summary(s) for c, s in by_c.items()} for m, by_c in samples.items()
    }
    report["ratios"] = {
        mode: {
            str(c): {
                "invocations_per_s": spread(
                    [
                        s.invocations_per_s / f.invocations_per_s
                        for s, f in zip(samples[mode][c], samples["floor"][c], strict=True)
                    ]
                ),
                "p99_ms": spread(
                    [
                        s.p99_ms / f.p99_ms
                        for s, f in zip(samples[mode][c], samples["floor"][c], strict=True)
                        if f.p99_ms
                    ]
                ),
            }
            for c in options.concurrency
        }
        for mode in MODES
        if mode != "floor"
    }
    report["batching"] = {
        "calls": stats.calls,
        "round_trips": stats.round_trips,
        "calls_per_round_trip": round(stats.calls / max(stats.round_trips, 1), 2),
        "resends": stats.resends,
        "reloads": stats.reloads,
        "largest_batch": stats.largest_batch,
    }


async def _lag(url: str, options: BenchOptions, progress: Progress, report: dict[str, Any]) -> None:
    try:
        from canon.bench.lag import measure_lag
        from projections import ReceiptWorker  # noqa: F401 - only its presence is checked
    except ImportError:
        report["projection_lag"] = {"measured": False, "reason": "projections not available"}
        return
    writer_max = report["throughput"]["writer"][str(max(options.concurrency))]["invocations_per_s"][
        "median"
    ]
    progress(f"projection lag: writers at {writer_max / 2:,.0f} invocations/s")
    try:
        result = await measure_lag(
            url, "lag" + secrets.token_hex(4), writer_max / 2, options.lag_duration_s
        )
    except Exception as exc:  # the other sections still count
        report["projection_lag"] = {"measured": False, "reason": f"failed: {exc}"}
        return
    report["projection_lag"] = result.to_json()


async def _memory_section(
    url: str, options: BenchOptions, name: str, report: dict[str, Any]
) -> None:
    client = Redis.from_url(url)
    try:
        settings = await read_server_settings(client)
    finally:
        await client.aclose()
    points = [
        await memory.measure(
            url, Payloads.of(raw=raw), options.memory_invocations, "mem" + secrets.token_hex(4)
        )
        for raw in (64, 4096)
    ]
    report["memory"][name] = {
        "settings": settings,
        "warnings": server_settings_warnings(settings or {}),
        "points": [point.to_json() for point in points],
        "fixed_bytes": round(memory.fixed_overhead(points[0]), 1),
        "payload_ratio": round(memory.payload_ratio(points[0], points[1]), 3),
    }


async def run_benchmark(options: BenchOptions, progress: Progress) -> dict[str, Any]:
    """Run every section and return the report (goals included)."""
    _quiet_production_logging()
    report: dict[str, Any] = {"schema": SCHEMA, "quick": options.quick, "memory": {}}
    report["config"] = {
        "repeats": options.repeats,
        "warmup_s": options.warmup_s,
        "duration_s": options.duration_s,
        "concurrency": list(options.concurrency),
        "payload_bytes": {"request": 1024, "raw": 4096, "result": 512},
        "script_calls_per_invocation": 3,
        "memory_invocations": options.memory_invocations,
        "scale_sizes": list(options.scale_sizes),
    }
    load_before = os.getloadavg()
    with _server(options, progress) as url:
        client = Redis.from_url(url)
        try:
            version = (await client.info("server"))["redis_version"]
        finally:
            await client.aclose()
        await _throughput(url, options, progress, report)
        await _lag(url, options, progress, report)
        progress("memory: per invocation")
        await _memory_section(
            url, options, "configured" if options.redis_url else "recommended", report
        )
    if options.redis_url is None:
        with _server(options, progress, REDIS_DEFAULTS) as url:
            await _memory_section(url, options, "defaults", report)
    with contextlib.ExitStack() as servers:
        # Private servers: one per size, measured side by side; a given URL: one for all.
        count = 1 if options.redis_url else len(options.scale_sizes)
        urls = [servers.enter_context(_server(options, progress)) for _ in range(count)]
        points = await scale.measure_scale(
            urls,
            list(options.scale_sizes),
            namespace="scale" + secrets.token_hex(4),
            repeats=options.scale_repeats,
            warmup_s=options.warmup_s,
            duration_s=options.scale_duration_s,
            progress=progress,
        )
    report["scale"] = {"points": [point.to_json() for point in points]}
    report["environment"] = {
        "server": "REDIS_URL" if options.redis_url else "embedded",
        "redis_version": version,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "redis_py": redis.__version__,
        "hiredis": HIREDIS_AVAILABLE,
        "platform": platform.platform(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    report["goals"] = evaluate_goals(report)
    return report
