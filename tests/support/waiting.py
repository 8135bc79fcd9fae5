"""Waiting on conditions, never on sleeps: each wait is bounded and fails the test past it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

#: Checks made one event-loop turn apart before the pause between checks grows to 5 ms:
#: a condition a few turns away (a task reaching its first await) is seen at once.
_EAGER_CHECKS = 100


async def wait_for(
    condition: Callable[[], Awaitable[bool] | bool], timeout_s: float = 10.0
) -> None:
    """Check ``condition`` (plain or async) until it holds.

    Raises:
        AssertionError: it still did not hold after ``timeout_s`` seconds.

    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    checks = 0
    while True:
        held = condition()
        if not isinstance(held, bool):
            held = await held
        if held:
            return
        assert loop.time() < deadline, "the condition never held"
        checks += 1
        await asyncio.sleep(0 if checks < _EAGER_CHECKS else 0.005)


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Check ``condition`` from a plain thread until it holds (5 ms apart).

    Raises:
        AssertionError: it still did not hold after ``timeout_s`` seconds.

    """
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.005)


@contextmanager
def no_thread_left(timeout_s: float = 30.0) -> Iterator[None]:
    """Unless the block failed, wait until every thread started inside it is gone."""
    before = set(threading.enumerate())
    yield
    wait_until(lambda: set(threading.enumerate()) - before == set(), timeout_s)
