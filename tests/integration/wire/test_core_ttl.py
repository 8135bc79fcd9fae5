"""TTL is set once, at creation: reads never touch it, updates keep it, nothing is immortal."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from eventstore.errors import RecordExpired, Refused
from eventstore.store import Store
from machine.codes import ErrorCode, EvidenceStatus
from tests.conftest import RedisServer
from tests.helpers import (
    RAW,
    REQUEST,
    RESULT,
    TOOL,
    commandstats,
    namespace_keys,
    open_store,
    record_fields,
)

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-1"
#: Commands that can set, extend or remove an expiry.
TTL_COMMANDS = ("expire", "pexpire", "expireat", "pexpireat", "persist", "getex")


@pytest.fixture
async def store(make_open_store: Any) -> Store:
    """A store with a one-minute record TTL and one open run."""
    store: Store = await make_open_store(shards=4, ttl=timedelta(minutes=1))
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    return store


async def expiry_ms(redis: Redis, key: str, version: tuple[int, int, int]) -> int:
    """The key's absolute expiry: PEXPIRETIME on Redis 7, else derived from PTTL."""
    if version >= (7, 0, 0):
        return int(await redis.execute_command("PEXPIRETIME", key))
    pttl = int(await redis.pttl(key))
    assert pttl > 0
    return time.time_ns() // 1_000_000 + pttl


def ttl_calls(stats: dict[str, int]) -> dict[str, int]:
    """Calls of the expiry-changing commands in one commandstats snapshot."""
    return {name: stats.get(name, 0) for name in TTL_COMMANDS}


async def test_creation_sets_one_expiry_on_record_and_stream(
    store: Store, redis: Redis, redis_server: RedisServer
) -> None:
    """Record and stream get one absolute expiry at creation, the one the record names."""
    before = time.time_ns() // 1_000_000
    head = await store.writer.create(RUN, "call-1", TOOL, REQUEST)
    record, stream = store.keys.record(RUN, "call-1"), store.keys.stream(RUN, "call-1")
    assert 0 < await redis.pttl(record) <= 60_000
    assert 0 < await redis.pttl(stream) <= 60_000
    assert before + 60_000 <= head.expires_at_ms <= time.time_ns() // 1_000_000 + 60_000
    assert int(await redis.hget(record, "expires_at_ms")) == head.expires_at_ms
    got = await store.get(RUN, "call-1")
    assert got is not None and got.expires_at_ms == head.expires_at_ms
    if redis_server.version >= (7, 0, 0):
        assert await expiry_ms(redis, record, redis_server.version) == head.expires_at_ms
        assert await expiry_ms(redis, stream, redis_server.version) == head.expires_at_ms
    else:
        for key in (record, stream):
            assert abs(await expiry_ms(redis, key, redis_server.version) - head.expires_at_ms) < 250


async def test_reads_never_touch_the_expiry(
    store: Store, redis: Redis, redis_server: RedisServer
) -> None:
    """store.get, store.events and the reader issue no expiry command and leave PTTL as is."""
    head = await store.writer.create(RUN, "call-1", TOOL, REQUEST)
    head = await store.writer.start_projecting(head, RAW)
    record, stream = store.keys.record(RUN, "call-1"), store.keys.stream(RUN, "call-1")
    await asyncio.sleep(0.05)
    pttl_before = await redis.pttl(record)
    all_before = await commandstats(redis)
    stats_before = ttl_calls(all_before)
    for _ in range(3):
        assert await store.get(RUN, "call-1") is not None
        assert len(await store.events(RUN, "call-1")) == 2
        assert await record_fields(store, RUN, "call-1")
        assert len(await store.events(RUN, "call-1")) == 2
        assert await store.run_info(RUN) is not None
    all_after = await commandstats(redis)
    assert ttl_calls(all_after) == stats_before
    # The snapshot does see the reads, so the equality above is a real measurement.
    assert all_after["hgetall"] - all_before.get("hgetall", 0) >= 6
    assert all_after["xrange"] - all_before.get("xrange", 0) >= 6
    assert await redis.pttl(record) <= pttl_before
    if redis_server.version >= (7, 0, 0):
        assert await expiry_ms(redis, record, redis_server.version) == head.expires_at_ms
        assert await expiry_ms(redis, stream, redis_server.version) == head.expires_at_ms


