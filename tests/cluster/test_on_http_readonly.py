"""On the cluster: reading receipts over HTTP writes nothing.

The tests of ``tests/integration/test_http_readonly.py``, collected again (``reuse.py``).
``INFO commandstats`` counts one node's commands, so this module's ``redis`` fixture adds
up every primary's counts: a write on any master shows up.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster

from tests.cluster.harness import LocalCluster
from tests.cluster.reuse import single_server_tests
from tests.integration import test_http_readonly as single_server


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
async def redis(redis_cluster: LocalCluster) -> AsyncIterator[SummedInfoCluster]:
    """The cluster client of ``conftest.py``, counting commands on every primary."""
    client = RedisCluster.from_url(redis_cluster.url, decode_responses=False)
    try:
        yield SummedInfoCluster(client)
    finally:
        await client.aclose()


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


globals().update(single_server_tests(single_server))
