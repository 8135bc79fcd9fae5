"""Reading receipts over HTTP writes nothing: no command, no TTL, no counter, no byte.

On the cluster ``INFO commandstats`` counts one node's commands, so this module's ``redis``
fixture adds up every primary's counts there: a write on any master shows up.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from eventstore.store import Store
from machine.codes import EvidenceStatus
from machine.ids import invocation_id
from projections import ReceiptWorker, create_app
from projections.worker.supervisor import ReceiptServer
from tests.cluster.harness import LocalCluster
from tests.helpers import commandstats, key_values, namespace_keys

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-ro"

#: Every command that can change a key, its expiry or a group.
WRITES = frozenset(
    {
        "set", "setex", "psetex", "getset", "getdel", "del", "unlink", "rename",
        "expire", "pexpire", "expireat", "pexpireat", "persist",
        "hset", "hsetnx", "hmset", "hdel", "hincrby", "hincrbyfloat",
        "xadd", "xack", "xtrim", "xdel", "xgroup", "xclaim", "xautoclaim", "xsetid",
        "rpush", "lpush", "lpop", "rpop", "ltrim", "lset", "lrem",
        "incr", "incrby", "decr", "decrby", "sadd", "srem", "zadd", "zrem",
        "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "script",
        "xreadgroup", "copy", "restore", "touch",
    }
)  # fmt: skip


class SummedInfoCluster:
    """A cluster client whose ``INFO commandstats`` is the sum over every primary.

    Any other command, and ``INFO`` of any other section, goes to the cluster client as is.
    """

    def __init__(self, client: RedisCluster) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def info(self, section: str | None = None, **options: Any) -> Any:
        """``INFO``; for ``commandstats``, each command's calls added up over the primaries."""
        if section != "commandstats" or options:
            return await self._client.info(section, **options)
        replies: dict[str, dict[str, Any]] = await self._client.info(
            section, target_nodes=RedisCluster.PRIMARIES
        )
        calls: collections.Counter[str] = collections.Counter()
        for stats in replies.values():
            calls.update({name: int(value["calls"]) for name, value in stats.items()})
        return {name: {"calls": count} for name, count in calls.items()}


@pytest.fixture
def redis(redis: Redis | RedisCluster) -> Redis | SummedInfoCluster:
    """The root ``redis`` client; on the cluster, one counting commands on every primary."""
    return SummedInfoCluster(redis) if isinstance(redis, RedisCluster) else redis


@pytest.mark.backends("cluster")
async def test_summed_commandstats_see_a_write_on_every_primary(
    redis: SummedInfoCluster, redis_cluster: LocalCluster, namespace: str
) -> None:
    """The summed counts grow by one HSET per primary written to, whichever it is."""
    owners, keys = redis_cluster.owners(), dict[int, str]()
    for i in itertools.count():  # one key per master, found by its slot
        key = f"{namespace}:k{i}"
        keys.setdefault(owners[redis_cluster.keyslot(key)].port, key)
        if len(keys) == len(redis_cluster.nodes):
            break
    before = (await redis.info("commandstats")).get("cmdstat_hset", {"calls": 0})["calls"]
    for key in keys.values():
        await redis.hset(key, "f", "v")
    after = (await redis.info("commandstats"))["cmdstat_hset"]["calls"]
    assert after - before == len(redis_cluster.nodes)
    await redis.delete(*keys.values())


@pytest.fixture
async def client(make_store: Any) -> AsyncIterator[tuple[Store, httpx.AsyncClient, str]]:
    """A served store with a run of three calls (one materialized, one in flight)."""
    store: Store = make_store(shards=2)
    token = (await store.open_run(RUN, deadline=timedelta(minutes=5))).access_token
    for call in ("done", "fresh"):
        head = await store.writer.create(RUN, call, "search", b'{"q":1}')
        head = await store.writer.start_projecting(head, b'{"raw":1}')
        await store.writer.complete(head, b'{"a":1}', EvidenceStatus.EVIDENCE_FOUND, "s")
        if call == "done":
            await ReceiptWorker(store, consumer="w").run(burst=True)
    await store.writer.create(RUN, "busy", "search", b"{}")
    server = ReceiptServer(create_app(store))
    task = asyncio.create_task(server.serve())
    while not server.started:
        assert not task.done(), "the server did not start"
        await asyncio.sleep(0.005)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as http:
            yield store, http, token
    finally:
        server.stop()
        await asyncio.wait_for(task, 10)


async def major_version(redis: Redis) -> int:
    return int(str((await redis.info("server"))["redis_version"]).split(".")[0])


async def state_of(redis: Redis, namespace: str) -> dict[bytes, tuple[list[bytes], int]]:
    """Every key's values and absolute expiry (PEXPIRETIME, or PTTL on 6.2)."""
    exact = await major_version(redis) >= 7
    state = {}
    for key in await namespace_keys(redis, namespace):
        expiry = await (redis.pexpiretime(key) if exact else redis.pttl(key))
        state[key] = (await key_values(redis, key), expiry)
    return state


async def test_reading_receipts_changes_nothing(
    client: tuple[Store, httpx.AsyncClient, str], redis: Redis, namespace: str
) -> None:
    """Receipts served from the materialized copy or the record leave Redis exactly as it was."""
    store, http, token = client
    auth = {"Authorization": f"Bearer {token}"}
    before_state = await state_of(redis, namespace)
    before = await commandstats(redis)

    answers = [
        await http.get(f"/v1/invocations/{invocation_id(RUN, call)}/receipt", headers=auth)
        for call in ("done", "fresh", "busy", "done", "missing")
    ]
    answers.append(await http.get("/v1/invocations/inspection-capabilities", headers=auth))
    answers.append(await http.get("/v1/invocations/inspection-capabilities?x=1", headers=auth))
    answers.append(await http.get("/v1/invocations/inspection-capabilities"))

    after = await commandstats(redis)
    assert [a.status_code for a in answers] == [200, 200, 200, 200, 404, 200, 400, 401]
    assert [a.json()["journal_state"] for a in answers[:3]] == [
        "completed",
        "completed",
        "dispatching",
    ]
    changed = {c: after[c] - before.get(c, 0) for c in after if after[c] != before.get(c, 0)}
    assert not (changed.keys() & WRITES), changed
    assert changed.get("hmget", 0) > 0  # the reads did happen
    if await major_version(redis) >= 7:
        assert await state_of(redis, namespace) == before_state
    else:
        now = await state_of(redis, namespace)
        assert now.keys() == before_state.keys()
        for key, (values, pttl) in now.items():
            assert values == before_state[key][0]
            assert pttl <= before_state[key][1]
    assert await store.get(RUN, "done") is not None
