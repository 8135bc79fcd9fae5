"""The worker runtime: consumer groups, takeover, dead letters, lag, trimming, shutdown."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from eventstore.store import Store
from eventstore.wire.keys import shard_of
from machine.codes import EvidenceStatus
from projections import ReceiptWorker
from projections.worker.lag import shard_lag, trim_feeds
from tests.helpers import wait_until

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-w"


async def finished(store: Store, call: str) -> None:
    """One READY invocation (three feed entries)."""
    head = await store.writer.create(RUN, call, "search", b'{"q":1}')
    head = await store.writer.start_projecting(head, b'{"raw":1}')
    await store.writer.complete(head, b'{"a":1}', EvidenceStatus.EVIDENCE_FOUND, "s")


async def opened(make_store: Any, *, shards: int, calls: int) -> Store:
    store: Store = make_store(shards=shards)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    for i in range(calls):
        await finished(store, f"c{i}")
    return store


async def pending(redis: Redis, store: Store, group: str = "receipts") -> int:
    total = 0
    for shard in range(store.keys.shards):
        if await redis.exists(store.keys.feed(shard)):
            total += (await redis.xpending(store.keys.feed(shard), group))["pending"]
    return total


async def receipt_versions(redis: Redis, store: Store) -> list[int]:
    keys = [k async for k in redis.scan_iter(match=store.keys.scan_pattern("receipt"))]
    return sorted([int(await redis.hget(k, "version")) for k in keys])


async def test_poison_entry_is_dead_lettered_after_the_delivery_limit(
    make_store: Any, redis: Redis
) -> None:
    """A garbage feed entry fails max_deliveries times, then is dead-lettered; others flow."""
    store = await opened(make_store, shards=1, calls=2)
    feed = store.keys.feed(0)
    poison_id = (await redis.xadd(feed, {"junk": "x", "v": "not-a-number"})).decode()
    await finished(store, "c2")

    worker = ReceiptWorker(store, consumer="w1", min_idle_ms=0, max_deliveries=3)
    await worker.run(burst=True)

    dead = await redis.xrange(store.keys.dead_letters(0))
    assert len(dead) == 1
    fields = dead[0][1]
    assert fields[b"entry_id"] == poison_id.encode()
    assert fields[b"reason"] == b"max_deliveries_exceeded"
    assert fields[b"error"] == b"MalformedEntry"
    assert (fields[b"deliveries"], fields[b"projection"]) == (b"4", b"receipts")
    assert (fields[b"f:junk"], fields[b"f:v"]) == (b"x", b"not-a-number")
    assert worker.counters["failed"] == 3
    assert worker.counters["dead"] == 1
    assert await receipt_versions(redis, store) == [3, 3, 3]
    assert await pending(redis, store) == 0


async def test_several_workers_share_the_shards_and_settle_each_entry_once(
    make_store: Any, redis: Redis
) -> None:
    """Three consumers of one group together settle every feed entry exactly once."""
    store = await opened(make_store, shards=4, calls=12)
    workers = [ReceiptWorker(store, consumer=f"w{i}", block_ms=20) for i in range(3)]
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while await receipt_versions(redis, store) != [3] * 12:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.02)
    finally:
        for worker in workers:
            worker.stop()
        await asyncio.gather(*tasks)

    settled = sum(w.counters["applied"] + w.counters["stale"] for w in workers)
    assert settled == 36
    positions = [await redis.hgetall(store.keys.position(s, "receipts")) for s in range(4)]
    assert sum(int(p.get(b"applied", 0)) + int(p.get(b"stale", 0)) for p in positions) == 36
    assert await pending(redis, store) == 0


async def test_worker_drains_its_own_pending_entries_on_start(
    make_store: Any, redis: Redis
) -> None:
    """Entries delivered to a consumer that stopped are settled when it starts again."""
    store = await opened(make_store, shards=1, calls=2)
    worker = ReceiptWorker(store, consumer="same", min_idle_ms=3_600_000)
    await worker.ensure_groups()
    await redis.xreadgroup("receipts", "same", {store.keys.feed(0): ">"})
    assert await pending(redis, store) == 6

    await worker.run(burst=True)

    assert await pending(redis, store) == 0
    assert worker.counters["reclaimed"] == 0
    assert await receipt_versions(redis, store) == [3, 3]


async def test_idle_entries_of_another_consumer_are_taken_over(
    make_store: Any, redis: Redis
) -> None:
    """Entries idle longer than min_idle_ms in another consumer are claimed and settled."""
    store = await opened(make_store, shards=1, calls=1)
    await ReceiptWorker(store, consumer="x").ensure_groups()
    await redis.xreadgroup("receipts", "crashed", {store.keys.feed(0): ">"})
    await asyncio.sleep(0.06)

    rescuer = ReceiptWorker(store, consumer="rescuer", min_idle_ms=50)
    await rescuer.run(burst=True)

    assert rescuer.counters["reclaimed"] == 3
    assert await pending(redis, store) == 0
    assert await receipt_versions(redis, store) == [3]


async def test_lag_figures_follow_the_backlog(make_store: Any, redis: Redis) -> None:
    """Lag counts undelivered entries, pending and oldest age count unacked ones, then all clear."""
    store = await opened(make_store, shards=1, calls=2)
    worker = ReceiptWorker(store, consumer="w1")
    before = (await worker.lag())[0]
    assert (before.lag, before.pending, before.oldest_unacked_ms) == (6, 0, 0)

    await worker.ensure_groups()
    await redis.xreadgroup("receipts", "other", {store.keys.feed(0): ">"}, count=4)
    await asyncio.sleep(0.02)
    middle = await shard_lag(store, 0, "receipts")
    assert (middle.lag, middle.pending) == (2, 4)
    assert middle.oldest_unacked_ms >= 20

    await ReceiptWorker(store, consumer="other").run(burst=True)
    after = (await worker.lag())[0]
    assert (after.lag, after.pending, after.oldest_unacked_ms) == (0, 0, 0)


async def test_trimming_keeps_pending_undelivered_and_young_entries(
    make_store: Any, redis: Redis
) -> None:
    """Trimming stops at the oldest entry any group still needs, and keeps young entries."""
    store = await opened(make_store, shards=1, calls=2)
    feed = store.keys.feed(0)
    await ReceiptWorker(store, consumer="w1").run(burst=True)
    await redis.xgroup_create(feed, "slow", id="0")
    delivered = await redis.xreadgroup("slow", "s1", {feed: ">"}, count=3)
    ids = [entry_id for entry_id, _ in delivered[0][1]]
    await redis.xack(feed, "slow", ids[0])

    assert await trim_feeds(store) == 0
    assert await redis.xlen(feed) == 6

    assert await trim_feeds(store, keep_ms=0) == 1
    assert (await redis.xrange(feed, count=1))[0][0] == ids[1]
    await redis.xack(feed, "slow", ids[1], ids[2])
    assert await trim_feeds(store, keep_ms=0) == 2
    assert await redis.xlen(feed) == 3


async def test_stop_finishes_the_batch_and_acknowledges_it(make_store: Any, redis: Redis) -> None:
    """A stopped worker returns after settling what it read; nothing stays pending."""
    store = await opened(make_store, shards=2, calls=0)
    worker = ReceiptWorker(store, consumer="w1", block_ms=50, throttle_ms=5)
    task = asyncio.create_task(worker.run())
    for i in range(5):
        await finished(store, f"c{i}")
    # Stopped once it is inside its work, not after a fixed time that a busy machine
    # may not give it.
    await wait_until(lambda: worker.counters["applied"] + worker.counters["stale"] > 0)
    worker.stop()
    await asyncio.wait_for(task, 5)

    assert await pending(redis, store) == 0
    assert worker.counters["applied"] + worker.counters["stale"] > 0


async def test_a_burst_after_stop_catches_up_with_the_backlog(
    make_store: Any, redis: Redis
) -> None:
    """stop() ends one run only: a later burst run of the same worker settles the backlog."""
    store = await opened(make_store, shards=2, calls=0)
    worker = ReceiptWorker(store, consumer="w1", block_ms=50, throttle_ms=20)
    task = asyncio.create_task(worker.run())
    for i in range(8):
        await finished(store, f"c{i}")
    worker.stop()
    await asyncio.wait_for(task, 5)

    await worker.run(burst=True)

    assert await pending(redis, store) == 0
    assert await receipt_versions(redis, store) == [3] * 8


async def test_repr_names_the_projection_consumer_and_counters(make_store: Any) -> None:
    """repr shows projection, consumer, shard count and the outcome counters."""
    store = await opened(make_store, shards=2, calls=1)
    worker = ReceiptWorker(store, consumer="w9")
    await worker.run(burst=True)
    assert repr(worker) == (
        "<ReceiptWorker projection='receipts' consumer='w9' shards=2 applied=1 stale=2>"
    )


async def test_stopped_worker_retires_its_consumer_unless_it_holds_entries(
    make_store: Any, redis: Redis
) -> None:
    """After a run the worker's consumer leaves each group, except where entries are pending."""
    store = await opened(make_store, shards=2, calls=2)
    own = shard_of(RUN, 2)
    worker = ReceiptWorker(store, consumer="tidy")
    await worker.ensure_groups()
    await redis.xreadgroup("receipts", "holder", {store.keys.feed(own): ">"}, count=1)

    await worker.run(burst=True)
    await ReceiptWorker(store, consumer="holder", shards=[1 - own]).run(burst=True)

    kept = await redis.xinfo_consumers(store.keys.feed(own), "receipts")
    assert [(c["name"], c["pending"]) for c in kept] == [(b"holder", 1)]
    assert await redis.xinfo_consumers(store.keys.feed(1 - own), "receipts") == []
