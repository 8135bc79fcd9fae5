"""The store's rooted error hierarchy. Redis exceptions are translated here, at the edge.

The root, :class:`CanonError`, and :class:`InvalidArgument` are defined in
:mod:`machine.errors` (so the pure fold's errors can derive from them) and re-exported
here; every error of ``eventstore``, ``projections`` and ``canon`` derives from the root.
No message built here contains a payload, a Redis key, a token or Redis error text.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import redis.exceptions

from machine.codes import ErrorCode
from machine.errors import CanonError, InvalidArgument

__all__ = [
    "CanonError",
    "EmbeddedRedisError",
    "InvalidArgument",
    "NamespaceMismatch",
    "NoSuchDatabase",
    "NotACluster",
    "RecordExpired",
    "Refused",
    "RunExists",
    "StoreUnavailable",
    "redis_errors",
]


class StoreUnavailable(CanonError):
    """Raised when Redis cannot be reached, times out or fails a command.

    Its text names the server when the store that raised it knows it, why, and the
    exception behind it: ``Redis at 127.0.0.1:6379 is unavailable: the connection was
    refused (is it running, on that port?) (ConnectionError)``. Never a password, a key or
    the text of a Redis reply.

    Attributes:
        cause: the name of the redis-py or OS exception behind it (``ConnectionError``);
            also ``args[0]``.
        reason: why, in words a person can act on; empty when nothing more is known.
        server: the server's address (``host:port``, or ``unix socket PATH``), set by the
            :class:`~eventstore.store.Store` it came through; None when unknown.

    """

    code = ErrorCode.STORE_UNAVAILABLE

    def __init__(self, cause: str = "", *, reason: str = "", server: str | None = None) -> None:
        super().__init__(cause)
        self.cause = cause
        self.reason = reason
        self.server = server

    def __str__(self) -> str:
        where = f"Redis at {self.server}" if self.server else "Redis"
        why = f": {self.reason}" if self.reason else ""
        cause = f" ({self.cause})" if self.cause else ""
        return f"{where} is unavailable{why}{cause}"


class AccessDenied(StoreUnavailable):
    """Raised when Redis refuses a command with ``NOPERM``: an ACL denial, not an outage.

    The connected ACL user lacks a command or key permission the operation needs (the
    rules per role are in docs/acl.md); retrying will not help. It is a
    :class:`StoreUnavailable` for everyone who only needs to know the store cannot serve
    (the boundary still answers ``STORE_UNAVAILABLE``); entry points name it.
    """


class NoSuchDatabase(StoreUnavailable):
    """Raised when the URL names a database number the server does not have.

    The server is up and answers; it refused ``SELECT`` (``DB index is out of range``: it
    has fewer databases, its ``databases`` setting, 16 by default). Retrying will not help:
    the URL must name a database it has. The boundary still answers
    ``STORE_UNAVAILABLE``; entry points name it.

    Attributes:
        database: the database number asked for, when the store that raised it knows it.

    """

    def __init__(self, *, server: str | None = None, database: int | None = None) -> None:
        super().__init__(
            "ResponseError", reason="it has no such database (SELECT refused)", server=server
        )
        self.database = database

    def __str__(self) -> str:
        where = f"Redis at {self.server}" if self.server else "the Redis server"
        number = f" {self.database}" if self.database is not None else ""
        return (
            f"{where} has no database{number} (SELECT refused): name a database it has in "
            "the URL (redis://host:port/0; it has as many as its databases setting, 16 by "
            "default)"
        )


class NotACluster(InvalidArgument):
    """Raised when a store is opened as a Redis Cluster on a server that is not in cluster mode.

    ``cluster=True`` (``?cluster=1``, ``canon --cluster``) on a plain Redis: its
    ``CLUSTER SLOTS`` answers that cluster support is disabled. Open it as a single server.

    Attributes:
        server: the node the client was given (``host:port``).

    """

    def __init__(self, server: str) -> None:
        super().__init__(
            f"Redis at {server} is not in cluster mode (its cluster support is disabled): "
            "open it as a single server, without cluster=True or ?cluster=1"
        )
        self.server = server


class Refused(CanonError):
    """Raised when a write script refuses an operation; carries the stable refusal code.

    ``code`` is an :class:`ErrorCode` for refusals an agent may see, else the script's
    own reason (``VERSION_CONFLICT``, ``CHAIN_BROKEN``, ``ILLEGAL_TRANSITION`` ...).
    """

    def __init__(self, code: str, current_version: int | None = None) -> None:
        super().__init__(code)
        self.code = code
        self.current_version = current_version

    @property
    def error_code(self) -> ErrorCode | None:
        """The agent-safe code of this refusal, or None for a writer-side conflict."""
        try:
            return ErrorCode(self.code)
        except ValueError:
            return None


class RecordExpired(Refused):
    """Raised when an update finds its record gone; nothing was created."""

    def __init__(self) -> None:
        super().__init__(ErrorCode.RECORD_EXPIRED.value, 0)


class RunExists(CanonError):
    """Raised when ``open_run`` names a run id that is already registered."""


class DeadlinePassed(InvalidArgument):
    """Raised when ``open_run.lua`` refuses a deadline the server's clock has already passed."""


