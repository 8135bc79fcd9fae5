"""Redis down, paused, killed or failing: the agent gets STORE_UNAVAILABLE in bounded time,
never a hang or an exception, and the boundary recovers by itself once Redis is back.

Each test breaks a private server of each supported version; on the cluster, the pausing
and starving tests pause (``CLIENT PAUSE``) or starve (``CONFIG SET maxmemory``) every
master of the session cluster at once, and ``own_store`` is a cluster store.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import msgspec
import pytest
from redis.asyncio import Redis

from eventstore import RunContext, Store, ToolBoundary, ToolCall
from eventstore.server.embedded import EmbeddedRedis, ServerBinary
from machine.codes import ErrorCode, Status
from tests.cluster.harness import LocalCluster
from tests.support.calls import RUN, TOOL, assert_safe_error, envelope, open_run, outcome
from tests.support.tools import FakeTool

pytestmark = pytest.mark.backends("single", "cluster")

#: Per-command timeout of the stores under test; the boundary allows twice this per write.
TIMEOUT_S = 0.3
#: Generous bound on one failing call: retries and backoff included, far from a hang.
BOUND_S = 5.0
#: How long CLIENT PAUSE holds the server (CLIENT UNPAUSE itself is held by a pause ALL).
PAUSE_MS = 3000


@pytest.fixture
def server(
    binary_or_cluster: ServerBinary | LocalCluster,
) -> Iterator[EmbeddedRedis | LocalCluster]:
    """A private Redis of each supported version that survives SIGKILL (AOF, fsync always);
    on the cluster, the session cluster, which only the root fixture stops."""
    if isinstance(binary_or_cluster, LocalCluster):
        yield binary_or_cluster
        return
    embedded = EmbeddedRedis(binary_or_cluster, appendonly=True, appendfsync="always")
    embedded.start()
    try:
        yield embedded
    finally:
        embedded.stop()


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
async def admin(server: EmbeddedRedis | LocalCluster) -> AsyncIterator[EveryMaster]:
    """Plain clients of every master (the private server, or each master of the cluster),
    for pausing and configuring them all."""
    if isinstance(server, LocalCluster):
        clients = [node.client() for node in server.nodes]
    else:
        clients = [Redis.from_url(server.url)]
    try:
        yield EveryMaster(clients)
    finally:
        for client in clients:
            await client.aclose()


@pytest.fixture
async def own_store(server: EmbeddedRedis | LocalCluster, namespace: str) -> AsyncIterator[Store]:
    """A store with a short command timeout on the server (a cluster store on the cluster),
    with the run opened."""
    url = f"{server.url}?cluster=1" if isinstance(server, LocalCluster) else server.url
    store = Store.from_url(url, namespace=namespace, timeout_s=TIMEOUT_S)
    try:
        await open_run(store)
        yield store
    finally:
        await store.aclose()


def assert_unavailable(reply: Any, namespace: str) -> None:
    """STORE_UNAVAILABLE with its fixed message, carrying no Redis text or key."""
    assert_safe_error(reply, ErrorCode.STORE_UNAVAILABLE)
    encoded = msgspec.json.encode(reply)
    for fragment in (namespace, "{s", "canon:", "Error", "OOM", "refused", "127.0.0.1", "LOADING"):
        assert fragment.encode() not in encoded, fragment


async def timed_invoke(boundary: ToolBoundary, call_id: str) -> tuple[Any, float]:
    """Invoke and measure; the call itself is bounded so a hang fails the test, not the run."""
    started = time.perf_counter()
    reply = await asyncio.wait_for(
        boundary.invoke(RunContext(RUN), envelope(call_id)), timeout=BOUND_S * 4
    )
    return reply, time.perf_counter() - started


def boundary_with(store: Store, tool: FakeTool, **replaced: Any) -> ToolBoundary:
    """A boundary running ``tool`` with some of its functions replaced."""
    return ToolBoundary(store, {TOOL: msgspec.structs.replace(tool.spec(), **replaced)})


@pytest.mark.not_on_cluster(
    "stops its server and starts it again; a master down is a failover scenario "
    "(cluster_state:fail without replicas), not one for the shared session cluster"
)
async def test_redis_down_before_the_call(own_store: Store, server: EmbeddedRedis, namespace: str):
    """With the server stopped, a call answers STORE_UNAVAILABLE within the bound and runs
    nothing; after a restart the same boundary serves calls again."""
    tool = FakeTool()
    boundary = ToolBoundary(own_store, {TOOL: tool.spec()})
    server.kill()

    reply, elapsed = await timed_invoke(boundary, "c1")

    assert_unavailable(reply, namespace)
    assert elapsed < BOUND_S and tool.executed == 0
    server.start()
    assert outcome((await timed_invoke(boundary, "c2"))[0]) == "READY"


@pytest.mark.not_on_cluster(
    "connects to a port nothing listens on, the same with or without a cluster"
)
async def test_unreachable_store_answers_quickly(namespace: str):
    """A store whose address nothing listens on answers STORE_UNAVAILABLE within the bound."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = Store.from_url(f"redis://127.0.0.1:{port}/0", namespace=namespace, timeout_s=TIMEOUT_S)
    try:
        tool = FakeTool()
        reply, elapsed = await timed_invoke(ToolBoundary(store, {TOOL: tool.spec()}), "c1")
    finally:
        await store.aclose()

    assert_unavailable(reply, namespace)
    assert elapsed < BOUND_S and tool.executed == 0


