"""The benchmark's measured window: a rate is never a zero that only says it was too short."""

from __future__ import annotations

import asyncio

from canon.bench.timing import Tasks, Window, drive


async def _no_server_cpu() -> list[float]:
    return [0.0]


async def test_a_window_shorter_than_one_invocation_stays_open_until_a_few_finished() -> None:
    """Invocations that each take 4x the window's time still give a rate above zero."""
    window = Window()

    async def one(task: int, number: int, window: Window) -> int:
        await asyncio.sleep(0.02)  # the invocation's own work, not a wait for the test
        window.count(1.0)
        return 1

    sample = await drive(window, Tasks(window, 1, one), 0.0, 0.005, _no_server_cpu)

    assert sample.invocations >= 4
    assert sample.invocations_per_s > 0
