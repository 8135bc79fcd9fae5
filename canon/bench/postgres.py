"""A private PostgreSQL server for the archive section: Debian's binaries, a temp dir, a port.

Never a server someone else runs: ``initdb`` makes a cluster in a temporary folder and
``postgres`` serves it on a free loopback port with PostgreSQL's own defaults (fsync and
synchronous commit on, as in production), until the section ends and it is stopped by
its pid and its folder removed. Run as root, the server runs as the ``postgres`` user,
which PostgreSQL requires. :func:`server_binaries` finds the binaries (the newest
``/usr/lib/postgresql/<version>/bin``, else ``initdb`` on ``PATH``).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from eventstore.errors import CanonError
from eventstore.server.loopback import free_port

#: Where Debian installs each PostgreSQL version's server binaries.
DEBIAN_ROOT: Final = Path("/usr/lib/postgresql")
#: What installs them.
INSTALL: Final = "apt-get install -y postgresql"
#: Longest wait for the server to accept connections.
START_TIMEOUT_S: Final = 60.0


class PostgresUnavailable(CanonError):
    """Raised when no private PostgreSQL server can be started (the message says why)."""


def server_binaries() -> Path | None:
    """The folder holding ``initdb`` and ``postgres``, newest version first; None if none."""
    versions = sorted(
        (path for path in DEBIAN_ROOT.glob("*/bin") if (path / "initdb").exists()),
        key=lambda path: int(path.parent.name) if path.parent.name.isdigit() else 0,
        reverse=True,
    )
    if versions:
        return versions[0]
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _as_postgres() -> dict[str, Any]:
    """Run as ``postgres`` when we are root (the server refuses root), else as ourselves."""
    if os.geteuid() != 0:
        return {}
    try:
        return {"user": "postgres", "group": pwd.getpwnam("postgres").pw_gid}
    except KeyError:
        raise PostgresUnavailable("running as root and there is no postgres user") from None


def _accepts(port: int) -> bool:
    """Tell whether the server answers on ``port`` (a connection to its admin database)."""
    import psycopg

    try:
        with psycopg.connect(
            f"postgresql://canon@127.0.0.1:{port}/postgres", autocommit=True, connect_timeout=2
        ):
            return True
    except psycopg.OperationalError:
        return False


def _start(binaries: Path, base: Path, user: dict[str, Any]) -> tuple[subprocess.Popen[bytes], int]:
    """Make a cluster in ``base`` (initdb) and start its server; return it and its port."""
    data, log = base / "data", base / "server.log"
    subprocess.run(  # noqa: S603 - a located initdb, fixed arguments, no shell
        [
            *(str(binaries / "initdb"), "-D", str(data), "-A", "trust", "-U", "canon"),
            *("-E", "UTF8", "--no-instructions"),
        ],
        check=True,
        capture_output=True,
        **user,
    )
    port = free_port()
    with log.open("wb") as sink:
        server = subprocess.Popen(  # noqa: S603 - a located postgres, fixed arguments, no shell
            [
                *(str(binaries / "postgres"), "-D", str(data), "-p", str(port)),
                *("-h", "127.0.0.1", "-k", str(base)),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            **user,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _accepts(port):
        if server.poll() is not None or time.monotonic() > deadline:
            _stop(server)
            raise PostgresUnavailable(f"PostgreSQL did not start: {log.read_text()[-500:]}")
        time.sleep(0.1)  # its socket is not up yet: poll it
    return server, port


def _stop(server: subprocess.Popen[bytes]) -> None:
    """Stop the server by its pid (a fast shutdown; killed if it takes over a minute)."""
    if server.poll() is None:
        server.send_signal(signal.SIGINT)
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


@contextlib.contextmanager
def private_postgres(database: str = "archive") -> Iterator[str]:
    """Start a private server with an empty ``database``; yield its URL; stop it at the end.

    Raises:
        PostgresUnavailable: no server binaries, no ``psycopg``, or it did not start.

    """
    try:
        import psycopg
    except ImportError:
        raise PostgresUnavailable(
            "psycopg is not installed: pip install 'canon-store[archive-postgres]'"
        ) from None
    binaries = server_binaries()
    if binaries is None:
        raise PostgresUnavailable(f"no PostgreSQL server binaries (run '{INSTALL}')")
    user = _as_postgres()
    base = Path(tempfile.mkdtemp(prefix="canon-bench-pg-"))
    try:
        if user:
            shutil.chown(base, user="postgres")
        try:
            server, port = _start(binaries, base, user)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise PostgresUnavailable(f"PostgreSQL could not start: {type(exc).__name__}") from None
        try:
            with psycopg.connect(
                f"postgresql://canon@127.0.0.1:{port}/postgres", autocommit=True
            ) as connection:
                connection.execute(f"CREATE DATABASE {database}")
            yield f"postgresql://canon@127.0.0.1:{port}/{database}"
        finally:
            _stop(server)
    finally:
        shutil.rmtree(base, ignore_errors=True)
