"""Which Redis the test suite uses: REDIS_URL, else containers when a Docker engine
answers (unless CANON_TEST_CONTAINERS=0), else private redis-server processes."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable

import pytest

from tests import conftest

#: The check itself, without the session cache in front of it.
use_containers: Callable[[], bool] = conftest._use_containers.__wrapped__


@pytest.fixture
def fake_docker(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Put a ``docker`` on an otherwise empty PATH whose ``docker info`` runs ``script``."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CANON_TEST_CONTAINERS", raising=False)

    def install(script: str) -> None:
        docker = tmp_path / "docker"
        docker.write_text(f"#!/bin/sh\n{script}\n")
        docker.chmod(0o755)

    return install


def test_an_answering_docker_engine_means_containers(fake_docker: Callable[[str], None]) -> None:
    """No opt-in needed: an engine that answers docker info is used."""
    fake_docker("exit 0")
    assert use_containers()


def test_containers_can_be_opted_out(
    fake_docker: Callable[[str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """CANON_TEST_CONTAINERS=0 keeps private servers even with a working engine."""
    fake_docker("exit 0")
    monkeypatch.setenv("CANON_TEST_CONTAINERS", "0")
    assert not use_containers()


def test_a_docker_cli_without_an_engine_means_private_servers(
    fake_docker: Callable[[str], None],
) -> None:
    """docker info failing (the CLI is installed, no daemon runs) falls back at once."""
    fake_docker("echo 'Cannot connect to the Docker daemon' >&2; exit 1")
    started = time.monotonic()
    assert not use_containers()
    assert time.monotonic() - started < 2


def test_an_engine_that_does_not_answer_in_time_means_private_servers(
    fake_docker: Callable[[str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hanging docker info is given up after the timeout, never waited for."""
    fake_docker("exec sleep 5")
    monkeypatch.setattr(conftest, "_DOCKER_INFO_TIMEOUT_S", 0.2)
    started = time.monotonic()
    assert not use_containers()
    assert time.monotonic() - started < 2


def test_no_docker_cli_means_private_servers(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a docker executable nothing is run."""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert not use_containers()
