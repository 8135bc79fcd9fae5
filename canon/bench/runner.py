"""Runs every section of the benchmark and assembles the JSON report.

Without a URL it starts its own servers (EmbeddedRedis): one with the recommended
settings for throughput and lag, a fresh one with them for memory, one each with
``appendonly yes`` and ``appendfsync everysec`` / ``always`` for the durability columns,
one with Redis's defaults for memory, fresh ones for scale, and a three-master cluster
beside a single server for scale-out; each is stopped when its section ends. With a URL
everything runs there in fresh namespaces that are deleted afterwards (nothing is ever
flushed), memory is measured under the server's settings as they are, and the
durability columns and scale-out are not measured (they need servers of their own).
"""

from __future__ import annotations

import contextlib
import os
import platform
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Final

import redis
from redis.asyncio import Redis
from redis.utils import HIREDIS_AVAILABLE

from canon.bench import memory, scale
from canon.bench.archive import ArchiveOptions, measure_archive
from canon.bench.embedded_cluster import EmbeddedCluster
from canon.bench.encryption import measure_encryption
from canon.bench.report import evaluate_goals, one_call
from canon.bench.scaleout import measure_scale_out
from canon.bench.sections import Timing, measure_throughput
from canon.bench.workload import Payloads
from canon.logging_setup import configure_logging
from eventstore.errors import EmbeddedRedisError
from eventstore.server.binaries import ServerBinary, binary_version, choose_redis_server
from eventstore.server.config_checks import (
    REDIS_DEFAULTS,
    read_server_settings,
    server_settings_warnings,
)
from eventstore.server.embedded import EmbeddedRedis
from eventstore.wire.replies import reply_text

