"""Rebuilding a projection from the records into a new generation, and switching to it.

``canon rebuild receipts|progress`` recomputes a projection's output from the canonical
records beside the generation readers use, switches every reader in one step, moves live
workers over without stopping them, and never counts an invocation twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import msgspec
import pytest
import redis as sync_redis
from redis.asyncio import Redis

from eventstore.errors import RebuildLost
from eventstore.store import Store
from eventstore.wire.cluster import split_cluster_parameter
from eventstore.writer import Head
from machine.codes import ErrorCode, EvidenceStatus
from machine.ids import invocation_id
from projections import ProgressWorker, ReceiptWorker, read_view
from projections.generations import current_generation
from projections.rebuild import Rebuild, RebuildInProgress
from projections.receipts.builder import decode_receipt, encode_receipt
from projections.receipts.inspection import inspect_invocation
from projections.worker.runtime import Worker
from tests.helpers import wait_until

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-rb"


async def finished(store: Store, call: str, *, run_id: str = RUN, fail: bool = False) -> Head:
    """One invocation driven to READY (or to ERROR with ``fail``)."""
    head = await store.writer.create(run_id, call, "search", b'{"q":1}')
    head = await store.writer.start_projecting(head, b'{"raw":true}')
    if fail:
        return await store.writer.fail(head, ErrorCode.EXECUTION_FAILED)
    return await store.writer.complete(head, b'{"a":1}', EvidenceStatus.EVIDENCE_FOUND, "s")


async def keys_of(redis: Redis, store: Store, kind: str) -> list[bytes]:
    return [key async for key in redis.scan_iter(match=store.keys.scan_pattern(kind), count=1000)]


async def groups_on_feeds(redis: Redis, store: Store) -> set[str]:
    names: set[str] = set()
    for shard in range(store.keys.shards):
        if await redis.exists(store.keys.feed(shard)):
            names |= {g["name"].decode() for g in await redis.xinfo_groups(store.keys.feed(shard))}
    return names


async def truth(redis: Redis, store: Store, run_id: str, calls: list[str]) -> Counter[str]:
    """Invocations of ``run_id`` by status, read from the records themselves."""
    counts: Counter[str] = Counter()
    for call in calls:
        status = await redis.hget(store.keys.record(run_id, call), "status")
        if status is not None:
            counts[status.decode()] += 1
    return counts


@contextlib.asynccontextmanager
async def following(*workers: Worker) -> AsyncIterator[None]:
    """Run ``workers`` in the background for the block; stop and await them after."""
    tasks = [asyncio.create_task(worker.run()) for worker in workers]
    try:
        yield
    finally:
        for worker in workers:
            worker.stop()
        await asyncio.gather(*tasks)


async def test_rebuild_switches_readers_to_receipts_recomputed_from_the_records(
    make_store: Any, redis: Redis
) -> None:
    """After a bug fix, receipts rebuilt from the records replace the wrong ones at once."""
    store: Store = make_store(shards=2)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    heads = [await finished(store, f"c{i}") for i in range(5)]
    await ReceiptWorker(store, consumer="w").run(burst=True)
    # A buggy earlier projection stored a wrong evidence status in one receipt.
    wrong_key = store.keys.receipt(RUN, invocation_id(RUN, "c0"))
    right = decode_receipt(await redis.hget(wrong_key, "receipt"))
    wrong = msgspec.structs.replace(right, evidence_status=EvidenceStatus.NO_EVIDENCE)
    await redis.hset(wrong_key, "receipt", encode_receipt(wrong))
    before = await inspect_invocation(store, RUN, invocation_id(RUN, "c0"))
    assert before.evidence_status is EvidenceStatus.NO_EVIDENCE

    report = await Rebuild(store, "receipts").run()

    assert (report.previous_generation, report.generation) == (1, 2)
    assert report.records == {"applied": 5}
    assert await current_generation(store, "receipts") == 2
    after = await inspect_invocation(store, RUN, invocation_id(RUN, "c0"))
    assert after.evidence_status is EvidenceStatus.EVIDENCE_FOUND
    rebuilt = await keys_of(redis, store, "receipt.g2")
    assert len(rebuilt) == len(heads)
    for head in heads:
        key = store.keys.receipt(RUN, invocation_id(RUN, head.tool_call_id), 2)
        assert int(await redis.hget(key, "version")) == head.version
        record_ttl = await redis.pttl(store.keys.record(RUN, head.tool_call_id))
        assert abs(await redis.pttl(key) - record_ttl) < 100  # expires with its record
    assert report.old_generation_removed
    assert await keys_of(redis, store, "receipt") == []
    assert "receipts" not in await groups_on_feeds(redis, store)
    assert "receipts.g2" in await groups_on_feeds(redis, store)


async def test_live_workers_follow_the_switch_and_nothing_is_counted_twice(
    make_store: Any, redis: Redis
) -> None:
    """Writers and following workers run through a progress rebuild; counts stay exact."""
    store: Store = make_store(shards=4)
    runs = [f"{RUN}-{n}" for n in range(3)]
    for run_id in runs:
        await store.open_run(run_id, deadline=timedelta(minutes=5))
    calls: dict[str, list[str]] = {run_id: [] for run_id in runs}
    progress = ProgressWorker(store, consumer="live-p", block_ms=50)
    receipts = ReceiptWorker(store, consumer="live-r", block_ms=50)
    halfway = asyncio.Event()

    async def write(run_id: str) -> list[Head]:
        heads = []
        for i in range(60):
            call = f"c{i}"
            calls[run_id].append(call)
            if i % 7 == 3:  # some stay open
                heads.append(await store.writer.create(run_id, call, "search", b"{}"))
            else:
                heads.append(await finished(store, call, run_id=run_id, fail=i % 5 == 0))
            if i == 20:
                halfway.set()
            await asyncio.sleep(0.002)
        return heads

    async with following(progress, receipts):
        writers = [asyncio.create_task(write(run_id)) for run_id in runs]
        await halfway.wait()
        report = await Rebuild(store, "progress").run()
        heads = [head for done in await asyncio.gather(*writers) for head in done]
        for head in heads:
            assert await progress.wait_for(head), "the live worker fell behind"
            assert await receipts.wait_for(head)

    assert report.generation == 2
    assert report.old_generation_removed
    assert progress.projection.name == "progress.g2"
    assert receipts.projection.name == "receipts"  # only the progress projection moved
    for run_id in runs:
        view = await read_view(store, run_id)
        assert view is not None
        expected = await truth(redis, store, run_id, calls[run_id])
        assert view.by_status == dict(expected)
        assert view.invocations == sum(expected.values()) == 60
    assert await keys_of(redis, store, "rview") == []
    assert {"progress", "progress.g2"} & await groups_on_feeds(redis, store) == {"progress.g2"}


async def test_rebuilding_twice_counts_the_same_and_removes_each_previous_generation(
    make_store: Any, redis: Redis
) -> None:
    """A second rebuild makes generation 3 from the records, equal to generation 2."""
    store: Store = make_store(shards=2)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    for i in range(8):
        await finished(store, f"c{i}", fail=i % 3 == 0)
    await ProgressWorker(store, consumer="w").run(burst=True)
    first = await read_view(store, RUN)

    await Rebuild(store, "progress").run()
    second = await read_view(store, RUN)
    report = await Rebuild(store, "progress").run()
    third = await read_view(store, RUN)

    assert report.generation == 3
    assert first is not None and second is not None and third is not None
    assert first.by_status == second.by_status == third.by_status == {"READY": 5, "ERROR": 3}
    assert first.facts == second.facts == third.facts
    assert await keys_of(redis, store, "rview.g2") == []
    assert len(await keys_of(redis, store, "rview.g3")) == 1


async def test_a_rebuild_is_refused_while_another_holds_the_claim(
    make_store: Any, redis: Redis
) -> None:
    """One rebuild per projection at a time; the refusal names the other one."""
    store: Store = make_store(shards=1)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    await finished(store, "c1")
    await redis.hset(store.keys.meta(), "rebuilding:receipts", "2:1700000000000:other")

    with pytest.raises(RebuildInProgress, match="generation 2 holds the claim since 2023"):
        await Rebuild(store, "receipts").run()

    assert await current_generation(store, "receipts") == 1
    assert await redis.hget(store.keys.meta(), "rebuilding:receipts") == b"2:1700000000000:other"


async def test_takeover_replaces_a_dead_rebuild_and_removes_its_half_built_generation(
    make_store: Any, redis: Redis
) -> None:
    """``takeover`` builds past the abandoned generation and deletes what it left."""
    store: Store = make_store(shards=1)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    await finished(store, "c1")
    # A rebuild into generation 2 died half way: a claim, a group and one output.
    await redis.hset(store.keys.meta(), "rebuilding:receipts", "2:1700000000000:dead")
    await redis.xgroup_create(store.keys.feed(0), "receipts.g2", id="$", mkstream=True)
    await redis.hset(store.keys.receipt(RUN, invocation_id(RUN, "c1"), 2), "version", 1)

    report = await Rebuild(store, "receipts", takeover=True).run()

    assert report.generation == 3
    assert await current_generation(store, "receipts") == 3
    assert await keys_of(redis, store, "receipt.g2") == []
    assert "receipts.g2" not in await groups_on_feeds(redis, store)
    assert await redis.hget(store.keys.meta(), "rebuilding:receipts") is None
    receipt = await inspect_invocation(store, RUN, invocation_id(RUN, "c1"))
    assert receipt.tool_call_id == "c1"


async def test_a_rebuild_whose_claim_was_taken_over_never_switches(
    make_store: Any, redis: Redis, redis_url: str
) -> None:
    """If another rebuild takes the claim mid-way, this one stops before switching readers."""
    store: Store = make_store(shards=1)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    await finished(store, "c1")
    meta = store.keys.meta()
    url, cluster = split_cluster_parameter(redis_url)
    thief = sync_redis.RedisCluster.from_url(url) if cluster else sync_redis.Redis.from_url(url)

    def steal(_done: int) -> None:
        thief.hset(meta, "rebuilding:receipts", "9:1700000000000:thief")

    try:
        with pytest.raises(RebuildLost):
            await Rebuild(store, "receipts", on_record=steal).run()
    finally:
        thief.close()
    assert await current_generation(store, "receipts") == 1


async def test_keep_old_leaves_the_previous_generation_in_place(
    make_store: Any, redis: Redis
) -> None:
    """With ``keep_old`` the old outputs stay (they expire with their records)."""
    store: Store = make_store(shards=1)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    await finished(store, "c1")
    await ReceiptWorker(store, consumer="w").run(burst=True)

    report = await Rebuild(store, "receipts", keep_old=True).run()

    assert not report.old_generation_removed
    assert len(await keys_of(redis, store, "receipt")) == 1
    assert len(await keys_of(redis, store, "receipt.g2")) == 1


async def test_the_old_generation_is_kept_while_a_pinned_worker_still_uses_it(
    make_store: Any, redis: Redis
) -> None:
    """A worker pinned to generation 1 keeps its group alive: the rebuild waits, then keeps it."""
    store: Store = make_store(shards=1)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    await finished(store, "c1")
    pinned = ReceiptWorker(store, consumer="pinned", block_ms=50, generation=1)

    async with following(pinned):
        report = await Rebuild(store, "receipts", grace_s=3).run()

    assert report.generation == 2
    assert not report.old_generation_removed
    assert "receipts" in await groups_on_feeds(redis, store)


async def test_a_following_worker_does_not_recreate_the_group_of_a_retired_generation(
    make_store: Any, redis: Redis
) -> None:
    """Its group deleted after readers moved on, a worker joins the current generation."""
    store: Store = make_store(shards=1)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    worker = ReceiptWorker(store, consumer="w", block_ms=50)
    async with following(worker):

        async def following_its_group() -> bool:
            if not await redis.exists(store.keys.feed(0)):
                return False
            groups = await redis.xinfo_groups(store.keys.feed(0))
            return any(group["name"] == b"receipts" and group["consumers"] for group in groups)

        await wait_until(following_its_group)
        await redis.hset(store.keys.meta(), "generation:receipts", 2)
        await redis.xgroup_destroy(store.keys.feed(0), "receipts")
        head = await finished(store, "c1")
        assert await worker.wait_for(head)
    assert worker.projection.name == "receipts.g2"
    assert await groups_on_feeds(redis, store) == {"receipts.g2"}
    key = store.keys.receipt(RUN, invocation_id(RUN, "c1"), 2)
    assert int(await redis.hget(key, "version")) == head.version
