"""Prometheus metrics: projected events, dead letters, expired entries, lag, HTTP latency."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from eventstore.store import Store
from machine.codes import EvidenceStatus
from projections import ReceiptWorker, create_app
from projections.metrics import Metrics, metrics_server
from tests.helpers import wait_until

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-m"


async def _absent(redis: Redis, key: str) -> bool:
    return int(await redis.exists(key)) == 0


def value(metrics: Metrics, name: str, **labels: str) -> float:
    sample = metrics.registry.get_sample_value(name, labels)
    return 0.0 if sample is None else sample


async def test_worker_counts_outcomes_dead_letters_and_expired_entries(
    make_store: Any, redis: Redis
) -> None:
    """Settled entries are counted by outcome; dead letters and expired entries on their own."""
    store: Store = make_store(shards=1)
    # Only "gone" expires: on a loaded machine one short TTL for both could lapse "c1" too.
    short: Store = make_store(shards=1, ttl=timedelta(milliseconds=300))
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    await short.writer.create(RUN, "gone", "search", b"{}")
    gone = store.keys.record(RUN, "gone")
    await wait_until(lambda: _absent(redis, gone))
    head = await store.writer.create(RUN, "c1", "search", b"{}")
    head = await store.writer.start_projecting(head, b"{}")
    await store.writer.complete(head, b"1", EvidenceStatus.EVIDENCE_FOUND, "s")
    await redis.xadd(store.keys.feed(0), {"junk": "1"})

    metrics = Metrics()
    worker = ReceiptWorker(store, consumer="w", min_idle_ms=0, max_deliveries=1, metrics=metrics)
    await worker.run(burst=True)

    projected = "canon_events_projected_total"
    assert value(metrics, projected, projection="receipts", outcome="applied") == 1
    assert value(metrics, projected, projection="receipts", outcome="stale") == 2
    assert value(metrics, projected, projection="receipts", outcome="expired") == 1
    assert value(metrics, "canon_expired_entries_total", projection="receipts") == 1
    assert value(metrics, "canon_dead_letters_total", projection="receipts") == 1
    assert value(metrics, "canon_projection_failures_total", projection="receipts") == 1


async def test_running_worker_reports_lag_and_the_endpoint_serves_it(make_store: Any) -> None:
    """A running worker publishes lag gauges per shard, scraped over HTTP from its own registry."""
    store: Store = make_store(shards=2)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    await store.writer.create(RUN, "c1", "search", b"{}")
    metrics = Metrics()
    worker = ReceiptWorker(store, consumer="w", block_ms=20, metrics=metrics)
    task = asyncio.create_task(worker.run())
    try:
        # Lag is reported by its own task, which may first run after the entry is applied.
        labels = {"projection": "receipts", "shard": "0"}
        deadline = asyncio.get_running_loop().time() + 5
        while (
            value(metrics, "canon_events_projected_total", projection="receipts", outcome="applied")
            < 1
            or metrics.registry.get_sample_value("canon_projection_lag_entries", labels) is None
        ):
            assert asyncio.get_running_loop().time() < deadline, "no lag gauge within 5 s"
            await asyncio.sleep(0.01)
        with metrics_server(metrics, 0) as port:
            async with httpx.AsyncClient() as client:
                text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    finally:
        worker.stop()
        await task
    assert 'canon_projection_pending_entries{projection="receipts",shard="1"}' in text
    assert "canon_events_projected_total" in text


async def test_http_latency_is_recorded_by_route_and_status(make_store: Any) -> None:
    """Each answer of the receipt API is timed under its route and status code."""
    store: Store = make_store(shards=1)
    token = (await store.open_run(RUN, deadline=timedelta(minutes=5))).access_token
    metrics = Metrics()
    transport = httpx.ASGITransport(app=create_app(store, metrics=metrics))
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        await client.get("/v1/invocations/inspection-capabilities")
        await client.get(
            "/v1/invocations/inspection-capabilities",
            headers={"Authorization": f"Bearer {token}"},
        )
    count = "canon_http_request_duration_seconds_count"
    assert value(metrics, count, route="capabilities", status="200") == 1
    assert value(metrics, count, route="unauthorized", status="401") == 1
