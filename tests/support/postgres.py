"""A private PostgreSQL server for the archive tests: Debian's binaries, a temp dir, a free port.

Never the system server on 5432: ``initdb`` makes a cluster in a temporary folder, and
``postgres`` serves it on a free loopback port (:mod:`tests.support.ports`) with
durability off (a test server), until the session ends and it is stopped by its pid.
Run as root (CI), the server runs as the ``postgres`` user, which PostgreSQL requires.
Missing binaries fail the tests, naming the install (``scripts/test.sh`` installs them).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.ports import free_port

BIN = Path("/usr/lib/postgresql/15/bin")
INSTALL = "apt-get install -y postgresql"
#: Longest wait for the server to accept connections.
START_TIMEOUT_S = 30.0


def _as_user() -> dict[str, Any]:
    """Run as ``postgres`` when we are root (the server refuses root), else as ourselves."""
    if os.geteuid() != 0:
        return {}
    return {"user": "postgres", "group": pwd.getpwnam("postgres").pw_gid}


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of a database ``archive`` on a private PostgreSQL server for this session."""
    missing = [str(BIN / name) for name in ("initdb", "postgres") if not (BIN / name).exists()]
    if missing:
        pytest.fail(f"the archive tests need {', '.join(missing)}: run '{INSTALL}'")
    base = Path(tempfile.mkdtemp(prefix="canon-pg-"))
    user = _as_user()
    if user:
        shutil.chown(base, user="postgres")
    data, log = base / "data", base / "server.log"
    subprocess.run(
        [
            *(str(BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "canon", "-E", "UTF8"),
            *("--no-sync", "--no-instructions"),
        ],
        check=True,
        capture_output=True,
        **user,
    )
    port = free_port()
    with log.open("wb") as sink:
        server = subprocess.Popen(
            [
                *(str(BIN / "postgres"), "-D", str(data), "-p", str(port), "-h", "127.0.0.1"),
                *("-k", str(base), "-c", "fsync=off", "-c", "synchronous_commit=off"),
                *("-c", "full_page_writes=off", "-c", "max_connections=50"),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            **user,
        )
    url = f"postgresql://canon@127.0.0.1:{port}/archive"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                with psycopg.connect(
                    f"postgresql://canon@127.0.0.1:{port}/postgres", autocommit=True
                ) as connection:
                    connection.execute("CREATE DATABASE archive")
                break
            except psycopg.OperationalError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"PostgreSQL did not start: {log.read_text()[-2000:]}")
                time.sleep(0.05)  # the server's socket is not up yet: poll it
        yield url
    finally:
        server.send_signal(signal.SIGINT)  # fast shutdown
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(base, ignore_errors=True)