async def pause(admin: EveryMaster) -> None:
    """Pause every client of the server (of every master) for PAUSE_MS."""
    await admin.execute_command("CLIENT", "PAUSE", PAUSE_MS, "ALL")


async def pause_over(admin: EveryMaster) -> None:
    """Return once the pause has ended: a pause ALL holds ``PING`` too, so its answer comes
    no sooner than the end."""
    await admin.execute_command("PING")


async def test_redis_paused_before_the_call(own_store: Store, admin: EveryMaster, namespace: str):
    """A server paused (CLIENT PAUSE ALL) longer than the timeout makes the call
    STORE_UNAVAILABLE before the pause ends; afterwards calls run again."""
    tool = FakeTool()
    boundary = ToolBoundary(own_store, {TOOL: tool.spec()})
    await pause(admin)

    reply, elapsed = await timed_invoke(boundary, "c1")

    assert_unavailable(reply, namespace)
    assert elapsed < PAUSE_MS / 1000 - 0.5 and tool.executed == 0
    await pause_over(admin)
    assert outcome((await timed_invoke(boundary, "c2"))[0]) == "READY"


async def test_redis_paused_mid_call(own_store: Store, admin: EveryMaster, namespace: str):
    """A server paused while the executor runs makes the call STORE_UNAVAILABLE before the
    pause ends; the projector, which starts once the raw response is written (before its
    answer), may have run, but nothing it returned is stored or shown; afterwards the
    boundary recovers."""
    tool = FakeTool()

    async def pausing_executor(arguments: dict[str, Any], call: ToolCall) -> Any:
        if call.tool_call_id == "c1":
            await pause(admin)
        return {"rows": 1}

    boundary = boundary_with(own_store, tool, executor=pausing_executor)

    reply, elapsed = await timed_invoke(boundary, "c1")

    assert_unavailable(reply, namespace)
    assert elapsed < PAUSE_MS / 1000 - 0.5 and tool.projected <= 1
    await pause_over(admin)
    record = await own_store.get(RUN, "c1")
    assert record is not None and record.state.status is Status.PROJECTING
    assert record.result is None
    assert outcome((await timed_invoke(boundary, "c2"))[0]) == "READY"


async def test_redis_paused_while_the_projector_runs(
    own_store: Store, admin: EveryMaster, namespace: str
):
    """A server paused while the projector runs: the result could not be stored, so the
    agent gets STORE_UNAVAILABLE, never the result; the record keeps the raw response and
    stays PROJECTING, without a result."""
    tool = FakeTool()

    async def pausing_projector(raw: Any, call: ToolCall) -> Any:
        if call.tool_call_id == "c1":
            await pause(admin)
        return tool.projector(raw, call)

    boundary = boundary_with(own_store, tool, projector=pausing_projector)

    reply, elapsed = await timed_invoke(boundary, "c1")

    assert_unavailable(reply, namespace)
    assert elapsed < PAUSE_MS / 1000 - 0.5 and tool.projected == 1
    await pause_over(admin)
    record = await own_store.get(RUN, "c1")
    assert record is not None and record.state.status is Status.PROJECTING
    assert record.raw is not None and record.result is None
    assert outcome((await timed_invoke(boundary, "c2"))[0]) == "READY"


@pytest.mark.not_on_cluster(
    "kills its server and starts it again; as above, not for the shared session cluster"
)
async def test_redis_killed_while_the_executor_runs(
    own_store: Store, server: EmbeddedRedis, namespace: str
):
    """A server killed during execution makes the call STORE_UNAVAILABLE; the record is left
    PROJECTING (never a guessed READY) and, once the server is back, new calls succeed."""
    tool = FakeTool()

    def killing_executor(arguments: dict[str, Any], call: ToolCall) -> Any:
        if call.tool_call_id == "c1":
            server.kill()
        return {"rows": 1}

    boundary = boundary_with(own_store, tool, executor=killing_executor)

    reply, elapsed = await timed_invoke(boundary, "c1")

    assert_unavailable(reply, namespace)
    assert elapsed < BOUND_S and tool.projected == 0
    server.start()
    record = await own_store.get(RUN, "c1")
    assert record is not None and record.state.status is Status.PROJECTING
    assert record.raw is None
    assert outcome((await timed_invoke(boundary, "c2"))[0]) == "READY"


async def test_redis_refusing_writes(own_store: Store, admin: EveryMaster, namespace: str):
    """A server that fails commands (out of memory under noeviction) gives STORE_UNAVAILABLE
    without its error text; once memory is allowed again calls run."""
    tool = FakeTool()
    boundary = ToolBoundary(own_store, {TOOL: tool.spec()})
    await admin.config_set("maxmemory", 1)
    try:
        reply, elapsed = await timed_invoke(boundary, "c1")
    finally:
        await admin.config_set("maxmemory", 0)

    assert_unavailable(reply, namespace)
    assert elapsed < BOUND_S and tool.executed == 0
    assert outcome((await timed_invoke(boundary, "c2"))[0]) == "READY"
