"""A task cancelled while its command is on the wire ends cancelled, whatever the moment.

A loop that polls the store is cancelled at a random moment, 2,000 times: each time it
must end cancelled at once. (On Python 3.11, redis-py's writes lost a cancellation that
came as the write completed, and such a loop polled on forever: a harness waiting for an
operator's decision could not be stopped.)
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

from eventstore.store import Store
from tests.helpers import REQUEST, TOOL

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-cancel"
CANCELS = 2000


def reading(store: Store) -> Callable[[], Awaitable[object]]:
    """One read of a record (a plain command)."""
    return lambda: store.get(RUN, "call-read")


def writing(store: Store) -> Callable[[], Awaitable[object]]:
    """One creation of a new call (a script call, batched with others)."""
    numbers = itertools.count()
    return lambda: store.writer.create(RUN, f"call-{next(numbers)}", TOOL, REQUEST)


@pytest.mark.parametrize("operation", [reading, writing], ids=["read", "write"])
async def test_a_polling_loop_always_ends_when_cancelled(
    make_store: Any, operation: Callable[[Store], Callable[[], Awaitable[object]]]
) -> None:
    """Cancelled at any moment of its store call, the loop ends cancelled within 10 s."""
    store: Store = make_store(shards=2, ttl=timedelta(minutes=5))
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    await store.writer.create(RUN, "call-read", TOOL, REQUEST)
    call = operation(store)
    chance = random.Random(7)

    async def polling() -> None:
        while True:
            await call()
            await asyncio.sleep(0)

    for attempt in range(CANCELS):
        loop = asyncio.create_task(polling())
        await asyncio.sleep(chance.random() * 0.003)
        loop.cancel()
        await asyncio.wait([loop], timeout=10)
        assert loop.cancelled(), f"cancel {attempt} was lost: the loop went on polling"
