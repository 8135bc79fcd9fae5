"""On the cluster: every master paused or refusing writes gives STORE_UNAVAILABLE.

The tests of ``tests/integration/test_boundary_store_failure.py`` that pause or starve the
server, collected again (``reuse.py``). Here ``admin`` sends the pause (``CLIENT PAUSE``)
and ``CONFIG SET maxmemory`` to every master, and ``own_store`` is a cluster store with the
module's short timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from eventstore.store import Store
from tests.cluster.harness import LocalCluster
from tests.cluster.reuse import single_server_tests
from tests.integration import test_boundary_store_failure as single_server
from tests.support.calls import open_run

EXCLUDED = {
    "test_redis_down_before_the_call": (
        "stops its server and starts it again; a master down is a failover scenario "
        "(cluster_state:fail without replicas), not one for the shared session cluster"
    ),
    "test_redis_killed_while_the_executor_runs": (
        "kills its server and starts it again; as above, not for the shared session cluster"
    ),
    "test_unreachable_store_answers_quickly": (
        "connects to a port nothing listens on, the same with or without a cluster"
    ),
}

globals().update(single_server_tests(single_server, exclude=EXCLUDED))


class EveryMaster:
    """The admin commands the module's tests use, sent to every master at once."""

    def __init__(self, clients: list[Redis]) -> None:
        self._clients = clients

    async def execute_command(self, *args: Any) -> list[Any]:
        """Run one command on every master; return their replies."""
        return await asyncio.gather(*(c.execute_command(*args) for c in self._clients))  # type: ignore[no-untyped-call]

    async def config_set(self, name: str, value: Any) -> list[Any]:
        """``CONFIG SET`` on every master."""
        return await asyncio.gather(*(c.config_set(name, value) for c in self._clients))


@pytest.fixture
async def admin(redis_cluster: LocalCluster) -> AsyncIterator[EveryMaster]:
    """Plain clients of every master, for pausing and configuring them all."""
    clients = [node.client() for node in redis_cluster.nodes]
    try:
        yield EveryMaster(clients)
    finally:
        for client in clients:
            await client.aclose()


@pytest.fixture
async def own_store(redis_url: str, namespace: str) -> AsyncIterator[Store]:
    """A cluster store with the module's short command timeout, with the run opened."""
    store = Store.from_url(redis_url, namespace=namespace, timeout_s=single_server.TIMEOUT_S)
    try:
        await open_run(store)
        yield store
    finally:
        await store.aclose()
