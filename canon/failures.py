"""Why a command could not go on, as one line and an exit code (never a traceback).

Every subcommand's handler runs under :func:`one_line_errors` (``canon.cli``): the errors
an operator can cause or fix (bad settings, a server that is down, a port in use, a
folder that cannot be used) become one ``canon: error:`` line on standard error and the
exit code of :mod:`canon.exitcodes` that says which kind of failure it was. Anything else
is a bug and keeps its traceback.

The line names the server by where its URL came from (``--redis-url``, ``REDIS_URL``),
never the URL, its host or its credentials, and never the text of a Redis reply (it may
name keys).
"""

from __future__ import annotations

import errno
import os
import socket
import ssl
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from canon.exitcodes import RET_UNAVAILABLE, RET_USAGE
from eventstore.errors import (
    AccessDenied,
    CanonError,
    EmbeddedRedisError,
    InvalidArgument,
    StoreUnavailable,
)

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


def server_of(args: object) -> str:
    """Name the server the arguments point at by where its URL came from (never the URL)."""
    if getattr(args, "redis_url", None):
        return "the Redis server of --redis-url"
    if os.environ.get("REDIS_URL"):
        return "the Redis server of REDIS_URL"
    return "the Redis server"


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


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def unavailable_reason(exc: BaseException) -> str:
    """Say why the server could not be used, from the errors behind ``exc``."""
    for cause in _causes(exc):
        if isinstance(cause, socket.gaierror):
            return "its host name does not resolve"
        if isinstance(cause, ConnectionRefusedError):
            return "the connection was refused (is it running, on that port?)"
        if isinstance(cause, ssl.SSLError):
            return "the TLS handshake failed"
        if isinstance(cause, TimeoutError) or type(cause).__name__ == "TimeoutError":
            return "it did not answer in time"
        if type(cause).__name__ == "AuthenticationError":
            return "it refused the credentials"
        if isinstance(cause, PermissionError):
            return "permission denied"
        if isinstance(cause, FileNotFoundError):
            return "no socket at that path"
    return f"it could not be reached ({exc})"


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def explain(exc: BaseException, server: str = "the Redis server") -> tuple[str, int] | None:
    """Return the one line and exit code for an error an operator can fix, else None.

    ``server`` names the server in the line (see :func:`server_of`).
    """
    for leaf in _leaves(exc):
        if isinstance(leaf, CommandError):
            return leaf.message, leaf.exit_code
        if isinstance(leaf, AccessDenied):  # reachable, but this user may not: usage
            return ACCESS_DENIED_MESSAGE, RET_USAGE
        if isinstance(leaf, StoreUnavailable):
            return f"{server} is unavailable: {unavailable_reason(leaf)}", RET_UNAVAILABLE
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
