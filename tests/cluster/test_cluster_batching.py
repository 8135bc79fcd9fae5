"""On a cluster, concurrent script calls share pipelines per primary, and a call answered
MOVED, ASK or TRYAGAIN is sent again until it is applied, once."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
from datetime import timedelta
from typing import Any

import pytest
from redis.exceptions import TryAgainError

from eventstore.audit import verify_against_events
from eventstore.store import Store
from eventstore.wire.batching import DEFAULT_MAX_BATCH
from eventstore.wire.cluster import cluster_client
from eventstore.wire.cluster_batching import NODE_SIZING, ClusterScriptBatcher
from eventstore.writer import Head
from machine.codes import EvidenceStatus
from machine.fold import fold_all
from tests.cluster.harness import ClusterNode, LocalCluster
from tests.cluster.test_cluster_migration import runs_in_shard
from tests.helpers import RAW, REQUEST, RESULT, TOOL, record_fields

pytestmark = pytest.mark.backends("cluster")

#: Shards of the migration test's namespace: shards 16 and up are in slots no other test's
#: namespace writes to, so moving one disturbs nobody else.
SHARDS = 32


async def _lifecycle(store: Store, run_id: str, tool_call_id: str) -> Head:
    head = await store.writer.create(run_id, tool_call_id, TOOL, REQUEST)
    head = await store.writer.start_projecting(head, RAW)
    return await store.writer.complete(head, RESULT, EvidenceStatus.EVIDENCE_FOUND, "scope")


def _evalsha_calls(node: ClusterNode) -> int:
    stats: dict[str, Any] = node.command("INFO", "commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def _run_per_node(store: Store, cluster: LocalCluster) -> dict[int, str]:
    """One run id per master, by the master's port."""
    runs: dict[int, str] = {}
    for i in itertools.count():
        run_id = f"pernode-{i}"
        node = cluster.node_of_slot(cluster.keyslot(store.keys.feed_of(run_id)))
        runs.setdefault(node.port, run_id)
        if len(runs) == len(cluster.nodes):
            return runs
    raise AssertionError("unreachable")


def _redirect_replies(cluster: LocalCluster) -> dict[str, int]:
    """ASK, MOVED and TRYAGAIN replies sent so far by all masters."""
    totals = dict.fromkeys(("ASK", "MOVED", "TRYAGAIN"), 0)
    for node in cluster.nodes:
        stats = node.errorstats()
        for name in totals:
            totals[name] += stats.get(name, 0)
    return totals


async def _assert_journal_once(store: Store, run_id: str, call_id: str, versions: int) -> None:
    """The call's journal holds each of its ``versions`` events once, and re-folds into it."""
    record = await store.get(run_id, call_id)
    events = await store.events(run_id, call_id)
    assert record is not None
    assert [e.event.version for e in events if e.event] == list(range(1, versions + 1))
    assert len({e.event.event_id for e in events if e.event}) == versions
    assert await store.client.xlen(store.keys.stream(run_id, call_id)) == versions
    assert fold_all((e.event, e.stored_hash) for e in events if e.event) == record.state
    assert verify_against_events(await record_fields(store, run_id, call_id), events) == []


async def test_concurrent_calls_are_pipelined_per_master(
    make_open_store: Any, redis_cluster: LocalCluster
) -> None:
    """96 concurrent lifecycles over runs on every master all succeed, each script runs
    once on the master of its run, and they need far fewer round trips than calls."""
    store: Store = await make_open_store()
    runs = _run_per_node(store, redis_cluster)
    for run_id in runs.values():
        await store.open_run(run_id, deadline=timedelta(minutes=5), tools={TOOL: None})
        await _lifecycle(store, run_id, "warm")  # the scripts are loaded on every master
    stats = store.batch_stats
    calls, round_trips = stats.calls, stats.round_trips
    before = {node.port: _evalsha_calls(node) for node in redis_cluster.nodes}
    heads = await asyncio.gather(
        *(_lifecycle(store, run_id, f"call-{i}") for run_id in runs.values() for i in range(32))
    )
    assert {head.version for head in heads} == {3}
    assert stats.calls - calls == 3 * 96
    assert stats.round_trips - round_trips <= 3 * 96 // 4
    assert stats.largest_batch > 1 and stats.redirects == 0
    after = {node.port: _evalsha_calls(node) for node in redis_cluster.nodes}
    assert {port: after[port] - before[port] for port in runs} == dict.fromkeys(runs, 3 * 32)


async def test_a_masters_pipelines_are_sized_for_its_share_of_the_calls(
    make_open_store: Any, redis_cluster: LocalCluster
) -> None:
    """A master carries a share of the calls: 48 made at once on one master's run go in
    pipelines of up to 16, where one server's sizing would stop at 8."""
    store: Store = await make_open_store()
    run_id = next(iter(_run_per_node(store, redis_cluster).values()))
    await store.open_run(run_id, deadline=timedelta(minutes=5), tools={TOOL: None})
    await _lifecycle(store, run_id, "warm")  # the scripts are loaded on its master
    stats = store.batch_stats
    stats.largest_batch = 0
    heads = await asyncio.gather(
        *(store.writer.create(run_id, f"call-{i}", TOOL, REQUEST) for i in range(48))
    )
    assert {head.version for head in heads} == {1}
    assert stats.largest_batch == NODE_SIZING.most > DEFAULT_MAX_BATCH


