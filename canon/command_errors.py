"""Why a command could not go on, as one line and an exit code (never a traceback).

Every subcommand's handler runs under :func:`one_line_errors` (``canon.cli``): the errors
an operator can cause or fix (bad settings, a server that is down, a port in use, a
folder that cannot be used) become one ``canon: error:`` line on standard error and the
exit code of :mod:`canon.exitcodes` that says which kind of failure it was. Anything else
is a bug and keeps its traceback.

The line names the server by where its URL came from (``--redis-url``, ``REDIS_URL``) and
its address (``host:port``, or the socket's path), never the URL's user name or password,
and never the text of a Redis reply (it may name keys).
"""

from __future__ import annotations

import errno
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import unquote, urlsplit

from canon.exitcodes import RET_UNAVAILABLE, RET_USAGE
from eventstore.errors import (
    AccessDenied,
    CanonError,
    EmbeddedRedisError,
    InvalidArgument,
    NoSuchDatabase,
    NotACluster,
    StoreUnavailable,
    unavailable_reason,
)
from eventstore.server.data_dir import DataDirTooNew
from projections.archive.database import ArchiveUnavailable

#: The one line an ACL denial gets (never the Redis text: it may name a key).
ACCESS_DENIED_MESSAGE = (
    "the Redis user is not permitted to run a command this needs (NOPERM, an ACL denial); "
    "see docs/acl.md for the rules of each role"
)
#: The URL schemes redis-py accepts.
URL_SCHEMES = ("redis", "rediss", "unix")


class CommandError(CanonError):
    """Raised when a command cannot go on; carries its one line and its exit code."""

    def __init__(self, message: str, exit_code: int = RET_USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


def fail(message: str) -> None:
    """Write one ``canon: error:`` line to standard error."""
    print(f"canon: error: {message}", file=sys.stderr)


def url_address(url: str) -> str | None:
    """The address a Redis URL names: ``host:port`` or ``unix socket PATH`` (no credentials).

    None when the URL cannot be read.
    """
    try:
        parts = urlsplit(url)
        if parts.scheme == "unix":
            return f"unix socket {unquote(parts.path)}" if parts.path else None
        host = parts.hostname
        port = parts.port or 6379
    except ValueError:
        return None
    if not host:
        return None
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def url_database(url: str) -> int | None:
    """The database number a ``redis://`` URL names (its path, or ``?db=``), else None."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        text = dict(pair.partition("=")[::2] for pair in parts.query.split("&")).get("db", "")
    else:
        text = parts.path.lstrip("/")
    return int(text) if text.isdigit() else None


def server_of(args: object) -> str:
    """Name the server the arguments point at: where its URL came from, and its address.

    ``the Redis server of --redis-url (127.0.0.1:6380)``; never a user name or a password.
    """
    flag = getattr(args, "redis_url", None)
    url = flag or os.environ.get("REDIS_URL")
    if not url:
        return "the Redis server"
    source = "--redis-url" if flag else "REDIS_URL"
    address = url_address(url)
    return f"the Redis server of {source}" + (f" ({address})" if address else "")


def database_of(args: object) -> int | None:
    """The database number the arguments' URL names, if any."""
    url = getattr(args, "redis_url", None) or os.environ.get("REDIS_URL")
    return url_database(url) if url else None


def check_url(url: str) -> str:
    """Return ``url`` when redis-py can use it.

    Raises:
        CommandError: the scheme is not one Redis understands, or the port is not a port.

    """
    parts = urlsplit(url)
    if parts.scheme not in URL_SCHEMES:
        got = f"{parts.scheme}://" if parts.scheme else "no scheme"
        raise CommandError(f"--redis-url must start with redis://, rediss:// or unix:// ({got})")
    try:
        parts.port  # noqa: B018 (parsing the port is the check)
    except ValueError:
        raise CommandError("--redis-url has a port that is not a number from 1 to 65535") from None
    return url


def _why(error: StoreUnavailable) -> str:
    """Why the server could not be used, as the error says or the errors behind it do."""
    reason = error.reason or unavailable_reason(error)
    return reason or f"it could not be reached ({error.cause or type(error).__name__})"


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def explain(
    exc: BaseException, server: str = "the Redis server", database: int | None = None
) -> tuple[str, int] | None:
    """Return the one line and exit code for an error an operator can fix, else None.

    ``server`` names the server in the line (see :func:`server_of`); ``database`` is the
    database number its URL names, if any.
    """
    for leaf in _leaves(exc):
        if isinstance(leaf, CommandError):
            return leaf.message, leaf.exit_code
        if isinstance(leaf, AccessDenied):  # reachable, but this user may not: usage
            return ACCESS_DENIED_MESSAGE, RET_USAGE
        if isinstance(leaf, NoSuchDatabase):  # up and answering: the URL is wrong
            number = leaf.database if leaf.database is not None else database
            named = f" {number}" if number is not None else ""
            return (
                f"{server} has no database{named} (it refused SELECT): name one it has in "
                "the URL, such as redis://HOST:PORT/0 (a server has 16, 0 to 15, unless its "
                "databases setting says otherwise)",
                RET_USAGE,
            )
        if isinstance(leaf, StoreUnavailable):
            return f"{server} is unavailable: {_why(leaf)}", RET_UNAVAILABLE
        if isinstance(leaf, NotACluster):
            return (
                f"--cluster: {server} is not in cluster mode (its cluster support is "
                "disabled): leave out --cluster (and REDIS_CLUSTER=1, and ?cluster=1 in the "
                "URL) to use it as a single server",
                RET_USAGE,
            )
        if isinstance(leaf, DataDirTooNew):
            return leaf.command_line(), RET_USAGE
        if isinstance(leaf, ArchiveUnavailable):
            # The URL is never repeated (it may hold a password); the driver's error type is.
            return f"the archive database is unavailable ({leaf})", RET_UNAVAILABLE
        if isinstance(leaf, EmbeddedRedisError):
            return f"the embedded Redis could not start: {leaf}", RET_UNAVAILABLE
        if isinstance(leaf, InvalidArgument):
            return f"invalid settings: {leaf}", RET_USAGE
        if isinstance(leaf, CanonError):
            return str(leaf), RET_USAGE
    return None


@contextmanager
def bind_errors(what: str, host: str, port: int) -> Iterator[None]:
    """Turn a failure to listen on ``host:port`` into a :class:`CommandError` naming ``what``."""
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            reason = "it is in use (pick another, or stop what listens there)"
        elif exc.errno == errno.EACCES:
            reason = "permission denied (ports below 1024 need privileges)"
        elif isinstance(exc, socket.gaierror):
            reason = "the host name does not resolve"
        else:
            reason = exc.strerror or type(exc).__name__
        raise CommandError(f"cannot listen on {host}:{port} ({what}): {reason}") from None
