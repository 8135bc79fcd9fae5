"""Prometheus metrics of the projection workers, the receipt API and tool boundaries.

Each process entry builds one :class:`Metrics` on its own ``CollectorRegistry`` (never the
global default), so tests and several apps in one process never collide.

A tool boundary's figures are read from the boundary at each scrape
(:meth:`Metrics.watch_boundary`): its stuck tool threads, and the calls it refused
before any record existed, per code (``canon_refusals_total{boundary, code}``). The
boundary only adds one to a number in memory when it refuses a call; a call it does not
refuse costs nothing for the metrics.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Final, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from machine.codes import PREFLIGHT_CODES, ErrorCode

#: ``canon_refusals_total``: a counter's family name leaves out the ``_total`` it is shown with.
REFUSALS_FAMILY: Final = "canon_refusals"
_REFUSALS_HELP: Final = (
    "Calls a tool boundary refused before any record existed, by error code (preflight, "
    "run state, pause, duplicate, budgets). By boundary."
)


class WatchedBoundary(Protocol):
    """A tool boundary (``ToolBoundary`` or ``SyncBoundary``), as its metrics read it."""

    @property
    def stuck_tool_threads(self) -> int:
        """Tool threads still running a tool whose call stopped waiting for it."""

    @property
    def refusals(self) -> Mapping[ErrorCode, int]:
        """Calls refused before any record existed since the boundary was built, by code."""


#: The name this protocol had when it only counted stuck threads.
CountsStuckThreads = WatchedBoundary


class RefusalCounts(Collector):
    """``canon_refusals_total{boundary, code}`` of every watched boundary, read at each scrape.

    The ``code`` label only ever takes :class:`~machine.codes.ErrorCode` values, so the
    series are bounded: every preflight code of each boundary is shown from the start (0
    until it happens, so a rate works from the first refusal), any other code once seen.
    """

    def __init__(self) -> None:
        self._boundaries: dict[str, WatchedBoundary] = {}

    def watch(self, boundary: WatchedBoundary, name: str) -> None:
        """Count ``boundary``'s refusals under ``boundary=name`` (replacing one so named)."""
        self._boundaries[name] = boundary

    def describe(self) -> Iterator[Metric]:
        """The family this collector yields, so the registry checks its name at once."""
        yield CounterMetricFamily(REFUSALS_FAMILY, _REFUSALS_HELP, labels=["boundary", "code"])

    def collect(self) -> Iterator[Metric]:
        """One sample per boundary and code: the boundary's count now."""
        family = CounterMetricFamily(REFUSALS_FAMILY, _REFUSALS_HELP, labels=["boundary", "code"])
        for name, boundary in sorted(self._boundaries.items()):
            counts = boundary.refusals
            for code in ErrorCode:
                count = counts.get(code, 0)
                if count or code in PREFLIGHT_CODES:
                    family.add_metric([name, code.value], float(count))
        yield family


class Metrics:
    """The metrics of one process, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.events_projected = Counter(
            "canon_events_projected",
            "Feed entries settled by a projection, by outcome.",
            ["projection", "outcome"],
            registry=self.registry,
        )
        self.dead_letters = Counter(
            "canon_dead_letters",
            "Feed entries moved to a dead-letter stream.",
            ["projection"],
            registry=self.registry,
        )
        self.expired_entries = Counter(
            "canon_expired_entries",
            "Feed entries acknowledged because their record had expired.",
            ["projection"],
            registry=self.registry,
        )
        self.failures = Counter(
            "canon_projection_failures",
            "Deliveries whose projection raised; the entry stays pending.",
            ["projection"],
            registry=self.registry,
        )
        self.lag = Gauge(
            "canon_projection_lag_entries",
            "Feed entries not yet delivered to the projection's group.",
            ["projection", "shard"],
            registry=self.registry,
        )
        self.pending = Gauge(
            "canon_projection_pending_entries",
            "Entries delivered to the projection's group and not yet acknowledged.",
            ["projection", "shard"],
            registry=self.registry,
        )
        self.oldest_unacked = Gauge(
            "canon_projection_oldest_unacked_seconds",
            "Age of the oldest unacknowledged entry of the projection's group.",
            ["projection", "shard"],
            registry=self.registry,
        )
        self.stuck_tool_threads = Gauge(
            "canon_stuck_tool_threads",
            "Tool threads still running a tool whose call ended (time limit passed or call "
            "cancelled); when they fill a pool, plain tools are refused. By boundary.",
            ["boundary"],
            registry=self.registry,
        )
        self.http_latency = Histogram(
            "canon_http_request_duration_seconds",
            "Receipt API request latency, by route and status code.",
            ["route", "status"],
            registry=self.registry,
        )
        self.refusals = RefusalCounts()
        self.registry.register(self.refusals)

    def watch_boundary(self, boundary: WatchedBoundary, name: str = "default") -> None:
        """Report ``boundary``'s figures under ``boundary=name``, read at each scrape.

        ``canon_stuck_tool_threads{boundary}``: its tool threads stuck right now;
        ``canon_refusals_total{boundary, code}``: the calls it refused before any record
        existed, by code. A harness that serves these metrics (see :func:`metrics_server`)
        watches each of its boundaries once.
        """
        self.stuck_tool_threads.labels(name).set_function(
            lambda: float(boundary.stuck_tool_threads)
        )
        self.refusals.watch(boundary, name)


@contextmanager
def metrics_server(metrics: Metrics, port: int, host: str = "127.0.0.1") -> Iterator[int]:
    """Serve ``metrics`` over HTTP on ``host:port`` for the block; yields the bound port."""
    server, thread = start_http_server(port, addr=host, registry=metrics.registry)
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
