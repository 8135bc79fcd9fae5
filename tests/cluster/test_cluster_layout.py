"""Where a namespace's keys live on a three-master cluster, and how a store reaches it."""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import statistics
import time
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from canon.connection import add_connection_args, open_store
from eventstore import RunContext, Store, ToolBoundary
from eventstore.errors import InvalidArgument, NamespaceMismatch
from eventstore.wire.cluster import ClusterClient, cluster_client, split_cluster_parameter
from eventstore.wire.keys import shard_of
from machine.ids import invocation_id
from projections import ProgressWorker, ReceiptWorker
from tests.cluster.harness import ClusterSetupError, LocalCluster, redis_cli
from tests.conftest import embedded_binary
from tests.support.calls import envelope, open_run, outcome
from tests.support.tools import FakeTool
from tests.support.waiting import wait_for

#: Cluster-only: the store fixtures (``store``, ``make_store``, ``redis``) are the cluster's.
pytestmark = pytest.mark.backends("cluster")

#: How long the nodes are paused to make a command time out (its client waits 0.2 s).
PAUSE_MS = 3000


def run_keys(store: Store, run_id: str, tool_call_id: str) -> list[str]:
    """Every key the store may write for one run and one of its calls."""
    keys, shard = store.keys, shard_of(run_id, store.keys.shards)
    return [
        keys.run(run_id),
        keys.record(run_id, tool_call_id),
        keys.stream(run_id, tool_call_id),
        keys.progress(run_id),
        keys.feed_of(run_id),
        keys.control_of(run_id),
        keys.receipt(run_id, invocation_id(run_id, tool_call_id)),
        keys.run_view(run_id),
        keys.position(shard, "receipts"),
        keys.dead_letters(shard),
    ]


async def test_the_fixture_is_a_three_master_cluster_with_every_slot_served(
    redis_cluster: LocalCluster,
):
    """Three running masters share all 16384 slots and agree on who serves which."""
    owners = redis_cluster.owners()

    assert len(owners) == 16384
    assert {node.port for node in owners.values()} == {n.port for n in redis_cluster.nodes}
    assert len(redis_cluster.pids()) == 3
    nodes = redis_cluster.nodes[0].command("CLUSTER", "NODES").decode().splitlines()
    assert sum("master" in line.split()[2].split(",") for line in nodes) == 3


async def test_runs_spread_over_shards_land_on_every_master(
    store: Store, redis_cluster: LocalCluster, namespace: str
):
    """50 runs over the shards: every master holds records, each on the master of its slot."""
    boundary = ToolBoundary(store, {"search": FakeTool().spec()})
    runs = [f"run-{i}" for i in range(50)]
    for run_id in runs:
        await open_run(store, run_id)
    replies = await asyncio.gather(
        *(boundary.invoke(RunContext(r), envelope("call-1", run_id=r)) for r in runs)
    )
    assert {outcome(reply) for reply in replies} == {"READY"}

    held = {
        node.port: {key for key in node.keys(f"{namespace}:*:inv:*") if not key.endswith(b":ev")}
        for node in redis_cluster.nodes
    }

    assert all(held.values()), {port: len(keys) for port, keys in held.items()}
    assert sum(len(keys) for keys in held.values()) == 50
    for run_id in runs:
        key = store.keys.record(run_id, "call-1")
        assert key.encode() in held[redis_cluster.node_of_slot(redis_cluster.keyslot(key)).port]


async def test_every_key_of_a_run_shares_one_slot(store: Store, redis_cluster: LocalCluster):
    """CLUSTER KEYSLOT gives one value for all keys of a run: the slot of its shard tag."""
    for run_id in ("run-a", "run-b", "r" * 64, "run.with-dots_and_underscores"):
        keys = run_keys(store, run_id, "call-1")
        slots = {redis_cluster.keyslot(key) for key in keys}
        tag = store.keys.tag_of(run_id).split(":", 1)[1]

        assert slots == {redis_cluster.keyslot(tag)}, run_id


async def test_shard_tags_of_a_default_namespace_cover_every_master(
    store: Store, redis_cluster: LocalCluster
):
    """The shard hash tags of a default namespace hash to slots on all three masters."""
    ports = {
        redis_cluster.node_of_slot(redis_cluster.keyslot(store.keys.feed(shard))).port
        for shard in range(store.keys.shards)
    }

    assert ports == {node.port for node in redis_cluster.nodes}


async def test_other_shard_count_on_the_cluster_is_refused(make_store: Any, redis: RedisCluster):
    """A namespace created with 16 shards refuses a store of 8 with NamespaceMismatch naming
    both counts, keeps its metadata, and still opens with 16."""
    async with make_store(shards=16) as first:
        meta = first.keys.meta()

    with pytest.raises(NamespaceMismatch, match=r"16 shards.*built with 8"):
        async with make_store(shards=8):
            pytest.fail("entered a namespace with the wrong shard count")

    assert await redis.hget(meta, "shards") == b"16"
    async with make_store(shards=16) as again:
        assert again.keys.shards == 16


