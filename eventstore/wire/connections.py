"""The store's connections: they never lose a cancellation, nor reopen once closed.

redis-py bounds a command's write, and the read of what an idle pooled connection holds
(push notifications, or the reply of a command whose caller left), with
``asyncio.wait_for``. On Python 3.11, when the awaited operation completes just as the
task is cancelled, ``wait_for`` returns its result and the cancellation is lost (CPython
bpo-42130, gone in 3.12, where ``wait_for`` is built on ``asyncio.timeout``): the task
carries on as if it had never been cancelled. A loop that its owner cancels to stop it
(a harness polling a record, a worker between reads) then runs on forever, and whoever
awaits it waits forever.

:func:`keeping_cancellation` gives a pool the connection class that raises the lost
cancellation again once those two return or fail. On 3.12 and later it changes nothing.

:class:`StorePool` is the single server's pool. redis-py's pool, once closed, still hands
out its closed connections and reopens them; a call that outlives its store's close (a
framework that leaves a tool call running when it stops) would then hold a connection
nothing ever closes. Closed, this pool refuses instead: the call fails as on an
unreachable server (``StoreUnavailable``).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

from redis.asyncio.connection import AbstractConnection, BlockingConnectionPool
from redis.exceptions import RedisError

from eventstore.errors import CanonError

_T = TypeVar("_T")


async def _raising_a_lost_cancellation(operation: Awaitable[_T]) -> _T:
    task = asyncio.current_task()
    if task is None:
        return await operation
    cancelling = task.cancelling()
    try:
        result = await operation
    except asyncio.CancelledError:
        raise
    except BaseException:
        # The read of a stale reply (not a push) raises ConnectionError, so that the
        # pool reconnects, even after it dropped the cancellation.
        if task.cancelling() > cancelling:
            raise asyncio.CancelledError from None
        raise
    # A cancellation that reached the task was thrown into it; one still counted after
    # a normal return was caught and dropped below (asyncio.timeout, which turns its
    # own into TimeoutError, uncounts it first).
    if task.cancelling() > cancelling:
        raise asyncio.CancelledError
    return result


class _KeepsCancellation(AbstractConnection):
    """Mixed in before a redis-py connection class (see :func:`keeping_cancellation`)."""

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        """Send as redis-py does; a cancellation requested meanwhile is raised, never lost."""
        await _raising_a_lost_cancellation(super().send_packed_command(command, check_health))

    async def handle_pending_push_notifications(self) -> None:
        """Read what the idle connection holds as redis-py does, keeping a cancellation."""
        await _raising_a_lost_cancellation(super().handle_pending_push_notifications())


#: The class made for each redis-py class: one per class, however many pools ask.
_KEEPING: dict[type[Any], type[Any]] = {}


def keeping_cancellation(connection_class: type[Any]) -> type[Any]:
    """``connection_class`` (a redis-py asyncio connection class), keeping cancellations.

    The same class comes back for the same argument, and on Python 3.12 and later the
    argument itself.
    """
    if sys.version_info >= (3, 12) or issubclass(connection_class, _KeepsCancellation):
        return connection_class
    kept = _KEEPING.get(connection_class)
    if kept is None:
        kept = type(connection_class.__name__, (_KeepsCancellation, connection_class), {})
        _KEEPING[connection_class] = kept
    return kept


class PoolClosed(CanonError, RedisError):
    """Raised when a connection is asked of a :class:`StorePool` after it was closed.

    A Redis error too, so the store reports it as any failure to reach Redis
    (``StoreUnavailable``).
    """


class StorePool(BlockingConnectionPool):
    """A blocking pool that hands out no connection once it is closed (see the module doc).

    Attributes:
        closed: set by :meth:`aclose`; from then on :meth:`get_connection` raises.

    """

    closed = False

    async def get_connection(self, *args: Any, **kwargs: Any) -> AbstractConnection:
        """A connection, as redis-py's pool gives it.

        Raises:
            PoolClosed: the pool was closed (never retried: it stays closed).

        """
        if self.closed:
            raise PoolClosed("the store was closed")
        opened: Any = super().get_connection  # untyped in redis-py
        connection: AbstractConnection = await opened(*args, **kwargs)
        return connection

    async def aclose(self) -> None:
        """Close every connection, and open none from now on."""
        self.closed = True
        await super().aclose()
