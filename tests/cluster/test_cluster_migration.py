"""A live slot migration while the boundary, readers and a receipt worker are busy."""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
from datetime import timedelta
from typing import Any

import pytest

from canon.cli import main
from eventstore import RunContext, Store, ToolBoundary
from eventstore.audit import verify_against_events
from eventstore.keys import shard_of
from machine.codes import Status
from machine.fold import fold_all
from machine.ids import invocation_id
from projections import ReceiptWorker
from tests.cluster.harness import ClusterNode, LocalCluster
from tests.support.calls import envelope, outcome
from tests.support.tools import FakeTool

RUNS = 4
LANES = 3
PREFILL = 6
#: Calls each lane still makes after the move, through clients whose slot table is stale.
AFTER_MOVE = 3


def runs_in_shard(shard: int, shards: int, count: int) -> list[str]:
    """The first ``count`` run ids of the form ``mig-N`` that hash to ``shard``."""
    candidates = (f"mig-{i}" for i in itertools.count())
    return list(itertools.islice((r for r in candidates if shard_of(r, shards) == shard), count))


def quietest_shard(store: Store, cluster: LocalCluster) -> int:
    """The shard whose slot holds the fewest keys (earlier tests leave keys behind)."""
    counts = {}
    for shard in range(store.keys.shards):
        slot = cluster.keyslot(store.keys.feed(shard))
        owner = cluster.node_of_slot(slot)
        counts[shard] = int(owner.command("CLUSTER", "COUNTKEYSINSLOT", slot))
    return min(counts, key=lambda shard: counts[shard])


def redirects(cluster: LocalCluster) -> collections.Counter[str]:
    """ASK, MOVED and TRYAGAIN replies sent so far by all nodes."""
    total: collections.Counter[str] = collections.Counter()
    for node in cluster.nodes:
        stats = node.errorstats()
        total.update({name: stats.get(name, 0) for name in ("ASK", "MOVED", "TRYAGAIN")})
    return total


