"""The store's rooted error hierarchy. Redis exceptions are translated here, at the edge.

The root, :class:`CanonError`, and :class:`InvalidArgument` are defined in
:mod:`machine.errors` (so the pure fold's errors can derive from them) and re-exported
here; every error of ``eventstore``, ``projections`` and ``canon`` derives from the root.
No message built here contains a payload, a Redis key, a token or Redis error text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis.exceptions

from machine.codes import ErrorCode
from machine.errors import CanonError, InvalidArgument

__all__ = [
    "CanonError",
    "EmbeddedRedisError",
    "InvalidArgument",
    "NamespaceMismatch",
    "RecordExpired",
    "Refused",
    "RunExists",
    "StoreUnavailable",
    "redis_errors",
]


class StoreUnavailable(CanonError):
    """Raised when Redis cannot be reached, times out or fails a command."""

    code = ErrorCode.STORE_UNAVAILABLE


class AccessDenied(StoreUnavailable):
    """Raised when Redis refuses a command with ``NOPERM``: an ACL denial, not an outage.

    The connected ACL user lacks a command or key permission the operation needs (the
    rules per role are in docs/acl.md); retrying will not help. It is a
    :class:`StoreUnavailable` for everyone who only needs to know the store cannot serve
    (the boundary still answers ``STORE_UNAVAILABLE``); entry points name it.
    """


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
        return AccessDenied("NoPermissionError")
    # The Redis text may name keys or arguments; only the exception type is kept.
    return StoreUnavailable(type(exc).__name__)