async def test_budget_holds_under_200_concurrent_calls_from_two_cluster_clients(
    make_store: Any, redis: RedisCluster, namespace: str
):
    """Run budget 50, tool budget 30, 200 concurrent calls over two cluster clients: exactly
    30 run, the other 170 are TOOL_BUDGET_EXHAUSTED, 30 records exist."""
    tool = FakeTool()
    stores: list[Store] = [make_store(), make_store()]
    assert stores[0].cluster is not stores[1].cluster
    boundaries = [ToolBoundary(store, {"search": tool.spec()}) for store in stores]
    await open_run(stores[0], budget=50, tools={"search": 30})

    replies = await asyncio.gather(
        *(boundaries[i % 2].invoke(RunContext("run-a"), envelope(f"c{i}")) for i in range(200))
    )

    assert collections.Counter(outcome(r) for r in replies) == {
        "READY": 30,
        "TOOL_BUDGET_EXHAUSTED": 170,
    }
    assert tool.executed == 30
    info = await stores[1].run_info("run-a")
    assert info is not None and (info.used_total, info.used["search"]) == (30, 30)
    records = [k async for k in redis.scan_iter(match=f"{namespace}:*:inv:*", count=1000)]
    assert len([k for k in records if not k.endswith(b":ev")]) == 30


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://h:1/0", ("redis://h:1/0", False)),
        ("redis://h:1/0?cluster=1", ("redis://h:1/0", True)),
        (
            "rediss://u:p@h:1/0?cluster=true&ssl_cert_reqs=none",
            ("rediss://u:p@h:1/0?ssl_cert_reqs=none", True),
        ),
        ("redis://h:1/0?cluster=no", ("redis://h:1/0", False)),
    ],
)
def test_the_cluster_url_parameter_is_read_and_removed(url: str, expected: tuple[str, bool]):
    """``?cluster=1`` selects the cluster client and is removed before redis-py sees the URL."""
    assert split_cluster_parameter(url) == expected


def test_an_invalid_cluster_url_parameter_is_refused_without_echoing_the_url():
    """``?cluster=maybe`` is an InvalidArgument whose message holds no part of the URL."""
    with pytest.raises(InvalidArgument) as caught:
        Store.from_url("redis://user:s3cret@h:1/0?cluster=maybe")

    assert "s3cret" not in str(caught.value) and "maybe" not in str(caught.value)


async def test_a_store_from_a_cluster_url_or_flag_uses_the_cluster_client(
    redis_cluster: LocalCluster,
):
    """``cluster=True`` and ``?cluster=1`` build a ClusterClient; a plain URL a plain client."""
    by_flag = Store.from_url(redis_cluster.url, cluster=True)
    by_url = Store.from_url(f"{redis_cluster.url}?cluster=1")
    plain = Store.from_url(redis_cluster.url)
    try:
        assert isinstance(by_flag.cluster, ClusterClient) and by_flag.client is by_flag.cluster
        assert isinstance(by_url.cluster, ClusterClient)
        assert plain.cluster is None and not isinstance(plain.client, RedisCluster)
    finally:
        for store in (by_flag, by_url, plain):
            await store.aclose()


def table_reads(cluster: LocalCluster) -> tuple[int, int]:
    """How often the masters answered ``CLUSTER SLOTS`` and ``COMMAND``, summed over them."""
    slots = commands = 0
    for node in cluster.nodes:
        stats = node.command("INFO", "commandstats")
        slots += stats.get("cmdstat_cluster|slots", {}).get("calls", 0)
        commands += stats.get("cmdstat_command", {}).get("calls", 0)
    return slots, commands


async def test_after_a_timeout_the_client_rereads_the_slot_table_not_the_command_table(
    redis_cluster: LocalCluster, namespace: str
):
    """A command that timed out makes the next one re-read which master serves which slot
    before it runs; the table of where commands keep their keys (``COMMAND``, hundreds of
    entries) is read once per client, and again only for a command it does not know."""
    client = cluster_client(redis_cluster.url, timeout_s=0.2)
    key = f"{namespace}:k"
    try:
        await client.set(key, b"v")
        slots_before, commands_before = table_reads(redis_cluster)
        # Long enough that a busy machine cannot let the pause end before the get is sent
        # (a 1 s pause did once: the get then simply succeeded).
        for node in redis_cluster.nodes:
            node.command("CLIENT", "PAUSE", PAUSE_MS, "ALL")
        with pytest.raises(RedisError):
            await client.get(key)
        for node in redis_cluster.nodes:
            node.command("PING")  # held by the pause: returns once it is over

        assert await client.get(key) == b"v"
        slots_after, commands_after = table_reads(redis_cluster)
        assert slots_after > slots_before and commands_after == commands_before

        with pytest.raises(RedisError, match="doesn't exist"):
            await client.execute_command("NO-SUCH-COMMAND", key)
        assert table_reads(redis_cluster)[1] == commands_before + 1
    finally:
        await client.delete(key)
        await client.aclose()


