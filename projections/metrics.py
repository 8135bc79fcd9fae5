"""Prometheus metrics of the projection workers and the receipt API.

Each process entry builds one :class:`Metrics` on its own ``CollectorRegistry`` (never the
global default), so tests and several apps in one process never collide.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


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
        self.http_latency = Histogram(
            "canon_http_request_duration_seconds",
            "Receipt API request latency, by route and status code.",
            ["route", "status"],
            registry=self.registry,
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
