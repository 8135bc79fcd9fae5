"""Prometheus metrics of the projection workers, the receipt API and tool boundaries.

Each process entry builds one :class:`Metrics` on its own ``CollectorRegistry`` (never the
global default), so tests and several apps in one process never collide.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class CountsStuckThreads(Protocol):
    """A tool boundary (``ToolBoundary`` or ``SyncBoundary``): it counts its stuck threads."""

    @property
    def stuck_tool_threads(self) -> int:
        """Tool threads still running a tool whose call stopped waiting for it."""


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

    def watch_boundary(self, boundary: CountsStuckThreads, name: str = "default") -> None:
        """Report ``boundary``'s stuck tool threads as ``canon_stuck_tool_threads{boundary}``.

        The count is read at each scrape, so a harness that serves these metrics (see
        :func:`metrics_server`) shows how many of its tool threads are stuck right now.
        """
        self.stuck_tool_threads.labels(name).set_function(
            lambda: float(boundary.stuck_tool_threads)
        )


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