async def wait_receipts_current(
    store: Store, calls: list[tuple[str, str]], *, timeout_s: float
) -> None:
    """Wait until every call's materialized receipt is at version 3 (READY)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    pending = list(calls)
    while True:
        for run_id, call_id in list(pending):
            key = store.keys.receipt(run_id, invocation_id(run_id, call_id))
            if await store.client.hget(key, "version") == b"3":
                pending.remove((run_id, call_id))
        if not pending:
            return
        assert asyncio.get_running_loop().time() < deadline, f"{len(pending)} receipts behind"
        await asyncio.sleep(0.05)


async def assert_journals_intact(store: Store, calls: list[tuple[str, str]]) -> None:
    """Each call is READY with exactly its three events, which re-fold into its record."""
    for run_id, call_id in calls:
        record = await store.get(run_id, call_id)
        events = await store.events(run_id, call_id)
        assert record is not None and record.state.status is Status.READY
        assert [e.event.version for e in events if e.event] == [1, 2, 3]
        assert len({e.event.event_id for e in events if e.event}) == 3
        assert await store.client.xlen(store.keys.stream(run_id, call_id)) == 3
        assert fold_all((e.event, e.stored_hash) for e in events if e.event) == record.state
        assert verify_against_events(await store.reader.fields(run_id, call_id), events) == []


async def assert_feed_and_progress_once(
    store: Store, shard: int, calls: list[tuple[str, str]]
) -> None:
    """One feed entry per event, nothing pending, one progress identity and one budget
    unit per call."""
    client, feed = store.client, store.keys.feed(shard)
    per_event = collections.Counter(
        (f[b"r"], f[b"c"], f[b"v"]) for _, f in await client.xrange(feed)
    )
    assert set(per_event.values()) == {1} and len(per_event) == 3 * len(calls)
    assert (await client.xpending(feed, "receipts"))["pending"] == 0
    calls_of: dict[str, list[str]] = collections.defaultdict(list)
    for run_id, call_id in calls:
        calls_of[run_id].append(call_id)
    for run_id, call_ids in calls_of.items():
        progress = await client.lrange(store.keys.progress(run_id), 0, -1)
        assert sorted(progress) == sorted(f"{run_id}:{c}".encode() for c in call_ids)
        info = await store.run_info(run_id)
        assert info is not None and info.used_total == len(call_ids)


async def verify_primary(capsys: pytest.CaptureFixture[str], node: ClusterNode, ns: str) -> Any:
    """Run ``canon verify --json`` against one primary; return its exit code and summary."""
    capsys.readouterr()
    argv = ["verify", "--redis-url", node.url, "--namespace", ns, "--shards", "16", "--json"]
    code = await asyncio.to_thread(main, [*argv, "--no-progress"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    return code, next(line for line in lines if line["kind"] == "summary"), lines


async def test_live_slot_migration_loses_and_duplicates_nothing(
    make_store: Any, redis_cluster: LocalCluster, namespace: str, capsys: pytest.CaptureFixture[str]
):
    """A slot holding four busy runs moves to another master (SETSLOT/MIGRATE in small
    batches) while 12 invocation loops, a reader and a receipt worker run: every call is
    READY (no STORE_UNAVAILABLE), each record has exactly its three events, one feed entry
    per event, one progress identity per call; the worker catches up with nothing pending,
    and ``canon verify`` is clean on every primary."""
    store: Store = make_store()
    await store.check_namespace()
    shard = quietest_shard(store, redis_cluster)
    slot = redis_cluster.keyslot(store.keys.feed(shard))
    source = redis_cluster.node_of_slot(slot)
    target = next(node for node in redis_cluster.nodes if node is not source)
    runs = runs_in_shard(shard, store.keys.shards, RUNS)
    for run_id in runs:
        await store.open_run(run_id, deadline=timedelta(minutes=5))
    tool = FakeTool()
    boundary = ToolBoundary(store, {"search": tool.spec()})
    outcomes: dict[tuple[str, str], str] = {}

    async def invoke(run_id: str, call_id: str) -> None:
        reply = await boundary.invoke(RunContext(run_id), envelope(call_id, run_id=run_id))
        outcomes[(run_id, call_id)] = outcome(reply)

    await asyncio.gather(*(invoke(r, f"pre-{i}") for r in runs for i in range(PREFILL)))
    worker = ReceiptWorker(make_store(), consumer="mover", block_ms=200)
    worker_task = asyncio.create_task(worker.run())
    moved = asyncio.Event()

    async def lane(run_id: str, lane_no: int) -> None:
        after = 0
        for i in itertools.count():
            await invoke(run_id, f"l{lane_no}-{i}")
            after += moved.is_set()
            if after >= AFTER_MOVE:
                return

    async def reader() -> None:
        while not moved.is_set():
            for (run_id, call_id), result in list(outcomes.items()):
                record = await store.get(run_id, call_id)
                assert record is not None and result == "READY"
                assert record.state.status is Status.READY
            await asyncio.sleep(0)

    async def move() -> int:
        await asyncio.sleep(0.05)
        keys = await redis_cluster.migrate_slot(slot, target, batch=5, pause_s=0.003)
        moved.set()
        return keys

    before = redirects(redis_cluster)
    *_, keys_moved = await asyncio.gather(
        *(lane(r, n) for r in runs for n in range(LANES)), reader(), move()
    )
    seen = redirects(redis_cluster) - before
    # The worker that lived through the move catches up on its own.
    await wait_receipts_current(store, list(outcomes), timeout_s=10)
    worker.stop()
    await worker_task

    await redis_cluster.wait_owner(slot, target)
    assert keys_moved > 0
    assert seen["ASK"] + seen["TRYAGAIN"] > 0, seen  # the load met the migration
    assert seen["MOVED"] > 0, seen  # and the old owner afterwards
    assert collections.Counter(outcomes.values()) == {"READY": len(outcomes)}
    assert tool.executed == len(outcomes) > RUNS * (PREFILL + LANES * AFTER_MOVE)
    await assert_journals_intact(store, list(outcomes))
    await assert_feed_and_progress_once(store, shard, list(outcomes))
    for node in redis_cluster.nodes:
        code, summary, lines = await verify_primary(capsys, node, namespace)
        assert code == 0 and summary["problems"] == 0, lines
        expected = len(outcomes) if node is target else 0
        assert summary["invocations"] == expected
