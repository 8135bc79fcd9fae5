"""Runs are findable: open_run indexes each run per shard by open time, the listing merges
the shards newest first and pages with a cursor, and the index expires with the runs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from eventstore.audit.run_index import list_runs, parse_cursor
from eventstore.errors import InvalidArgument
from eventstore.store import Store
from eventstore.wire.keys import shard_of
from eventstore.writer import now_ms
from machine.codes import ErrorCode, EvidenceStatus
from tests.helpers import commandstats
from tests.support.waiting import wait_for

pytestmark = pytest.mark.backends("single", "cluster")


async def open_runs(store: Store, count: int) -> list[str]:
    """Open ``count`` runs one after the other (each a later open time than the last)."""
    names = []
    for index in range(count):
        name = f"run-{index:02d}"
        opened = await store.open_run(name, deadline=timedelta(minutes=5), budget=5)
        names.append(name)
        info = await store.run_info(opened.run_id)
        assert info is not None
        # Distinct open times (the server's clock), so newest first is one order.
        await wait_for(lambda info=info: now_ms() > info.created_at_ms + 1)
    return names


async def test_runs_are_listed_newest_first_across_shards(make_store: Any, redis: Any) -> None:
    """Every run, on every shard, comes back newest first; each shard's index holds its own."""
    store: Store = make_store(shards=4)
    names = await open_runs(store, 9)
    page = await list_runs(store, limit=20)
    assert [run.run_id for run in page.runs] == names[::-1]
    assert page.cursor is None
    total = 0
    for shard in range(4):
        members = await redis.zrange(store.keys.run_index(shard), 0, -1)
        total += len(members)
        for member in members:
            assert store.keys.run_index(shard_of(member.decode(), 4)) == store.keys.run_index(shard)
    assert total == 9


@pytest.mark.parametrize("shards", [1, 3])
async def test_pages_follow_the_cursor_without_gaps_or_repeats(
    make_store: Any, shards: int
) -> None:
    """Pages of 2 walk all runs exactly once, in order (also when one shard holds them
    all); the last page has no cursor."""
    store: Store = make_store(shards=shards)
    names = await open_runs(store, 7)
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        page = await list_runs(store, limit=2, cursor=cursor)
        seen += [run.run_id for run in page.runs]
        cursor = page.cursor
        if cursor is None:
            break
    assert seen == names[::-1]


async def test_ties_at_the_cursor_time_are_neither_lost_nor_repeated(
    make_store: Any, redis: Any
) -> None:
    """Runs opened in the same millisecond page through the cursor one by one."""
    store: Store = make_store(shards=2)
    names = await open_runs(store, 6)
    for name in names:  # every entry at one open time
        await redis.zadd(store.keys.run_index(shard_of(name, 2)), {name: 1_000})
    seen: list[str] = []
    cursor = None
    while True:
        page = await list_runs(store, limit=1, cursor=cursor)
        seen += [run.run_id for run in page.runs]
        if page.cursor is None:
            break
        cursor = page.cursor
    assert sorted(seen) == sorted(names) and len(seen) == len(names)


async def test_a_summary_counts_calls_by_outcome_and_budget(make_store: Any) -> None:
    """Status active/closed/expired, calls READY/ERROR/PROJECTING, budget used and total."""
    store: Store = make_store(shards=2)
    await store.open_run("run-a", deadline=timedelta(minutes=5), budget=9)
    for call, outcome in (("c1", "ready"), ("c2", "error"), ("c3", "flight")):
        head = await store.writer.create("run-a", call, "search", b"{}")
        if outcome == "ready":
            head = await store.writer.start_projecting(head, b"{}")
            await store.writer.complete(head, b"{}", EvidenceStatus.EVIDENCE_FOUND, "s")
        elif outcome == "error":
            await store.writer.fail(head, ErrorCode.EXECUTION_FAILED)
    await store.open_run("run-b", deadline=timedelta(minutes=5))
    await store.close_run("run-b")
    expired = await store.open_run("run-c", deadline=timedelta(milliseconds=500))
    # Past run-c's deadline; its hash lives on for the record TTL.
    await wait_for(lambda: now_ms() > expired.deadline_ms + 5)
    runs = {run.run_id: run for run in (await list_runs(store)).runs}
    assert runs["run-a"].status == "active"
    assert runs["run-a"].calls == {"READY": 1, "ERROR": 1, "PROJECTING": 1}
    assert (runs["run-a"].budget_used, runs["run-a"].budget_total) == (3, 9)
    assert runs["run-b"].status == "closed" and runs["run-b"].budget_total is None
    assert runs["run-c"].status == "expired"


async def test_readers_skip_runs_whose_hash_is_gone(make_store: Any, redis: Any) -> None:
    """An index entry whose run expired is skipped, and the page is still filled."""
    store: Store = make_store(shards=2)
    names = await open_runs(store, 5)
    for gone in names[-2:]:  # one key per command: they may be in different slots
        await redis.delete(store.keys.run(gone))
    page = await list_runs(store, limit=2)
    assert [run.run_id for run in page.runs] == [names[2], names[1]]


async def test_the_index_expires_with_its_runs_and_trims_the_expired(
    make_store: Any, redis: Any
) -> None:
    """The index key expires with the shard's latest run; an open trims entries older
    than the longest run lifetime the shard has seen."""
    store: Store = make_store(shards=1, ttl=timedelta(milliseconds=200))
    # A first command sets up the client (a cluster client reads the cluster's layout):
    # done before the deadline is taken, so the run is opened well inside it.
    assert await store.run_info("run-old") is None
    opened = await store.open_run("run-old", deadline=timedelta(milliseconds=500))
    answered = now_ms()
    index = store.keys.run_index(0)
    # Gone already (a loaded machine) proves an expiry as well as a TTL left does.
    assert await redis.pttl(index) in (-2, *range(1, 701))
    # The run's lifetime from the moment the script ran (deadline + TTL, 700 ms from the
    # deadline's computation): the script ran after that and before the answer came.
    lifetime = int(await redis.hget(store.keys.control(0), "run_lifetime_ms"))
    assert opened.expires_at_ms - opened.deadline_ms == 200
    assert opened.expires_at_ms - answered <= lifetime <= 700

    async def old_run_gone() -> bool:  # deadline + TTL passed: its hash expired
        return int(await redis.exists(store.keys.run("run-old"))) == 0

    await wait_for(old_run_gone, 5)
    await store.open_run("run-new", deadline=timedelta(milliseconds=500))
    assert await redis.zrange(index, 0, -1) == [b"run-new"]


async def test_listing_only_reads(make_store: Any, redis: Any) -> None:
    """No write command runs while listing (commandstats before and after)."""
    store: Store = make_store(shards=4)
    await open_runs(store, 3)
    await list_runs(store)
    before = await commandstats(redis)
    await list_runs(store, limit=1)
    after = await commandstats(redis)
    ran = {name for name, calls in after.items() if calls != before.get(name, 0)}
    assert ran and ran <= {
        "zrevrangebyscore",
        "zrange",
        "zcount",
        "hgetall",
        "llen",
        "hget",
        "info",
    }, ran


def test_a_malformed_cursor_is_refused() -> None:
    """A cursor is ``<ms>:<run id>``; anything else is an InvalidArgument."""
    assert parse_cursor("12:run-a") == (12, "run-a")
    for bad in ("abc", "12", ":run", "x:run", "12:bad id", "1" * 20 + ":r"):
        with pytest.raises(InvalidArgument):
            parse_cursor(bad)
