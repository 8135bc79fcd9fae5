"""Deadlines: one shared timer bounds awaits, as asyncio.timeout would."""

from __future__ import annotations

import asyncio

import pytest

from eventstore.wire.deadlines import Deadlines


async def test_an_await_that_overruns_raises_timeout_error_within_the_resolution() -> None:
    deadlines = Deadlines(0.1, resolution=0.02)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        await deadlines.run(asyncio.sleep(5))
    assert 0.1 <= loop.time() - started < 0.1 + 0.02 + 0.2
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0


async def test_an_await_that_finishes_in_time_is_left_alone() -> None:
    deadlines = Deadlines(0.2, resolution=0.02)
    for _ in range(3):
        await deadlines.run(asyncio.sleep(0.01))
    await asyncio.sleep(0.3)  # the deadline of a finished block never fires later
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0


async def test_concurrent_awaits_each_have_their_own_deadline() -> None:
    deadlines = Deadlines(0.1, resolution=0.01)

    async def sleeper(seconds: float) -> str:
        try:
            await deadlines.run(asyncio.sleep(seconds))
        except TimeoutError:
            return "timeout"
        return "done"

    assert await asyncio.gather(sleeper(0.01), sleeper(1), sleeper(0.02)) == [
        "done",
        "timeout",
        "done",
    ]


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    deadlines = Deadlines(5)

    async def guarded() -> None:
        await deadlines.run(asyncio.sleep(5))

    task = asyncio.create_task(guarded())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_the_timer_stops_when_nothing_is_guarded() -> None:
    deadlines = Deadlines(0.1, resolution=0.01)
    await deadlines.run(asyncio.sleep(0))
    await asyncio.sleep(0.05)
    assert deadlines._ticker is None


async def test_a_nested_call_ends_with_the_outer_call_and_leaves_it_bounded() -> None:
    deadlines = Deadlines(0.1, resolution=0.01)

    async def outer() -> None:
        await deadlines.run(asyncio.sleep(0))
        await asyncio.sleep(5)  # still bounded after the nested call returned

    with pytest.raises(TimeoutError):
        await deadlines.run(outer())
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0
    assert not deadlines._active


async def test_an_outer_deadline_stops_a_nested_call() -> None:
    deadlines = Deadlines(0.1, resolution=0.01)
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def outer() -> None:
        await asyncio.sleep(0.06)
        await deadlines.run(asyncio.sleep(5))  # its own deadline would be 0.1 s from here

    with pytest.raises(TimeoutError):
        await deadlines.run(outer())
    assert 0.1 <= loop.time() - started < 0.16 + 0.2


def test_seconds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Deadlines(0)