async def test_calls_in_a_moving_slot_are_applied_once(
    make_open_store: Any, redis_cluster: LocalCluster
) -> None:
    """While a run's slot is moved by hand (MIGRATING/IMPORTING, MIGRATE, SETSLOT NODE),
    48 pipelined calls meet TRYAGAIN, ASK and MOVED: every call answers, and every
    journal holds each of its events once."""
    store: Store = await make_open_store(shards=SHARDS)
    run_id = runs_in_shard(SHARDS - 1, SHARDS, 1)[0]
    slot = redis_cluster.keyslot(store.keys.feed_of(run_id))
    source = redis_cluster.node_of_slot(slot)
    target = next(node for node in redis_cluster.nodes if node is not source)
    await store.open_run(run_id, deadline=timedelta(minutes=5), tools={TOOL: None})
    heads = await asyncio.gather(
        *(store.writer.create(run_id, f"old-{i}", TOOL, REQUEST) for i in range(32))
    )
    redirects = store.batch_stats.redirects
    stale: Store = await make_open_store(shards=SHARDS)  # its slot table names the source
    errors_before = _redirect_replies(redis_cluster)

    target.command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
    source.command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
    calls = [
        *(store.writer.start_projecting(head, RAW) for head in heads),
        *(store.writer.create(run_id, f"new-{i}", TOOL, REQUEST) for i in range(16)),
    ]
    load = asyncio.gather(*calls)
    try:
        await asyncio.sleep(0.2)  # the calls meet the slot migrating
        while keys := source.command("CLUSTER", "GETKEYSINSLOT", slot, 10):
            source.command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # every key is on the target: the source answers ASK
        for node in (target, source, *redis_cluster.nodes):
            node.command("CLUSTER", "SETSLOT", slot, "NODE", target.node_id)
    finally:
        answered = await load
    await redis_cluster.wait_owner(slot, target)

    assert {head.version for head in answered[:32]} == {2}
    assert {head.version for head in answered[32:]} == {1}
    assert store.batch_stats.redirects > redirects
    seen = {
        name: count - errors_before[name]
        for name, count in _redirect_replies(redis_cluster).items()
    }
    assert seen["TRYAGAIN"] > 0 and seen["ASK"] > 0, seen  # the calls met the slot migrating
    for i in range(32):
        await _assert_journal_once(store, run_id, f"old-{i}", 2)
    for i in range(16):
        await _assert_journal_once(store, run_id, f"new-{i}", 1)
    # A client whose table still names the old owner meets MOVED, and goes on.
    head = await stale.writer.complete(answered[0], RESULT, EvidenceStatus.EVIDENCE_FOUND, "scope")
    assert head.version == 3 and stale.batch_stats.redirects == 1
    await _assert_journal_once(store, run_id, "old-0", 3)


async def test_a_masters_script_flush_is_answered_by_loading_there(
    make_open_store: Any, redis_cluster: LocalCluster
) -> None:
    """After SCRIPT FLUSH on one master, its pipelined calls load the script there and
    run once; the other masters' calls are not disturbed."""
    store: Store = await make_open_store()
    runs = _run_per_node(store, redis_cluster)
    for run_id in runs.values():
        await store.open_run(run_id, deadline=timedelta(minutes=5), tools={TOOL: None})
        await _lifecycle(store, run_id, "warm")
    flushed = redis_cluster.nodes[0]
    flushed.command("SCRIPT", "FLUSH")
    reloads = store.batch_stats.reloads
    heads = await asyncio.gather(
        *(_lifecycle(store, run_id, f"call-{i}") for run_id in runs.values() for i in range(16))
    )
    assert {head.version for head in heads} == {3}
    assert store.batch_stats.reloads > reloads
    for run_id in runs.values():
        for i in range(16):
            await _assert_journal_once(store, run_id, f"call-{i}", 3)


async def test_calls_on_killed_connections_are_sent_again_once(
    make_open_store: Any, redis_cluster: LocalCluster
) -> None:
    """Every master drops the store's connections (``CLIENT KILL``) before and while 96
    lifecycles are pipelined: the calls cut off are sent again on fresh connections, all
    succeed, and every journal holds each event once."""
    store: Store = await make_open_store()
    runs = _run_per_node(store, redis_cluster)
    for run_id in runs.values():
        await store.open_run(run_id, deadline=timedelta(minutes=5), tools={TOOL: None})
        await _lifecycle(store, run_id, "warm")  # every master's lanes keep connections
    redirects = store.batch_stats.redirects
    for node in redis_cluster.nodes:  # the kept connections are dead before the load
        node.command("CLIENT", "KILL", "TYPE", "normal")
    load = asyncio.gather(
        *(_lifecycle(store, run_id, f"call-{i}") for run_id in runs.values() for i in range(32))
    )
    await asyncio.sleep(0.01)
    for node in redis_cluster.nodes:  # and again while calls are in flight
        node.command("CLIENT", "KILL", "TYPE", "normal")
    heads = await load
    assert {head.version for head in heads} == {3}
    assert store.batch_stats.redirects > redirects
    for run_id in runs.values():
        for i in range(32):
            await _assert_journal_once(store, run_id, f"call-{i}", 3)


