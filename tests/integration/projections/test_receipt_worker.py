"""ReceiptWorker: receipts materialized from records, version-guarded, expiring with them."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from redis.asyncio import Redis

from eventstore.store import Store
from eventstore.writer import Head
from machine.codes import EvidenceStatus
from machine.ids import invocation_id
from projections import ReceiptWorker
from projections.feed import FeedEntry, Outcome
from projections.receipts.builder import decode_receipt
from projections.receipts.projection import ReceiptProjection
from projections.receipts.snapshot import read_receipt_snapshot, receipt_of
from projections.worker.runtime import Worker

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-r"


async def finished(store: Store, call: str, *, run_id: str = RUN) -> Head:
    """One READY invocation written through the Writer."""
    head = await store.writer.create(run_id, call, "search", b'{"q":1}')
    head = await store.writer.start_projecting(head, b'{"raw":true}')
    return await store.writer.complete(head, b'{"a":1}', EvidenceStatus.EVIDENCE_FOUND, "s")


async def stored_receipt(redis: Redis, store: Store, call: str) -> dict[bytes, bytes]:
    key = store.keys.receipt(RUN, invocation_id(RUN, call))
    return await redis.hgetall(key)  # type: ignore[no-any-return]


async def pending(redis: Redis, store: Store, group: str) -> int:
    total = 0
    for shard in range(store.keys.shards):
        if await redis.exists(store.keys.feed(shard)):
            total += (await redis.xpending(store.keys.feed(shard), group))["pending"]
    return total


async def test_worker_materializes_the_receipt_of_every_invocation(
    make_store: Any, redis: Redis
) -> None:
    """After a burst every invocation has a receipt at its record's version, as built from it."""
    store: Store = make_store(shards=4)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    heads = [await finished(store, f"c{i}") for i in range(6)]
    unfinished = await store.writer.create(RUN, "open", "search", b"{}")

    worker = ReceiptWorker(store, consumer="w1")
    await worker.run(burst=True)

    for head in [*heads, unfinished]:
        stored = await stored_receipt(redis, store, head.tool_call_id)
        assert int(stored[b"version"]) == head.version
        materialized = decode_receipt(stored[b"receipt"])
        rebuilt = receipt_of(store, await read_receipt_snapshot(store, RUN, head.tool_call_id))
        assert msgspec.structs.replace(materialized, observed_at="") == msgspec.structs.replace(
            rebuilt, observed_at=""
        )
    assert worker.counters["applied"] >= 7
    assert await pending(redis, store, "receipts") == 0


async def test_receipt_expires_with_its_record(make_store: Any, redis: Redis) -> None:
    """The receipt's expiry is its record's absolute expiry, copied once at creation."""
    store: Store = make_store(shards=2)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    head = await finished(store, "c1")
    await ReceiptWorker(store, consumer="w1").run(burst=True)

    record_key = store.keys.record(RUN, "c1")
    receipt_key = store.keys.receipt(RUN, invocation_id(RUN, "c1"))
    info = await redis.info("server")
    if int(str(info["redis_version"]).split(".")[0]) >= 7:
        assert await redis.pexpiretime(receipt_key) == await redis.pexpiretime(record_key)
    else:
        assert abs(await redis.pttl(receipt_key) - await redis.pttl(record_key)) < 100
    assert 0 < await redis.pttl(receipt_key) <= head.expires_at_ms


async def test_out_of_order_and_duplicate_delivery_never_regress_the_receipt(
    make_store: Any, redis: Redis
) -> None:
    """Entries applied newest first leave the newest version; repeats change nothing."""
    store: Store = make_store(shards=1)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    projection = ReceiptProjection(store)
    worker = ReceiptWorker(store, consumer="w1")
    await worker.ensure_groups()
    head = await finished(store, "c1")
    feed = store.keys.feed(0)
    delivered = await redis.xreadgroup("receipts", "w1", {feed: ">"})
    entries = [FeedEntry.parse(0, i.decode(), f) for i, f in delivered[0][1]]
    assert [e.version for e in entries] == [1, 2, 3]

    outcomes = [await projection.apply(entry) for entry in reversed(entries)]
    assert outcomes == [Outcome.APPLIED, Outcome.STALE, Outcome.STALE]
    assert await projection.applied_version(RUN, "c1") == head.version == 3
    body = (await stored_receipt(redis, store, "c1"))[b"receipt"]

    assert await projection.apply(entries[-1]) is Outcome.DUPLICATE
    assert await projection.apply(entries[0]) is Outcome.DUPLICATE
    assert (await stored_receipt(redis, store, "c1"))[b"receipt"] == body
    assert await projection.applied_version(RUN, "c1") == 3
    position = await redis.hgetall(store.keys.position(0, "receipts"))
    assert (position[b"applied"], position[b"stale"]) == (b"1", b"2")
    assert position[b"last_entry_id"] == entries[-1].entry_id.encode()