SCHEMA: Final = "canon.bench.v2"
Progress = Callable[[str], None]
#: Server settings of the durability columns (on top of the recommended ones). Automatic
#: rewrites of the append-only file are off: the benchmark rewrites it between repeats,
#: when the data set is empty (see :func:`~canon.bench.sections.rewrite_append_only_file`).
DURABILITY: Final = {
    name: {"appendonly": "yes", "appendfsync": name, "auto-aof-rewrite-percentage": "0"}
    for name in ("everysec", "always")
}
#: Cluster mode with an explicit bus port (``cluster-port``) needs Redis 7.
_CLUSTER_VERSION: Final = (7, 0, 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchOptions:
    """What to run; :meth:`quick_run` and :meth:`full_run` are the two presets.

    ``repeats``, ``warmup_s`` and ``duration_s`` time the throughput section without
    persistence; the durability columns and scale-out have timings of their own.
    """

    quick: bool
    repeats: int
    warmup_s: float
    duration_s: float
    concurrency: tuple[int, ...]
    durability_repeats: int
    durability_warmup_s: float
    durability_duration_s: float
    memory_invocations: int
    scale_sizes: tuple[int, ...]
    scale_repeats: int
    scale_duration_s: float
    scale_out_repeats: int
    scale_out_duration_s: float
    #: Also a 6-master cluster, for the capacity curve (a full run: six more servers).
    scale_out_larger: bool
    lag_duration_s: float
    console_repeats: int
    #: The encryption section: rounds, and invocations per block of each side.
    encryption_repeats: int
    encryption_calls: int
    redis_url: str | None = None
    redis_server: str | None = None
    #: Also run the archive section (opt-in: minutes, and gigabytes on a full run).
    archive: bool = False
    #: Run the archive section alone.
    archive_only: bool = False
    #: A PostgreSQL database the archive section may fill (else a private server).
    archive_postgres_url: str | None = None

    @classmethod
    def quick_run(cls) -> BenchOptions:
        """CI-size numbers in under a minute: every cell measured, none of them closely."""
        return cls(
            quick=True,
            repeats=2,
            warmup_s=0.05,
            duration_s=0.15,
            concurrency=(1, 16, 64),
            durability_repeats=1,
            durability_warmup_s=0.03,
            durability_duration_s=0.1,
            memory_invocations=500,
            scale_sizes=(2_000, 10_000),
            scale_repeats=1,
            scale_duration_s=0.3,
            scale_out_repeats=1,
            scale_out_duration_s=0.3,
            scale_out_larger=False,
            lag_duration_s=1.0,
            console_repeats=3,
            encryption_repeats=4,
            encryption_calls=64,
        )

    @classmethod
    def full_run(cls) -> BenchOptions:
        """The figures of docs/performance.md (minutes; 1M stored needs ~4 GB)."""
        return cls(
            quick=False,
            repeats=5,
            warmup_s=0.3,
            duration_s=1.5,
            concurrency=(1, 16, 64),
            # Shorter samples with persistence, but four of them: a goal judged on the
            # median of two pairs moved by a fifth between runs of the same code.
            durability_repeats=4,
            durability_warmup_s=0.2,
            durability_duration_s=1.0,
            memory_invocations=5_000,
            scale_sizes=(10_000, 100_000, 1_000_000),
            # Scale: many short rounds, so each pair of samples compared is close in time.
            scale_repeats=10,
            scale_duration_s=1.0,
            scale_out_repeats=3,
            scale_out_duration_s=1.5,
            scale_out_larger=True,
            lag_duration_s=10.0,
            console_repeats=9,
            encryption_repeats=15,
            encryption_calls=400,
        )

    def on(self, redis_url: str | None, redis_server: str | None) -> BenchOptions:
        """These options against ``redis_url`` or with a given ``redis-server`` binary."""
        return replace(self, redis_url=redis_url, redis_server=redis_server)

    def with_archive(self, *, only: bool, postgres_url: str | None) -> BenchOptions:
        """These options with the archive section (``only``: nothing else)."""
        return replace(self, archive=True, archive_only=only, archive_postgres_url=postgres_url)

    @property
    def archive_options(self) -> ArchiveOptions:
        """The archive section's sizes for this preset, on the PostgreSQL server given."""
        preset = ArchiveOptions.quick_run() if self.quick else ArchiveOptions.full_run()
        return preset.on(self.archive_postgres_url)


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


async def _durability(options: BenchOptions, progress: Progress) -> dict[str, Any]:
    """The throughput section again on servers with ``appendonly yes``, one per setting."""
    if options.redis_url is not None:
        reason = "--redis-url given: only that server is measured, under its own settings"
        return {"measured": False, "reason": reason}
    timing = Timing(
        options.durability_repeats, options.durability_warmup_s, options.durability_duration_s
    )
    result: dict[str, Any] = {"measured": True}
    for name, settings in DURABILITY.items():

        def announce(line: str, name: str = name) -> None:
            progress(f"appendfsync {name}: {line}")

        with _server(options, progress, settings) as url:
            section, _ = await measure_throughput(
                url, options.concurrency, timing, announce, rewrite_between_repeats=True
            )
            forks = await _forks(url)
        result[name] = {"settings": settings, "forks": forks, **section}
    return result


async def _scale_out(options: BenchOptions, progress: Progress) -> dict[str, Any]:
    """The writer and the boundary on a private 3-master cluster against one server."""
    if options.redis_url is not None:
        return {"measured": False, "reason": "skipped: --redis-url given (needs a private cluster)"}
    binary = _binary(options) or choose_redis_server(minimum=_CLUSTER_VERSION)
    if binary is None or binary.version < _CLUSTER_VERSION:
        found = "none found" if binary is None else f"the private servers run {binary.label}"
        return {"measured": False, "reason": f"needs a Redis 7 redis-server ({found})"}
    try:
        with contextlib.ExitStack() as stack:
            cluster = stack.enter_context(EmbeddedCluster(binary))
            single = stack.enter_context(_server(options, progress))
            addresses = ", ".join(node.address for node in cluster.nodes)
            progress(f"private Redis Cluster of {cluster.masters} masters at {addresses}")
            larger = (
                stack.enter_context(EmbeddedCluster(binary, masters=6))
                if options.scale_out_larger
                else None
            )
            return await measure_scale_out(
                single,
                cluster,
                namespace="out" + secrets.token_hex(4),
                repeats=options.scale_out_repeats,
                warmup_s=options.warmup_s,
                duration_s=options.scale_out_duration_s,
                progress=progress,
                larger=larger,
                larger_reason="a full run only (not --quick): six more servers",
            )
    except EmbeddedRedisError as exc:  # no cluster here: the other sections still count
        return {"measured": False, "reason": f"failed: {exc}"}
    except Exception as exc:  # the other sections still count, as for the lag
        return {"measured": False, "reason": f"failed: {type(exc).__name__}: {exc}"}


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


async def _console(url: str, options: BenchOptions, progress: Progress) -> dict[str, Any]:
    progress("console: pages at 3,000 calls")
    try:
        from canon.bench.console import measure_console
    except ImportError:
        return {"measured": False, "reason": "the console is not installed"}
    try:
        return await measure_console(url, options.console_repeats)
    except Exception as exc:  # the other sections still count
        return {"measured": False, "reason": f"failed: {type(exc).__name__}"}


async def _archive(
    url: str, options: BenchOptions, progress: Progress, report: dict[str, Any]
) -> dict[str, Any]:
    """The archive section, at the boundary's rate the throughput section measured."""
    rate = (
        report.get("throughput", {})
        .get("boundary", {})
        .get("16", {})
        .get("invocations_per_s", {})
        .get("median")
    )
    try:
        return await measure_archive(url, options.archive_options, progress, rate_per_s=rate)
    except Exception as exc:  # the other sections still count
        return {"measured": False, "reason": f"failed: {type(exc).__name__}: {exc}"}


def _environment(
    options: BenchOptions, version: str, load_before: tuple[float, ...]
) -> dict[str, Any]:
    """Where the figures were taken: servers, versions, CPUs, the load before and after."""
    return {
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


async def _redis_version(url: str) -> str:
    client = Redis.from_url(url)
    try:
        return str((await client.info("server"))["redis_version"])
    finally:
        await client.aclose()


async def run_archive_benchmark(options: BenchOptions, progress: Progress) -> dict[str, Any]:
    """Run the archive section alone and return its report (its goals included)."""
    _quiet_production_logging()
    report: dict[str, Any] = {"schema": SCHEMA, "quick": options.quick, "only": "archive"}
    report["elapsed_s"] = {}
    started, load_before = time.perf_counter(), os.getloadavg()
    with _server(options, progress) as url:
        version = await _redis_version(url)
        with _section_time(report, "archive"):
            report["archive"] = await _archive(url, options, progress, report)
    report["elapsed_s"]["total"] = round(time.perf_counter() - started, 1)
    report["environment"] = _environment(options, version, load_before)
    report["goals"] = evaluate_goals(report)
    return report


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


@contextlib.contextmanager
def _section_time(report: dict[str, Any], name: str) -> Iterator[None]:
    """Record how long a section took (its servers' start and stop included)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        report["elapsed_s"][name] = round(time.perf_counter() - started, 1)


async def _forks(url: str) -> int:
    """How many times the server forked since it started (``total_forks``, Redis 6.2+).

    On a durability column's server, with snapshots off, each fork is a rewrite of the
    append-only file.
    """
    client = Redis.from_url(url)
    try:
        return int((await client.info("stats"))["total_forks"])
    finally:
        await client.aclose()


async def _persistence(url: str) -> dict[str, str]:
    """The server's ``appendonly`` and ``appendfsync`` (one name per CONFIG GET, as 6.2 asks)."""
    client = Redis.from_url(url)
    settings: dict[str, str] = {}
    try:
        for name in ("appendonly", "appendfsync"):
            for key, value in (await client.config_get(name)).items():
                settings[reply_text(key)] = reply_text(value)
    finally:
        await client.aclose()
    return settings


async def run_benchmark(options: BenchOptions, progress: Progress) -> dict[str, Any]:
    """Run every section and return the report (goals included)."""
    _quiet_production_logging()
    report: dict[str, Any] = {"schema": SCHEMA, "quick": options.quick, "memory": {}}
    report["config"] = {
        "repeats": options.repeats,
        "warmup_s": options.warmup_s,
        "duration_s": options.duration_s,
        "concurrency": list(options.concurrency),
        "durability": {
            "repeats": options.durability_repeats,
            "warmup_s": options.durability_warmup_s,
            "duration_s": options.durability_duration_s,
        },
        "payload_bytes": {"request": 1024, "raw": 4096, "result": 512},
        "script_calls_per_invocation": 3,
        "memory_invocations": options.memory_invocations,
        "scale_sizes": list(options.scale_sizes),
        "scale_out": {
            "repeats": options.scale_out_repeats,
            "duration_s": options.scale_out_duration_s,
        },
    }
    report["elapsed_s"] = {}
    started, load_before = time.perf_counter(), os.getloadavg()
    with _server(options, progress) as url:
        version = await _redis_version(url)
        report["persistence"] = await _persistence(url)
        with _section_time(report, "throughput"):
            timing = Timing(options.repeats, options.warmup_s, options.duration_s)
            section, report["batching"] = await measure_throughput(
                url, options.concurrency, timing, progress
            )
            report.update(section)
            report["one_call"] = one_call(section)
        with _section_time(report, "projection_lag"):
            await _lag(url, options, progress, report)
        with _section_time(report, "console"):
            report["console"] = await _console(url, options, progress)
        with _section_time(report, "encryption"):
            progress("encryption: client CPU per invocation, sealed beside plain")
            report["encryption"] = await measure_encryption(
                url, repeats=options.encryption_repeats, calls=options.encryption_calls
            )
        if options.archive:
            with _section_time(report, "archive"):
                report["archive"] = await _archive(url, options, progress, report)
    # A private server of its own (a given URL is measured as it is): the throughput
    # section leaves the keyspace tables grown, and their shrinking, on Redis's
    # schedule, would land in one of the readings.
    with _section_time(report, "memory"), _server(options, progress) as url:
        progress("memory: per invocation")
        name = "configured" if options.redis_url else "recommended"
        await _memory_section(url, options, name, report)
    with _section_time(report, "durability"):
        report["durability"] = await _durability(options, progress)
    if options.redis_url is None:
        with (
            _section_time(report, "memory_defaults"),
            _server(options, progress, REDIS_DEFAULTS) as url,
        ):
            await _memory_section(url, options, "defaults", report)
    with _section_time(report, "scale"), contextlib.ExitStack() as servers:
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
    with _section_time(report, "scale_out"):
        report["scale_out"] = await _scale_out(options, progress)
    report["elapsed_s"]["total"] = round(time.perf_counter() - started, 1)
    report["environment"] = _environment(options, version, load_before)
    report["goals"] = evaluate_goals(report)
    return report