class RebuildLost(CanonError):
    """Raised when ``switch_generation.lua`` finds the rebuild's claim taken over."""


class NamespaceMismatch(CanonError):
    """Raised when a namespace is opened with a shard count other than the one it has."""


class EmbeddedRedisError(CanonError, RuntimeError):
    """Raised when a ``redis-server`` binary cannot be found, started or reached."""


class WrongEventLoop(CanonError, RuntimeError):
    """Raised when an async ``Store`` is used from an event loop other than its own.

    A store's connections belong to the event loop it first ran in; from another loop (a
    second ``asyncio.run``, another thread's loop) they would fail as if Redis were down.
    Use :class:`eventstore.sync.SyncStore` from plain threads, or build the ``Store``
    inside the loop that uses it.
    """

    def __init__(self, detail: str = "") -> None:
        super().__init__(
            detail
            or "this Store runs in another event loop (it is bound to the loop of its first "
            "call): from threads or a second asyncio.run use eventstore.sync.SyncStore, or "
            "build the Store inside the event loop that uses it"
        )


class StoreClosed(CanonError):
    """Raised when a ``SyncStore`` or ``SyncBoundary`` is used after it was closed."""


@asynccontextmanager
async def redis_errors() -> AsyncIterator[None]:
    """Translate redis-py exceptions into :class:`StoreUnavailable`, dropping their text.

    ``NOPERM`` becomes :class:`AccessDenied`, so an ACL denial is never reported as an
    unreachable server.
    """
    try:
        yield
    except (redis.exceptions.RedisError, OSError) as exc:
        raise store_error(exc) from None


def store_error(exc: redis.exceptions.RedisError | OSError) -> StoreUnavailable:
    """The error to raise for a redis-py exception (what :func:`redis_errors` raises).

    For hot paths that catch the exception themselves: a ``try`` costs nothing until it
    raises, where entering an async context manager costs a few microseconds each time.
    """
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return AccessDenied(
            "NoPermissionError",
            reason="the Redis user is not permitted to run a command this needs (NOPERM)",
        )
    if isinstance(exc, redis.exceptions.ResponseError) and _OUT_OF_RANGE in str(exc):
        return NoSuchDatabase()  # SELECT of the URL's database, when connecting
    # The Redis text may name keys or arguments; only the exception type is kept, and a
    # reason read from the errors behind it (their types and errno, never their text).
    return StoreUnavailable(type(exc).__name__, reason=unavailable_reason(exc))


#: What Redis answers a SELECT of a database it does not have (every version since 2.x).
_OUT_OF_RANGE = "DB index is out of range"


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then the errors behind it (its cause, else its context), each once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def unavailable_reason(exc: BaseException) -> str:
    """Say why Redis could not be used, from the errors behind ``exc`` (never their text).

    Empty when none of them says more than that it failed.
    """
    for cause in _causes(exc):
        if isinstance(cause, socket.gaierror):
            return "its host name does not resolve"
        if isinstance(cause, ConnectionRefusedError):
            return "the connection was refused (is it running, on that port?)"
        if isinstance(cause, ssl.SSLError):
            return "the TLS handshake failed"
        if isinstance(cause, redis.exceptions.AuthenticationError):
            return "it refused the credentials"
        if isinstance(cause, TimeoutError | redis.exceptions.TimeoutError):
            return "it did not answer in time"
        if isinstance(cause, PermissionError):
            return "permission denied"
        if isinstance(cause, FileNotFoundError):
            return "no socket at that path"
        if isinstance(cause, redis.exceptions.BusyLoadingError):
            return "it is still loading its data set (try again shortly)"
    for cause in _causes(exc):
        if isinstance(cause, redis.exceptions.ConnectionError | ConnectionError):
            return "the connection failed or was closed"
    return ""
