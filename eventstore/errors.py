"""The store's rooted error hierarchy. Redis exceptions are translated here, at the edge.

No message built here contains a payload, a Redis key, a token or Redis error text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis.exceptions

from machine.codes import ErrorCode


class CanonError(Exception):
    """Root of every error the store raises."""


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


class InvalidArgument(CanonError, ValueError):
    """Raised when a caller passes an id, limit or setting the store cannot accept."""


class NamespaceMismatch(CanonError):
    """Raised when a namespace is opened with a shard count other than the one it has."""


@asynccontextmanager
async def redis_errors() -> AsyncIterator[None]:
    """Translate redis-py exceptions into :class:`StoreUnavailable`, dropping their text.

    ``NOPERM`` becomes :class:`AccessDenied`, so an ACL denial is never reported as an
    unreachable server.
    """
    try:
        yield
    except redis.exceptions.NoPermissionError:
        raise AccessDenied("NoPermissionError") from None
    except redis.exceptions.RedisError as exc:
        # The Redis text may name keys or arguments; only the exception type is kept.
        raise StoreUnavailable(type(exc).__name__) from None
    except OSError as exc:
        raise StoreUnavailable(type(exc).__name__) from None