@pytest.mark.parametrize("how", ["flag", "environment"])
async def test_cli_connection_settings_select_the_cluster(
    redis_cluster: LocalCluster, namespace: str, how: str, monkeypatch: pytest.MonkeyPatch
):
    """``--cluster`` or ``REDIS_CLUSTER=1`` opens a working cluster store for a subcommand."""
    monkeypatch.delenv("REDIS_URL", raising=False)
    argv = ["--redis-url", redis_cluster.url, "--namespace", namespace]
    if how == "flag":
        argv.append("--cluster")
    else:
        monkeypatch.setenv("REDIS_CLUSTER", "1")
    parser = argparse.ArgumentParser()
    add_connection_args(parser)

    async with open_store(parser.parse_args(argv)) as store:
        assert isinstance(store.cluster, ClusterClient)
        await store.open_run("run-cli", deadline=timedelta(minutes=1))
        assert (await store.run_info("run-cli")) is not None


def test_a_missing_redis_cli_fails_with_a_clear_message(monkeypatch: pytest.MonkeyPatch):
    """Without redis-cli on PATH the harness says what is missing and how to install it."""
    monkeypatch.setenv("PATH", os.devnull)

    with pytest.raises(ClusterSetupError, match=r"redis-cli is not on PATH.*apt-get install"):
        redis_cli()


def test_stopping_a_cluster_ends_every_node_process():
    """A cluster's stop() leaves none of its redis-server processes alive."""
    with LocalCluster(embedded_binary("7.x")) as cluster:
        pids = cluster.pids()
        assert len(pids) == 3

    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_each_master_holds_an_equal_share_of_a_default_namespace(
    store: Store, redis_cluster: LocalCluster, namespace: str
):
    """A default namespace (48 balanced shards) puts 16 shards on each of three equal masters,
    so the invocations of 900 runs leave each master within 1/3 + 0.05 of the records."""
    shards_by_port = collections.Counter(
        redis_cluster.node_of_slot(redis_cluster.keyslot(store.keys.feed(shard))).port
        for shard in range(store.keys.shards)
    )
    assert sorted(shards_by_port.values()) == [16, 16, 16]

    boundary = ToolBoundary(store, {"search": FakeTool().spec()})
    runs = [f"run-{i}" for i in range(900)]
    for run_id in runs:
        await open_run(store, run_id)
    replies = await asyncio.gather(
        *(boundary.invoke(RunContext(r), envelope("call-1", run_id=r)) for r in runs)
    )
    assert {outcome(reply) for reply in replies} == {"READY"}

    held = [len(node.keys(f"{namespace}:*:inv:*")) for node in redis_cluster.nodes]
    assert sum(held) == len(runs)
    assert max(held) / len(runs) <= 1 / 3 + 0.05, held


async def test_two_workers_on_one_default_cluster_store_keep_up_with_48_shards(
    make_store: Any,
):
    """On a cluster each worker holds a blocking read per shard: a default store leaves room
    for both projections' 2 x 48 reads beside its own commands, so a receipt follows its
    call in milliseconds, not after other lanes' blocks (about 2 s with 64 in flight)."""
    store: Store = make_store()
    assert isinstance(store.cluster, ClusterClient)
    assert store.cluster.max_in_flight == 64 + 2 * store.keys.shards
    async with store:
        workers = [ReceiptWorker(store, consumer="w"), ProgressWorker(store, consumer="w")]
        tasks = [asyncio.create_task(worker.run()) for worker in workers]
        boundary = ToolBoundary(store, {"search": FakeTool().spec()})
        await asyncio.sleep(1.5)  # every lane is blocked in its read
        waited = []
        for i in range(8):
            run_id = f"run-{i}"
            await open_run(store, run_id)
            started = time.monotonic()
            reply = await boundary.invoke(RunContext(run_id), envelope("call-1", run_id=run_id))
            assert outcome(reply) == "READY"
            receipt = store.keys.receipt(run_id, invocation_id(run_id, "call-1"))
            await wait_for(lambda key=receipt: store.client.exists(key))
            waited.append(time.monotonic() - started)
        for worker in workers:
            worker.stop()
        await asyncio.gather(*tasks)
    assert statistics.median(waited) < 0.5, waited