async def test_updates_keep_the_remaining_ttl(
    store: Store, redis: Redis, redis_server: RedisServer
) -> None:
    """ProjectingStarted and Completed leave record and stream expiring when they did."""
    head = await store.writer.create(RUN, "call-1", TOOL, REQUEST)
    created = head.expires_at_ms
    record, stream = store.keys.record(RUN, "call-1"), store.keys.stream(RUN, "call-1")
    await asyncio.sleep(0.3)
    head = await store.writer.start_projecting(head, RAW)
    assert head.expires_at_ms == created
    head = await store.writer.complete(head, RESULT, EvidenceStatus.EVIDENCE_FOUND, "docs")
    assert head.expires_at_ms == created
    assert int(await redis.hget(record, "expires_at_ms")) == created
    # 300 ms passed since creation, so a reset TTL would exceed what is left of the first.
    for key in (record, stream):
        # The clock is read before the command: the server's "now" is later, so what is
        # left can only be less (a reading after the reply would race a busy machine).
        before_ms = time.time_ns() // 1_000_000
        assert await redis.pttl(key) <= created - before_ms + 1
        if redis_server.version >= (7, 0, 0):
            assert await expiry_ms(redis, key, redis_server.version) == created


async def test_progress_list_expires_with_the_run(store: Store, redis: Redis) -> None:
    """A terminal event creates the run's progress list with the run's expiry."""
    head = await store.writer.create(RUN, "call-1", TOOL, REQUEST)
    head = await store.writer.start_projecting(head, RAW)
    await store.writer.complete(head, RESULT, EvidenceStatus.NO_EVIDENCE, "docs")
    info = await store.run_info(RUN)
    assert info is not None
    progress_ttl = await redis.pttl(store.keys.progress(RUN))
    assert progress_ttl > 0
    assert abs(progress_ttl - (info.expires_at_ms - time.time_ns() // 1_000_000)) < 250


async def test_update_after_expiry_creates_nothing(
    redis_url: str, namespace: str, redis: Redis
) -> None:
    """Past the record TTL an update raises RecordExpired and leaves no key without expiry."""
    async with open_store(redis_url, namespace, ttl=timedelta(milliseconds=300)) as store:
        await store.open_run(RUN, deadline=timedelta(minutes=1))
        head = await store.writer.create(RUN, "call-1", TOOL, REQUEST)
        await asyncio.sleep(0.45)
        with pytest.raises(RecordExpired):
            await store.writer.start_projecting(head, RAW)
        with pytest.raises(RecordExpired):
            await store.writer.fail(head, ErrorCode.EXECUTION_FAILED)
        with pytest.raises(RecordExpired):
            await store.writer.complete(head, RESULT, EvidenceStatus.EVIDENCE_FOUND, "docs")
        record, stream = store.keys.record(RUN, "call-1"), store.keys.stream(RUN, "call-1")
        assert await redis.exists(record, stream) == 0
        assert await redis.exists(store.keys.progress(RUN)) == 0
        assert await store.get(RUN, "call-1") is None
        assert await store.events(RUN, "call-1") == []
        unexpiring = (
            {store.keys.meta()}
            | {store.keys.feed(shard) for shard in range(store.keys.shards)}
            | {store.keys.control(shard) for shard in range(store.keys.shards)}
        )
        keys = await namespace_keys(redis, namespace)
        assert keys, "the run and the feed should still exist"
        for key in keys:
            if key.decode() not in unexpiring:
                assert await redis.pttl(key) > 0, f"{key!r} has no expiry"


async def test_an_expired_call_id_stays_used(redis_url: str, namespace: str, redis: Redis) -> None:
    """Re-creating a call whose record expired is still a duplicate and creates nothing."""
    async with open_store(redis_url, namespace, ttl=timedelta(milliseconds=200)) as store:
        await store.open_run(RUN, deadline=timedelta(minutes=1))
        await store.writer.create(RUN, "call-1", TOOL, REQUEST)
        await asyncio.sleep(0.3)
        assert await store.get(RUN, "call-1") is None
        with pytest.raises(Refused) as refused:
            await store.writer.create(RUN, "call-1", TOOL, REQUEST)
        assert refused.value.code == ErrorCode.DUPLICATE_TOOL_CALL.value
        record, stream = store.keys.record(RUN, "call-1"), store.keys.stream(RUN, "call-1")
        assert await redis.exists(record, stream) == 0
        info = await store.run_info(RUN)
        assert info is not None and info.used_total == 1
