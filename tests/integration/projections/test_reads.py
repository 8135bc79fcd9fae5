"""How a worker reads the shard feeds of one server: one blocking read covers them all."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from eventstore.store import Store
from eventstore.wire.keys import shard_of
from eventstore.writer import Head
from machine.codes import EvidenceStatus
from projections import ReceiptWorker
from projections.worker.groups import GroupMissing, claim_idle, ensure_group, read_groups

SHARDS = 8


async def blocked_readers(redis: Redis) -> int:
    """Clients of the server blocked in XREADGROUP right now."""
    clients = await redis.client_list()
    return sum(1 for c in clients if c["cmd"] == "xreadgroup" and "b" in c["flags"])


async def wait_until_blocked(redis: Redis, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while await blocked_readers(redis) == 0:
        assert loop.time() < deadline, "the worker never blocked on its feeds"
        await asyncio.sleep(0.01)


def runs_on_every_shard() -> list[str]:
    """One run id per shard."""
    by_shard: dict[int, str] = {}
    number = 0
    while len(by_shard) < SHARDS:
        by_shard.setdefault(shard_of(f"run-{number}", SHARDS), f"run-{number}")
        number += 1
    return list(by_shard.values())


async def finished(store: Store, run_id: str, call: str) -> Head:
    head = await store.writer.create(run_id, call, "search", b'{"q":1}')
    head = await store.writer.start_projecting(head, b'{"raw":1}')
    return await store.writer.complete(head, b'{"a":1}', EvidenceStatus.EVIDENCE_FOUND, "s")


async def test_one_blocking_read_covers_every_shard_feed(make_store: Any, redis: Redis) -> None:
    """A following worker waits on all its feeds with one XREADGROUP and serves each shard."""
    store: Store = make_store(shards=SHARDS)
    runs = runs_on_every_shard()
    for run_id in runs:
        await store.open_run(run_id, deadline=timedelta(minutes=5))
    worker = ReceiptWorker(store, consumer="one-reader", block_ms=200)
    task = asyncio.create_task(worker.run())
    try:
        await wait_until_blocked(redis)
        assert await blocked_readers(redis) == 1
        heads = [await finished(store, run_id, "c1") for run_id in runs]
        for head in heads:
            assert await worker.wait_for(head, timeout_s=5)
        await wait_until_blocked(redis)
        assert await blocked_readers(redis) == 1
    finally:
        worker.stop()
        await task
    assert worker.counters["applied"] + worker.counters["stale"] == 3 * SHARDS


async def test_read_groups_answers_by_feed_and_only_feeds_with_entries(
    make_store: Any, redis: Redis
) -> None:
    """Entries come back under their own feed; a feed with nothing new is left out."""
    store: Store = make_store(shards=SHARDS)
    feeds = [store.keys.feed(shard) for shard in range(3)]
    for feed in feeds:
        await ensure_group(redis, feed, "g")
    first = (await redis.xadd(feeds[0], {"n": "1"})).decode()
    third = (await redis.xadd(feeds[2], {"n": "3"})).decode()

    read = await read_groups(redis, dict.fromkeys(feeds, ">"), "g", "c", count=10, block_ms=None)

    assert read == {feeds[0]: [(first, {b"n": b"1"})], feeds[2]: [(third, {b"n": b"3"})]}
    again = await read_groups(redis, dict.fromkeys(feeds, ">"), "g", "c", count=10, block_ms=None)
    assert again == {}


async def test_read_groups_reports_a_missing_group(make_store: Any, redis: Redis) -> None:
    """One feed without the group makes the whole read raise GroupMissing."""
    store: Store = make_store(shards=SHARDS)
    feeds = [store.keys.feed(shard) for shard in range(2)]
    await ensure_group(redis, feeds[0], "g")
    await redis.xadd(feeds[1], {"n": "1"})
    with pytest.raises(GroupMissing):
        await read_groups(redis, dict.fromkeys(feeds, ">"), "g", "c", count=10, block_ms=None)


async def test_entries_of_two_feeds_with_the_same_ids_settle_in_one_batch(
    make_store: Any, redis: Redis
) -> None:
    """Entry ids are unique per feed only: a batch spanning feeds tells entries apart by
    shard, so every entry of both feeds is projected, counted and acknowledged once."""
    store: Store = make_store(shards=SHARDS)
    runs = runs_on_every_shard()[:2]
    heads = []
    for run_id in runs:
        await store.open_run(run_id, deadline=timedelta(minutes=5))
        heads.append(await finished(store, run_id, "c1"))
    for run_id in runs:  # rewrite both feeds with the same entry ids 1-1, 1-2, 1-3
        feed = store.keys.feed_of(run_id)
        entries = await redis.xrange(feed)
        await redis.delete(feed)
        for number, (_, fields) in enumerate(entries, start=1):
            await redis.xadd(feed, fields, id=f"1-{number}")

    worker = ReceiptWorker(store, consumer="same-ids", block_ms=100)
    task = asyncio.create_task(worker.run())
    try:
        for head in heads:
            assert await worker.wait_for(head, timeout_s=5)
    finally:
        worker.stop()
        await task

    assert worker.counters["applied"] + worker.counters["stale"] == 6
    assert worker.counters["failed"] == worker.counters["duplicate"] == 0
    for run_id in runs:
        feed = store.keys.feed_of(run_id)
        assert (await redis.xpending(feed, "receipts"))["pending"] == 0
        position = store.keys.position(shard_of(run_id, SHARDS), "receipts")
        assert await redis.hget(position, "last_entry_id") == b"1-3"


async def test_claim_idle_reports_a_missing_group(make_store: Any, redis: Redis) -> None:
    """A reclaim on a feed whose group is gone raises GroupMissing, not 'unavailable'."""
    store: Store = make_store(shards=SHARDS)
    feed = store.keys.feed(0)
    await redis.xadd(feed, {"n": "1"})
    with pytest.raises(GroupMissing):
        await claim_idle(redis, feed, "g", "c", min_idle_ms=0, cursor="0-0", count=10)


async def test_a_worker_whose_groups_vanish_creates_them_again_and_goes_on(
    make_store: Any, redis: Redis
) -> None:
    """A server that comes back without its data has no groups: whether the worker's next
    command is a reclaim or a read, it creates them again and serves what comes next."""
    store: Store = make_store(shards=SHARDS)
    runs = runs_on_every_shard()
    for run_id in runs:
        await store.open_run(run_id, deadline=timedelta(minutes=5))
    # min_idle_ms=0: a reclaim is due on almost every turn, so both orders happen.
    worker = ReceiptWorker(store, consumer="survivor", block_ms=50, min_idle_ms=0)
    task = asyncio.create_task(worker.run())
    try:
        for cycle in range(6):
            await wait_until_blocked(redis)
            await redis.delete(*(store.keys.feed(shard) for shard in range(SHARDS)))
            heads = [await finished(store, run_id, f"c{cycle}") for run_id in runs]
            for head in heads:
                assert await worker.wait_for(head, timeout_s=10), (cycle, head)
    finally:
        worker.stop()
        await task
