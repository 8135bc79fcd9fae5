"""A live ``redis-cli --cluster reshard`` while the boundary, a reader and two workers are busy."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import itertools
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, cast

import pytest

from canon.cli import main
from eventstore import RunContext, Store, ToolBoundary
from eventstore.audit import verify_against_events
from eventstore.wire.keys import shard_of
from machine.codes import Status
from machine.fold import fold_all
from machine.ids import invocation_id
from projections import ProgressWorker, ReceiptWorker, read_view
from tests.cluster.harness import ClusterNode, LocalCluster
from tests.helpers import record_fields, wait_until
from tests.support.calls import envelope, outcome
from tests.support.tools import FakeTool

#: Cluster-only: the store fixtures (``store``, ``make_store``, ``redis``) are the cluster's.
pytestmark = pytest.mark.backends("cluster")

RUNS = 4
LANES = 3
PREFILL = 6
#: Calls each lane still makes after the move, through clients whose slot table is stale.
AFTER_MOVE = 3
#: Shards of the test's namespace. No other test uses 32, so the tags of its shards 16 to
#: 31 (``{s16.<suffix>}`` ..., see ``balanced_tags``) are this test's alone: the moved
#: slot holds only its keys (a slot shared by chance with another test's tag would only
#: move more keys).
SHARDS = 32
PRIVATE_SHARDS = range(16, SHARDS)
#: Keys per MIGRATE while the busy slot moves: one, so the move spans many round trips.
PIPELINE = 1
#: Plain keys outside the namespace put in the busy slot, so that its move lasts long
#: enough (about 0.3 s on an idle machine) for the load to meet it for certain, and stays
#: well under the store's 2 s redirect budget on a busy one.
FILLER = 1000


@contextlib.contextmanager
def older_objects_frozen() -> Iterator[None]:
    """Keep the garbage collector to the objects made from now on, until the block ends.

    A full collection of a test process's heap stalls the event loop for as long as the
    slot takes to move (about 0.3 s each on this project's 2-core CI machine, once
    earlier tests have imported the agent SDKs): if one falls in the move, none of the
    load's calls reaches the slot while it migrates, each caller meets only the MOVED
    after it, and the test has not tested what it is for.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def runs_in_shard(shard: int, shards: int, count: int) -> list[str]:
    """The first ``count`` run ids of the form ``mig-N`` that hash to ``shard``."""
    candidates = (f"mig-{i}" for i in itertools.count())
    return list(itertools.islice((r for r in candidates if shard_of(r, shards) == shard), count))


def nearest_shard(store: Store, cluster: LocalCluster) -> tuple[int, list[int]]:
    """The private shard whose slot has the fewest slots below it on its owner, and those.

    ``redis-cli --cluster reshard`` moves a source's lowest slots first, so those slots
    are moved ahead (idle) and the busy slot is then the only one the live reshard moves.
    """
    below: dict[int, list[int]] = {}
    for shard in PRIVATE_SHARDS:
        slot = cluster.keyslot(store.keys.feed(shard))
        below[shard] = [s for s in cluster.slots_of(cluster.node_of_slot(slot)) if s < slot]
    shard = min(below, key=lambda shard: len(below[shard]))
    return shard, below[shard]


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


def calls_by_run(calls: list[tuple[str, str]]) -> dict[str, list[str]]:
    """The tool call ids of each run."""
    calls_of: dict[str, list[str]] = collections.defaultdict(list)
    for run_id, call_id in calls:
        calls_of[run_id].append(call_id)
    return calls_of


