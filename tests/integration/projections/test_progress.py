"""ProgressWorker: a bounded per-run view, version-guarded, expiring with its run."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from eventstore.boundary.contracts import RunContext
from eventstore.store import Store
from machine.codes import ErrorCode, EvidenceStatus
from machine.limits import Limits
from projections import ProgressWorker, observed_facts, read_view
from projections.feed import FeedEntry, Outcome
from projections.progress import ProgressProjection

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-p"


async def call(store: Store, name: str, evidence: EvidenceStatus | None, *, run_id: str = RUN):
    """A READY call with ``evidence``, or an ERROR call when ``evidence`` is None."""
    head = await store.writer.create(run_id, name, "search", b'{"q":1}')
    head = await store.writer.start_projecting(head, b'{"raw":1}')
    if evidence is None:
        return await store.writer.fail(head, ErrorCode.PROJECTION_FAILED)
    return await store.writer.complete(head, b'{"a":1}', evidence, f"scope-{name}")


async def test_view_counts_by_status_and_evidence_and_lists_the_facts(make_store: Any) -> None:
    """The view counts calls by status and evidence and holds the run's facts in order."""
    store: Store = make_store(shards=2)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    await call(store, "a", EvidenceStatus.EVIDENCE_FOUND)
    await call(store, "b", None)
    await call(store, "c", EvidenceStatus.NO_EVIDENCE)
    await store.writer.create(RUN, "d", "search", b"{}")

    await ProgressWorker(store, consumer="p1").run(burst=True)

    view = await read_view(store, RUN)
    assert view is not None
    assert view.invocations == 4
    assert view.by_status == {"READY": 2, "ERROR": 1, "PROJECTING": 1}
    assert view.by_evidence == {"EVIDENCE_FOUND": 1, "NO_EVIDENCE": 1, "ERROR": 1, "PENDING": 1}
    record = await store.get(RUN, "d")
    assert record is not None and view.updated_at_ms == record.state.updated_at_ms
    facts = await observed_facts(store, RunContext(RUN))
    assert [f["tool_call_id"] for f in view.facts] == [f.tool_call_id for f in facts] == ["a", "c"]
    assert [f["kind"] for f in view.facts] == ["evidence", "negative_observation"]


async def test_replayed_entries_never_double_count(make_store: Any, redis: Redis) -> None:
    """With the group rewound, every entry is replayed and no count changes."""
    store: Store = make_store(shards=2)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    for name in ("a", "b", "c"):
        await call(store, name, EvidenceStatus.EVIDENCE_FOUND)
    await ProgressWorker(store, consumer="p1").run(burst=True)
    before = await redis.hgetall(store.keys.run_view(RUN))

    for shard in range(2):
        await redis.xgroup_setid(store.keys.feed(shard), "progress", "0")
    replay = ProgressWorker(store, consumer="p2")
    await replay.run(burst=True)

    assert (replay.counters["stale"], replay.counters["applied"]) == (9, 0)
    assert await redis.hgetall(store.keys.run_view(RUN)) == before


async def test_a_call_moves_between_counts_as_it_progresses(make_store: Any) -> None:
    """A call counted PROJECTING is moved to READY when its later events are projected."""
    store: Store = make_store(shards=1)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    worker = ProgressWorker(store, consumer="p1")
    head = await store.writer.create(RUN, "a", "search", b"{}")
    await worker.run(burst=True)
    first = await read_view(store, RUN)
    assert first is not None and first.by_status == {"PROJECTING": 1}
    assert first.facts == []

    head = await store.writer.start_projecting(head, b"{}")
    head = await store.writer.complete(head, b"1", EvidenceStatus.EVIDENCE_FOUND, "s")
    await worker.run(burst=True)

    view = await read_view(store, RUN)
    assert view is not None
    assert (view.invocations, view.by_status, view.by_evidence) == (
        1,
        {"READY": 1},
        {"EVIDENCE_FOUND": 1},
    )
    assert await worker.projection.applied_version(RUN, "a") == head.version


async def test_facts_in_the_view_are_bounded(make_store: Any) -> None:
    """The view holds at most the store's fact count, the earliest calls first."""
    store: Store = make_store(shards=1, limits=Limits(fact_count=3))
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    for i in range(5):
        await call(store, f"c{i}", EvidenceStatus.EVIDENCE_FOUND)
    await ProgressWorker(store, consumer="p1").run(burst=True)
    view = await read_view(store, RUN)
    assert view is not None and view.invocations == 5
    assert [f["tool_call_id"] for f in view.facts] == ["c0", "c1", "c2"]


async def test_view_expires_with_its_run(make_store: Any, redis: Redis) -> None:
    """The view's expiry is the run's absolute expiry."""
    store: Store = make_store(shards=1)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    await call(store, "a", EvidenceStatus.EVIDENCE_FOUND)
    await ProgressWorker(store, consumer="p1").run(burst=True)
    view_ttl = await redis.pttl(store.keys.run_view(RUN))
    run_ttl = await redis.pttl(store.keys.run(RUN))
    assert view_ttl > 0
    assert abs(view_ttl - run_ttl) < 100


async def test_wait_for_sees_the_view_catch_up(make_store: Any) -> None:
    """ProgressWorker.wait_for is True once the view reflects the commit."""
    store: Store = make_store(shards=1)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    head = await call(store, "a", EvidenceStatus.EVIDENCE_FOUND)
    worker = ProgressWorker(store, consumer="p1")
    assert await worker.wait_for(head, timeout_s=0.05) is False
    await worker.run(burst=True)
    assert await worker.wait_for(head, timeout_s=0.05) is True


async def test_a_batch_counts_each_invocation_once_and_settles_its_older_entries_stale(
    make_store: Any, redis: Redis
) -> None:
    """One batch, in any order: counts as the records say, facts once, each entry settled."""
    store: Store = make_store(shards=1)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    projection = ProgressProjection(store)
    await ProgressWorker(store, consumer="w1").ensure_groups()
    await call(store, "a", EvidenceStatus.EVIDENCE_FOUND)
    await call(store, "b", EvidenceStatus.NO_EVIDENCE)
    await call(store, "c", None)
    await store.writer.create(RUN, "open", "search", b"{}")
    delivered = await redis.xreadgroup("progress", "w1", {store.keys.feed(0): ">"})
    entries = [FeedEntry.parse(0, i.decode(), f) for i, f in delivered[0][1]]
    shuffled = entries[1::2] + entries[::2]

    outcomes = await projection.apply_batch(shuffled)

    newest = {(e.tool_call_id): e.entry_id for e in sorted(entries, key=lambda e: e.version)}
    expected = [
        Outcome.APPLIED if newest[e.tool_call_id] == e.entry_id else Outcome.STALE for e in shuffled
    ]
    assert outcomes == expected
    view = await read_view(store, RUN)
    assert view is not None and view.invocations == 4
    assert view.by_status == {"READY": 2, "ERROR": 1, "PROJECTING": 1}
    assert [fact["tool_call_id"] for fact in view.facts] == ["a", "b"]
    position = await redis.hgetall(store.keys.position(0, "progress"))
    assert (position[b"applied"], position[b"stale"]) == (b"4", str(len(entries) - 4).encode())
    assert await projection.apply_batch(entries) == [Outcome.DUPLICATE] * len(entries)
    assert (await read_view(store, RUN)) == view