async def test_a_call_refused_past_the_redirect_budget_fails_alone(
    redis_cluster: LocalCluster, namespace: str
) -> None:
    """A call whose slot keeps answering TRYAGAIN fails with that error once its budget
    is spent, without running, while a call to another slot in the same turn succeeds."""
    client = cluster_client(redis_cluster.url, redirect_budget_s=0.3)
    batcher = ClusterScriptBatcher(client)
    script = client.register_script(
        "redis.call('SET', KEYS[1], ARGV[1]) return redis.call('GET', KEYS[2])"
    )
    stuck, other = f"{{{namespace}-a}}", f"{{{namespace}-b}}"
    slot = redis_cluster.keyslot(stuck)
    source = redis_cluster.node_of_slot(slot)
    target = next(node for node in redis_cluster.nodes if node is not source)
    await client.set(f"{stuck}:1", "old")  # present; ``{stuck}:2`` is not: TRYAGAIN
    try:
        await client.initialize()
        target.command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
        source.command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
        refused, answered = await asyncio.gather(
            batcher.call(script, [f"{stuck}:1", f"{stuck}:2"], ["new"]),
            batcher.call(script, [f"{other}:1", f"{other}:2"], ["new"]),
            return_exceptions=True,
        )
    finally:
        for node in (source, target):
            node.command("CLUSTER", "SETSLOT", slot, "STABLE")
        await batcher.close()
    try:
        assert isinstance(refused, TryAgainError) and answered is None
        assert batcher.stats.redirects > 1
        assert await client.get(f"{stuck}:1") == b"old"
    finally:
        await client.delete(f"{stuck}:1", f"{other}:1")
        await client.aclose()


async def test_no_call_waits_on_a_connection_the_server_closed_while_idle(
    redis_cluster: LocalCluster, namespace: str
) -> None:
    """Every master drops the client's connections, the batcher's kept ones and the idle
    ones in the nodes' pools. No call waits on a connection the server closed (it would
    wait out the socket timeout): the calls cut off are sent again on fresh connections,
    and each is applied once."""
    # A long socket timeout: a call that waited on a dead connection would wait it out.
    client = cluster_client(redis_cluster.url, timeout_s=60)
    batcher = ClusterScriptBatcher(client)
    script = client.register_script("return redis.call('INCR', KEYS[1])")
    keys = [f"{{{namespace}-{i}}}:n" for i in range(24)]
    assert {redis_cluster.node_of_slot(redis_cluster.keyslot(k)).port for k in keys} == {
        node.port for node in redis_cluster.nodes
    }
    try:
        await asyncio.gather(*(batcher.call(script, [key], []) for key in keys))  # kept
        # Every node holds ten idle connections too, all dead after the kill.
        for node in client.get_primaries():
            await asyncio.gather(*(client.ping(target_nodes=node) for _ in range(10)))
        for node in redis_cluster.nodes:
            node.command("CLIENT", "KILL", "TYPE", "normal")
        replies = await asyncio.wait_for(
            asyncio.gather(*(batcher.call(script, [key], []) for key in keys)), 20
        )
        assert replies == [2] * len(keys)
        assert batcher.stats.redirects > 0
    finally:
        await batcher.close()
        await client.delete(*keys)
        await client.aclose()


async def test_a_refresh_of_the_slot_table_that_reaches_no_node_is_tried_again(
    redis_cluster: LocalCluster, namespace: str
) -> None:
    """Every master freezes for 1.4 s (SIGSTOP, then SIGCONT, as a stalled host would):
    the call times out, the slot table cannot be read either (no node answers within
    the 0.25 s timeout, three nodes one after another), and both are tried again within
    the client's retries, until the masters answer and the call does. The freeze stays
    under the cluster's node timeout (2 s), so no master is marked failed."""
    client = cluster_client(redis_cluster.url, timeout_s=0.25, redirect_budget_s=30)
    batcher = ClusterScriptBatcher(client)
    # Idempotent, as the store's scripts are: a timed-out call may have run.
    script = client.register_script("redis.call('SET', KEYS[1], ARGV[1]) return ARGV[1]")
    key = f"{{{namespace}-frozen}}:n"
    pids = [node.server.pid for node in redis_cluster.nodes]

    def thaw() -> None:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)

    try:
        assert await batcher.call(script, [key], ["before"]) == b"before"
        redirects = batcher.stats.redirects
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        thawing = asyncio.get_running_loop().call_later(1.4, thaw)
        try:
            assert await batcher.call(script, [key], ["after"]) == b"after"
        finally:
            thawing.cancel()
            thaw()
        assert batcher.stats.redirects - redirects >= 2  # the call, then the refresh
    finally:
        await asyncio.to_thread(redis_cluster.wait_ok)  # the next test finds it whole
        await batcher.close()
        await client.delete(key)
        await client.aclose()
