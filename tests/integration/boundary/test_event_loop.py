"""An async store belongs to one event loop; any other loop gets WrongEventLoop at once."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest

from eventstore import CanonError, Store, ToolBoundary, WrongEventLoop
from eventstore.boundary.contracts import RunContext
from tests.support.calls import RUN, TOOL, envelope, open_run, outcome
from tests.support.tools import FakeTool


def test_a_second_asyncio_run_is_refused_with_the_fix(redis_url: str, namespace: str) -> None:
    """A store used in one asyncio.run and then in another raises WrongEventLoop, a
    CanonError naming SyncStore, at the first call; the first loop's work stands."""

    async def first(store: Store) -> None:
        async with store:
            await store.open_run(RUN, deadline=timedelta(minutes=5))

    store = Store.from_url(redis_url, namespace=namespace)
    asyncio.run(first(store))
    with pytest.raises(WrongEventLoop) as refused:
        asyncio.run(store.run_info(RUN))
    assert isinstance(refused.value, CanonError)
    assert "SyncStore" in str(refused.value) and "inside the event loop" in str(refused.value)

    async def fresh() -> bool:
        async with Store.from_url(redis_url, namespace=namespace) as own:
            return await own.run_info(RUN) is not None

    assert asyncio.run(fresh())  # the fix: a store built inside the loop that uses it


async def test_invoke_from_other_threads_loops_raises_and_writes_nothing(
    make_store: Any, namespace: str
) -> None:
    """ToolBoundary.invoke from eight threads, each with its own loop, raises
    WrongEventLoop in each (never STORE_UNAVAILABLE, never CancelledError); the tool never
    runs, no record is written and no budget is spent."""
    store = make_store()
    await open_run(store, budget=10)
    tool = FakeTool()
    boundary = ToolBoundary(store, {TOOL: tool.spec()})

    def in_own_loop(number: int) -> BaseException | str:
        try:
            reply = asyncio.run(boundary.invoke(RunContext(RUN), envelope(f"call-{number}")))
        except BaseException as exc:
            return exc
        return outcome(reply)

    with ThreadPoolExecutor(8) as threads:
        escaped = await asyncio.gather(
            *(asyncio.wrap_future(threads.submit(in_own_loop, n)) for n in range(8))
        )
    assert all(type(exc) is WrongEventLoop for exc in escaped), escaped
    assert tool.executed == 0
    assert await store.get(RUN, "call-0") is None
    info = await store.run_info(RUN)
    assert info is not None and (info.used_total, info.invocations) == (0, 0)
    # The store's own loop still works.
    assert outcome(await boundary.invoke(RunContext(RUN), envelope("call-own"))) == "READY"