async def wait_views_current(
    store: Store, calls: list[tuple[str, str]], *, timeout_s: float
) -> None:
    """Wait until every run's progress view counts all its calls READY."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    expected = {run_id: len(call_ids) for run_id, call_ids in calls_by_run(calls).items()}
    while True:
        ready = {}
        for run_id in expected:
            view = await read_view(store, run_id)
            ready[run_id] = view.by_status.get("READY", 0) if view else 0
        if ready == expected:
            return
        assert asyncio.get_running_loop().time() < deadline, f"views behind: {ready}"
        await asyncio.sleep(0.05)


async def assert_views_count_each_call_once(
    store: Store, calls: list[tuple[str, str]], worker: ProgressWorker
) -> None:
    """Each run's view counts each of its calls exactly once, at version 3, READY with
    evidence; the worker that lived through the move settled each feed entry once."""
    for run_id, call_ids in calls_by_run(calls).items():
        view = await read_view(store, run_id)
        count = len(call_ids)
        assert view is not None and view.invocations == count, run_id
        assert view.by_status == {"READY": count}
        assert view.by_evidence == {"EVIDENCE_FOUND": count}
        fields = cast(dict[bytes, bytes], await store.client.hgetall(store.keys.run_view(run_id)))
        versions = {k[2:].decode(): v for k, v in fields.items() if k.startswith(b"v:")}
        assert versions == dict.fromkeys(call_ids, b"3")
    settled = ("applied", "stale", "duplicate")
    assert sum(worker.counters[name] for name in settled) == 3 * len(calls), worker.counters
    assert worker.counters["expired"] == worker.counters["dead"] == 0, worker.counters


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
        assert verify_against_events(await record_fields(store, run_id, call_id), events) == []


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
    for group in ("receipts", "progress"):
        assert (await client.xpending(feed, group))["pending"] == 0, group
    for run_id, call_ids in calls_by_run(calls).items():
        progress = await client.lrange(store.keys.progress(run_id), 0, -1)
        assert sorted(progress) == sorted(f"{run_id}:{c}".encode() for c in call_ids)
        info = await store.run_info(run_id)
        assert info is not None and info.used_total == len(call_ids)


async def verify_primary(capsys: pytest.CaptureFixture[str], node: ClusterNode, ns: str) -> Any:
    """Run ``canon verify --json`` against one primary; return its exit code and summary."""
    capsys.readouterr()
    argv = ["verify", "--redis-url", node.url, "--namespace", ns, "--shards", str(SHARDS)]
    code = await asyncio.to_thread(main, [*argv, "--json", "--no-progress"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    return code, next(line for line in lines if line["kind"] == "summary"), lines


async def test_live_slot_migration_loses_and_duplicates_nothing(
    make_store: Any, redis_cluster: LocalCluster, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``redis-cli --cluster reshard`` moves the slot of four busy runs to another master
    while 12 invocation loops, a reader, a receipt worker and a progress worker run: every
    call is READY (no STORE_UNAVAILABLE), each record has exactly its three events, one
    feed entry per event, one progress identity per call; both workers catch up with
    nothing pending, the progress views count every call once, and ``canon verify`` is
    clean on every primary."""
    store: Store = make_store(shards=SHARDS)
    await store.check_namespace()
    shard, below = nearest_shard(store, redis_cluster)
    slot = redis_cluster.keyslot(store.keys.feed(shard))
    source = redis_cluster.node_of_slot(slot)
    target = next(node for node in redis_cluster.nodes if node is not source)
    if below:  # idle slots ahead of the busy one, moved before any load
        assert await redis_cluster.reshard(source, target, len(below)) == below
        await redis_cluster.wait_owner(below[-1], target)
        # A stale client meets its MOVED now, not during the load, should the namespace's
        # untagged metadata key have been in one of those slots.
        await store.check_namespace()
    assert redis_cluster.slots_of(source)[0] == slot
    tag = store.keys.tag(shard).split(":", 1)[1]  # the shard's hash tag, in its slot
    filler = [f"{namespace}-filler:{tag}:{i}" for i in range(FILLER)]
    source.command("MSET", *(part for key in filler for part in (key, "x")))
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
    workers = (
        ReceiptWorker(make_store(shards=SHARDS), consumer="mover", block_ms=200),
        ProgressWorker(make_store(shards=SHARDS), consumer="mover", block_ms=200),
    )
    worker_tasks = [asyncio.create_task(worker.run()) for worker in workers]
    moved = asyncio.Event()
    lanes_running: set[tuple[str, int]] = set()

    async def lane(run_id: str, lane_no: int) -> None:
        after = 0
        for i in itertools.count():
            await invoke(run_id, f"l{lane_no}-{i}")
            lanes_running.add((run_id, lane_no))
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

    async def move() -> tuple[list[int], int]:
        # The slot starts to move once the load is flowing: every lane has made a call.
        await wait_until(lambda: len(lanes_running) == RUNS * LANES)
        keys = int(source.command("CLUSTER", "COUNTKEYSINSLOT", slot))
        slots = await redis_cluster.reshard(source, target, 1, pipeline=PIPELINE)
        moved.set()
        return slots, keys

    before = redirects(redis_cluster)
    with older_objects_frozen():
        done = await asyncio.gather(
            *(lane(r, n) for r in runs for n in range(LANES)), reader(), move()
        )
    slots_moved, keys_in_slot = cast(tuple[list[int], int], done[-1])
    seen = redirects(redis_cluster) - before
    # The workers that lived through the move catch up on their own.
    await wait_receipts_current(store, list(outcomes), timeout_s=10)
    await wait_views_current(store, list(outcomes), timeout_s=10)
    for worker in workers:
        worker.stop()
    await asyncio.gather(*worker_tasks)

    assert slots_moved == [slot]
    await redis_cluster.wait_owner(slot, target)
    assert keys_in_slot > FILLER and int(source.command("CLUSTER", "COUNTKEYSINSLOT", slot)) == 0
    # Only the busy slot moved while the load ran, so these replies are the move's.
    assert seen["ASK"] + seen["TRYAGAIN"] > 0, seen  # the load met the slot migrating
    assert seen["MOVED"] > 0, seen  # and its old owner afterwards
    assert collections.Counter(outcomes.values()) == {"READY": len(outcomes)}
    assert tool.executed == len(outcomes) > RUNS * (PREFILL + LANES * AFTER_MOVE)
    await assert_journals_intact(store, list(outcomes))
    await assert_feed_and_progress_once(store, shard, list(outcomes))
    await assert_views_count_each_call_once(store, list(outcomes), workers[1])
    for node in redis_cluster.nodes:
        code, summary, lines = await verify_primary(capsys, node, namespace)
        assert code == 0 and summary["problems"] == 0, lines
        expected = len(outcomes) if node is target else 0
        assert summary["invocations"] == expected
    assert await store.client.delete(*filler) == FILLER