async def test_replaying_the_whole_feed_changes_no_receipt(make_store: Any, redis: Redis) -> None:
    """With the group rewound to the feed's start, every entry is stale and receipts stay put."""
    store: Store = make_store(shards=2)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    for i in range(3):
        await finished(store, f"c{i}")
    await ReceiptWorker(store, consumer="w1").run(burst=True)
    before = [await stored_receipt(redis, store, f"c{i}") for i in range(3)]

    for shard in range(2):
        await redis.xgroup_setid(store.keys.feed(shard), "receipts", "0")
    replay = ReceiptWorker(store, consumer="w2")
    await replay.run(burst=True)

    assert replay.counters["stale"] == 9
    assert replay.counters["applied"] == 0
    assert [await stored_receipt(redis, store, f"c{i}") for i in range(3)] == before


async def test_wait_for_returns_once_the_receipt_reflects_the_commit(make_store: Any) -> None:
    """wait_for is True once the running worker has caught up, False when nobody projects."""
    store: Store = make_store(shards=2)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    worker = ReceiptWorker(store, consumer="w1", block_ms=50)
    task = asyncio.create_task(worker.run())
    try:
        head = await finished(store, "c1")
        assert await worker.wait_for(head, timeout_s=5) is True
        assert await worker.projection.applied_version(RUN, "c1") == 3
    finally:
        worker.stop()
        await task
    later = await store.writer.create(RUN, "c2", "search", b"{}")
    assert await worker.wait_for(later, timeout_s=0.2) is False


async def test_entry_of_an_expired_record_is_acked_and_counted(
    make_store: Any, redis: Redis
) -> None:
    """A feed entry whose record expired is acknowledged once and counted as expired."""
    store: Store = make_store(shards=1, ttl=timedelta(milliseconds=200))
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    await store.writer.create(RUN, "c1", "search", b"{}")
    await asyncio.sleep(0.35)

    worker = ReceiptWorker(store, consumer="w1")
    await worker.run(burst=True)

    assert worker.counters["expired"] == 1
    assert not await stored_receipt(redis, store, "c1")
    assert await pending(redis, store, "receipts") == 0
    assert (await redis.hgetall(store.keys.position(0, "receipts")))[b"expired"] == b"1"
    assert "expired=1" in repr(worker)


async def test_a_batch_builds_each_invocation_once_and_settles_its_older_entries_stale(
    make_store: Any, redis: Redis
) -> None:
    """One batch: the newest entry of each invocation is built, the rest settle with it."""
    store: Store = make_store(shards=1)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    projection = ReceiptProjection(store)
    await ReceiptWorker(store, consumer="w1").ensure_groups()
    heads = [await finished(store, f"c{i}") for i in range(3)]
    expired = await store.writer.create(RUN, "gone", "search", b"{}")
    await redis.delete(store.keys.record(RUN, "gone"))
    delivered = await redis.xreadgroup("receipts", "w1", {store.keys.feed(0): ">"})
    entries = [FeedEntry.parse(0, i.decode(), f) for i, f in delivered[0][1]]
    shuffled = entries[::2] + entries[1::2]

    outcomes = await projection.apply_batch(shuffled)

    by_entry = dict(zip((e.entry_id for e in shuffled), outcomes, strict=True))
    for entry in entries:
        if entry.tool_call_id == "gone":
            assert by_entry[entry.entry_id] is Outcome.EXPIRED
        elif entry.version == 3:
            assert by_entry[entry.entry_id] is Outcome.APPLIED
        else:
            assert by_entry[entry.entry_id] is Outcome.STALE
    for head in heads:
        assert await projection.applied_version(RUN, head.tool_call_id) == head.version
    assert await projection.applied_version(RUN, expired.tool_call_id) == 0
    position = await redis.hgetall(store.keys.position(0, "receipts"))
    assert (position[b"applied"], position[b"stale"], position[b"expired"]) == (b"3", b"6", b"1")
    assert await pending(redis, store, "receipts") == 0
    assert await projection.apply_batch(entries) == [Outcome.DUPLICATE] * len(entries)


class FailsOnPoison(ReceiptProjection):
    """A receipt projection that cannot project the call ``poison`` (a bug, say)."""

    async def apply_batch(self, entries: Sequence[FeedEntry]) -> list[Outcome]:
        if any(entry.tool_call_id == "poison" for entry in entries):
            raise RuntimeError("cannot project")
        return await super().apply_batch(entries)

    async def apply(self, entry: FeedEntry) -> Outcome:
        if entry.tool_call_id == "poison":
            raise RuntimeError("cannot project")
        return await super().apply(entry)


async def test_an_entry_that_fails_in_a_batch_fails_alone(make_store: Any, redis: Redis) -> None:
    """A batch that fails is settled entry by entry: only the bad entries are dead-lettered."""
    store: Store = make_store(shards=1)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    heads = [await finished(store, f"c{i}") for i in range(3)]
    await store.writer.create(RUN, "poison", "search", b"{}")
    worker = Worker(store, FailsOnPoison(store), consumer="w1", min_idle_ms=0, max_deliveries=2)

    for _ in range(3):  # each pass delivers the poison entry again, until it is dead
        await worker.run(burst=True)

    assert worker.counters["applied"] == 3 and worker.counters["dead"] == 1
    for head in heads:
        assert int((await stored_receipt(redis, store, head.tool_call_id))[b"version"]) == 3
    dead = await redis.xrange(store.keys.dead_letters(0))
    assert [fields[b"f:c"] for _, fields in dead] == [b"poison"]
    assert await pending(redis, store, "receipts") == 0
