"""The shard feed is trimmed by age by the writes, never below the record TTL, and never
past an entry some consumer group has not settled.

Age is simulated without waiting: entries are written straight into the feed with
explicit stream ids (a stream id starts with its creation time in ms), some older than
the retention, some older than the TTL but within the grace period, some younger than
the TTL. The next write then trims (``feed_trim.lua``), once the oldest entry is a
minute past the retention. ``XTRIM MINID ~`` removes only whole stream nodes, so one
node straddling the horizon may keep a few old entries.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

import pytest
from redis.asyncio import Redis

from eventstore.errors import InvalidArgument
from eventstore.store import FEED_GRACE, Store
from eventstore.wire.scripts import Scripts
from eventstore.writer import Writer
from machine.codes import ErrorCode, EvidenceStatus, Status
from projections.feed import FeedEntry
from tests.helpers import RAW, REQUEST, TOOL

RUN = "run-1"
TTL = timedelta(minutes=5)
MINUTE_MS = 60_000
#: Entries written per age group; enough for several full stream nodes at any setting.
PER_GROUP = 300
#: Redis's default stream-node-max-entries: the most old entries one straddling node keeps.
NODE_MAX_ENTRIES = 100
#: A URL nothing listens on: these stores are built, never used.
OFFLINE = "redis://127.0.0.1:1/0"


@pytest.fixture
async def store(make_open_store: Any) -> Store:
    """A store with a five-minute record TTL (feed retention: TTL + one hour)."""
    store: Store = await make_open_store(shards=4, ttl=TTL)
    return store


async def server_now_ms(redis: Redis) -> int:
    """The server clock, which the scripts trim by."""
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def seed(redis: Redis, feed: str, at_ms: int, count: int) -> None:
    """Write ``count`` feed-like entries whose ids say they were made at ``at_ms``."""
    async with redis.pipeline(transaction=False) as pipe:
        for seq in range(count):
            pipe.xadd(
                feed, {"r": "old", "c": f"c{seq}", "v": 1, "t": "Preflighted"}, f"{at_ms}-{seq}"
            )
        await pipe.execute()


async def ages_left(redis: Redis, feed: str) -> list[int]:
    """The creation time (ms) of every entry still in the feed."""
    entries = cast(list[tuple[bytes, dict[bytes, bytes]]], await redis.xrange(feed))
    return [int(entry_id.split(b"-")[0]) for entry_id, _ in entries]


async def test_store_feed_retention_is_the_ttl_plus_an_hour() -> None:
    """Whatever the TTL, a store keeps feed entries an hour longer than its records."""
    for ttl in (timedelta(seconds=2), TTL, timedelta(days=1), timedelta(days=30)):
        store = Store.from_url(OFFLINE, ttl=ttl)
        try:
            assert (
                store.settings.feed_retention_ms
                == store.settings.ttl_ms + int(FEED_GRACE.total_seconds()) * 1000
            )
        finally:
            await store.aclose()


async def test_a_writer_refuses_a_feed_retention_below_the_ttl() -> None:
    """Trimming feed entries of live records would hide them from projections: refused."""
    store = Store.from_url(OFFLINE, ttl=TTL)
    try:
        with pytest.raises(InvalidArgument, match="feed retention"):
            Writer(
                store.client,
                store.keys,
                Scripts(store.client),
                ttl_ms=60_000,
                feed_retention_ms=59_999,
            )
        # Equal is the least that is allowed.
        Writer(
            store.client, store.keys, Scripts(store.client), ttl_ms=60_000, feed_retention_ms=60_000
        )
    finally:
        await store.aclose()


@pytest.mark.parametrize("write", ["create", "append"])
async def test_a_write_trims_entries_past_retention_and_keeps_younger_ones(
    store: Store, redis: Redis, write: str
) -> None:
    """After a create or an append, entries older than TTL + 1 h are gone (but for one
    straddling node); entries younger than the TTL, and those in the grace hour, all stay."""
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    feed = store.keys.feed_of(RUN)
    head = await store.writer.create(RUN, "call-0", TOOL, REQUEST) if write == "append" else None
    # Stream ids only grow: clear the feed so older ids can be written again.
    await redis.delete(feed)
    now = await server_now_ms(redis)
    expired = now - store.settings.feed_retention_ms - 5 * MINUTE_MS
    in_grace = now - store.settings.ttl_ms - 30 * MINUTE_MS
    live = now - store.settings.ttl_ms + MINUTE_MS
    for at_ms in (expired, in_grace, live):
        await seed(redis, feed, at_ms, PER_GROUP)

    if head is None:
        await store.writer.create(RUN, "call-1", TOOL, REQUEST)
    else:
        await store.writer.start_projecting(head, RAW)

    left = await ages_left(redis, feed)
    assert left.count(in_grace) == PER_GROUP
    assert left.count(live) == PER_GROUP
    assert left.count(expired) < NODE_MAX_ENTRIES
    assert len(left) == left.count(expired) + 2 * PER_GROUP + 1  # + this write's entry


async def test_entries_younger_than_the_retention_are_never_trimmed(
    store: Store, redis: Redis
) -> None:
    """Entries just inside the retention horizon survive every later write."""
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    feed = store.keys.feed_of(RUN)
    now = await server_now_ms(redis)
    # One minute inside the retention horizon: the oldest entry a trim must still keep.
    oldest_kept = now - store.settings.feed_retention_ms + MINUTE_MS
    await seed(redis, feed, oldest_kept, PER_GROUP)
    for number in range(5):
        await store.writer.create(RUN, f"call-{number}", TOOL, REQUEST)
    left = await ages_left(redis, feed)
    assert left.count(oldest_kept) == PER_GROUP
    assert len(left) == PER_GROUP + 5


async def seed_past_retention(store: Store, redis: Redis, count: int) -> tuple[str, list[str]]:
    """Open the run and fill its feed with ``count`` entries ten minutes past retention."""
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    feed = store.keys.feed_of(RUN)
    expired = await server_now_ms(redis) - store.settings.feed_retention_ms - 10 * MINUTE_MS
    await seed(redis, feed, expired, count)
    return feed, [f"{expired}-{seq}" for seq in range(count)]


async def ids_left(redis: Redis, feed: str) -> list[str]:
    entries = cast(list[tuple[bytes, dict[bytes, bytes]]], await redis.xrange(feed))
    return [entry_id.decode() for entry_id, _ in entries]


async def test_trimming_waits_until_the_oldest_entry_is_a_minute_past_the_retention(
    store: Store, redis: Redis
) -> None:
    """Entries just past the retention stay until they are a minute past it: the groups
    are read about once a minute on a busy feed, not on every write."""
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    feed = store.keys.feed_of(RUN)
    recent_past = await server_now_ms(redis) - store.settings.feed_retention_ms - 30_000
    await seed(redis, feed, recent_past, PER_GROUP)
    await store.writer.create(RUN, "call-1", TOOL, REQUEST)
    assert (await ages_left(redis, feed)).count(recent_past) == PER_GROUP


async def test_an_entry_pending_in_a_group_is_never_trimmed(store: Store, redis: Redis) -> None:
    """Entries delivered to a group but not acknowledged outlive the retention; what is
    older than the oldest of them is trimmed."""
    feed, seeded = await seed_past_retention(store, redis, PER_GROUP)
    await redis.xgroup_create(feed, "receipts", id="0")
    await redis.xreadgroup("receipts", "w", {feed: ">"}, count=PER_GROUP)
    await redis.xack(feed, "receipts", *seeded[:200])

    await store.writer.create(RUN, "call-1", TOOL, REQUEST)

    left = await ids_left(redis, feed)
    assert set(seeded[200:]) <= set(left)
    assert len(left) < PER_GROUP  # the settled entries of whole nodes went


async def test_an_entry_not_yet_delivered_to_a_group_is_never_trimmed(
    store: Store, redis: Redis
) -> None:
    """A group that has read only part of the feed keeps the rest, however old; the group
    furthest behind decides, whatever the others have settled."""
    feed, seeded = await seed_past_retention(store, redis, PER_GROUP)
    await redis.xgroup_create(feed, "progress", id="$")  # caught up, nothing pending
    await redis.xgroup_create(feed, "receipts", id=seeded[149])  # read up to entry 149

    await store.writer.create(RUN, "call-1", TOOL, REQUEST)

    left = await ids_left(redis, feed)
    assert set(seeded[150:]) <= set(left)
    assert len(left) < PER_GROUP


async def test_a_new_group_that_has_read_nothing_keeps_every_entry(
    store: Store, redis: Redis
) -> None:
    """A group created from the start of the feed needs every entry: none is trimmed."""
    feed, seeded = await seed_past_retention(store, redis, PER_GROUP)
    await redis.xgroup_create(feed, "receipts", id="0")
    await store.writer.create(RUN, "call-1", TOOL, REQUEST)
    assert (await ids_left(redis, feed))[:PER_GROUP] == seeded


async def test_each_committed_event_adds_one_entry_with_type_and_status_codes(
    store: Store, redis: Redis
) -> None:
    """A feed entry names the invocation and carries the version, the event type code and
    the status code the event gave the record: a few bytes, never a payload."""
    await store.open_run(RUN, deadline=timedelta(minutes=5), tools={TOOL: None})
    writer = store.writer
    done = await writer.create(RUN, "ok", TOOL, REQUEST)
    done = await writer.start_projecting(done, RAW)
    await writer.complete(done, b'"r"', EvidenceStatus.NO_EVIDENCE, "scope")
    failed = await writer.create(RUN, "bad", TOOL, REQUEST)
    await writer.fail(failed, ErrorCode.EXECUTION_FAILED)

    entries = await redis.xrange(store.keys.feed_of(RUN))

    assert [fields for _, fields in entries] == [
        {b"r": RUN.encode(), b"c": b"ok", b"v": b"1", b"t": b"1", b"s": b"1"},
        {b"r": RUN.encode(), b"c": b"ok", b"v": b"2", b"t": b"2", b"s": b"1"},
        {b"r": RUN.encode(), b"c": b"ok", b"v": b"3", b"t": b"3", b"s": b"2"},
        {b"r": RUN.encode(), b"c": b"bad", b"v": b"1", b"t": b"1", b"s": b"1"},
        {b"r": RUN.encode(), b"c": b"bad", b"v": b"2", b"t": b"4", b"s": b"3"},
    ]
    parsed = [FeedEntry.parse(0, i.decode(), fields) for i, fields in entries]
    assert [(e.event_type, e.status) for e in parsed] == [
        ("Preflighted", Status.PROJECTING),
        ("ProjectingStarted", Status.PROJECTING),
        ("Completed", Status.READY),
        ("Preflighted", Status.PROJECTING),
        ("Failed", Status.ERROR),
    ]
