"""WAIT for replicas: with ``replicas=1`` an append is acknowledged only once a real replica
on loopback has it; without the replica the append fails loudly, never a silent success."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis

from eventstore import RunContext, ToolBoundary
from eventstore.errors import InvalidArgument, StoreUnavailable
from eventstore.server.durability import DurabilityError
from eventstore.server.embedded import EmbeddedRedis, ServerBinary
from eventstore.store import Store
from eventstore.wire.replication import ReplicationTimeout, validate_replicas
from machine.codes import ErrorCode, Status
from tests.support.calls import RUN, TOOL, assert_safe_error, envelope, open_run, outcome
from tests.support.tools import FakeTool

#: Generous: a loaded CI machine may take a while to schedule the replica's ack.
REPLICA_TIMEOUT_MS = 1000
TIMEOUT_S = 3.0


@pytest.fixture
def primary(server_binary: ServerBinary) -> Iterator[EmbeddedRedis]:
    """A private primary with an append-only file, stopped after the test."""
    # Without the delay a 7.x primary waits five seconds for more replicas before a sync.
    primary = EmbeddedRedis(
        server_binary,
        appendonly=True,
        appendfsync="always",
        extra_args=["--repl-diskless-sync-delay", "0"],
    )
    with primary as server:
        yield server


@pytest.fixture
def replica(server_binary: ServerBinary, primary: EmbeddedRedis) -> Iterator[EmbeddedRedis]:
    """A replica of ``primary`` on another loopback port, stopped after the test."""
    server = EmbeddedRedis(
        server_binary, extra_args=["--replicaof", "127.0.0.1", str(primary.port)]
    )
    with server:
        yield server


async def wait_for_link(primary: Redis, expected: int, timeout_s: float = 10.0) -> None:
    """Wait until the primary counts ``expected`` replicas whose link is up and in sync."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = await primary.info("replication")
        connected = int(info["connected_slaves"])
        online = sum(
            1
            for name, value in info.items()
            if name.startswith("slave") and isinstance(value, dict) and value["state"] == "online"
        )
        if connected == expected and online == expected:
            return
        assert time.monotonic() < deadline, f"replication link not {expected}: {info}"
        await asyncio.sleep(0.05)


@pytest.fixture
async def clients(primary: EmbeddedRedis, replica: EmbeddedRedis) -> AsyncIterator[Any]:
    """Plain clients of the primary and the replica, once the replica is in sync."""
    primary_client = Redis.from_url(primary.url)
    replica_client = Redis.from_url(replica.url)
    try:
        await wait_for_link(primary_client, 1)
        yield primary_client, replica_client
    finally:
        await primary_client.aclose()
        await replica_client.aclose()


@pytest.fixture
async def replicated(primary: EmbeddedRedis, clients: Any, namespace: str) -> AsyncIterator[Store]:
    """A strict store on the primary whose appends wait for one replica, with the run open."""
    store = Store.from_url(
        primary.url,
        namespace=namespace,
        timeout_s=TIMEOUT_S,
        durability="strict",
        replicas=1,
        replica_timeout_ms=REPLICA_TIMEOUT_MS,
    )
    async with store:
        await open_run(store)
        yield store


async def test_acknowledged_append_is_on_the_replica(replicated: Store, clients: Any) -> None:
    """With the replica up, a call succeeds and the replica already holds the record and the
    stream exactly as the primary does when the call returns."""
    primary_client, replica_client = clients
    boundary = ToolBoundary(replicated, {TOOL: FakeTool().spec()})

    reply = await boundary.invoke(RunContext(RUN), envelope("c1"))

    assert outcome(reply) == "READY"
    record = replicated.keys.record(RUN, "c1")
    stream = replicated.keys.stream(RUN, "c1")
    on_primary = await primary_client.hgetall(record)
    assert on_primary[b"status"] == b"READY" and on_primary[b"version"] == b"3"
    assert await replica_client.hgetall(record) == on_primary
    assert await replica_client.xrange(stream) == await primary_client.xrange(stream)
    assert replicated.batch_stats.calls == 3


async def test_append_without_the_replica_fails_loudly(
    replicated: Store, clients: Any, replica: EmbeddedRedis, primary: EmbeddedRedis
) -> None:
    """With the replica stopped, the writer raises ReplicationTimeout after waiting, and the
    boundary answers STORE_UNAVAILABLE without executing; once the replica is back the same
    store serves calls again."""
    primary_client, _ = clients
    tool = FakeTool()
    boundary = ToolBoundary(replicated, {TOOL: tool.spec()})
    replica.stop()
    await wait_for_link(primary_client, 0)

    started = time.monotonic()
    with pytest.raises(ReplicationTimeout) as timed_out:
        await replicated.writer.create(RUN, "direct", TOOL, b'{"q":1}')
    assert time.monotonic() - started >= REPLICA_TIMEOUT_MS / 1000 * 0.9
    assert (timed_out.value.acknowledged, timed_out.value.required) == (0, 1)
    assert isinstance(timed_out.value, StoreUnavailable)

    reply = await asyncio.wait_for(boundary.invoke(RunContext(RUN), envelope("c1")), 10)
    assert_safe_error(reply, ErrorCode.STORE_UNAVAILABLE)
    assert tool.executed == 0
    # The primary applied the creation; it is never reported as a success.
    record = await replicated.get(RUN, "c1")
    assert record is not None and record.state.status is Status.PROJECTING

    replacement = EmbeddedRedis(
        replica.binary, extra_args=["--replicaof", "127.0.0.1", str(primary.port)]
    )
    with replacement:
        await wait_for_link(primary_client, 1)
        assert outcome(await boundary.invoke(RunContext(RUN), envelope("c2"))) == "READY"


async def test_strict_store_refuses_to_start_without_its_replicas(
    primary: EmbeddedRedis, namespace: str
) -> None:
    """A strict store asking for one replica refuses to start on a primary that has none."""
    store = Store.from_url(primary.url, namespace=namespace, durability="strict", replicas=1)
    with pytest.raises(DurabilityError) as refused:
        async with store:
            pass
    assert refused.value.risks == ("replicas=0/1",)


@pytest.mark.parametrize(
    ("replicas", "timeout_ms", "cluster"),
    [(-1, 100, False), (1, 0, False), (1, 2000, False), (1, 100, True)],
)
def test_wait_settings_are_validated(replicas: int, timeout_ms: int, cluster: bool) -> None:
    """Negative replicas, a WAIT timeout not below the command timeout, and WAIT on a cluster
    client are invalid arguments."""
    with pytest.raises(InvalidArgument):
        validate_replicas(replicas, timeout_ms, timeout_s=2.0, cluster=cluster)
    validate_replicas(0, timeout_ms, timeout_s=2.0, cluster=cluster)
