"""Time limits on awaits, kept by one shared timer instead of a timer per await.

``asyncio.timeout`` schedules and cancels a timer handle for every block it guards; a
tool call guards three store writes, and on a busy boundary those timers cost more CPU
than the rest of the guard. :class:`Deadlines` records when each guarded task must be
done and checks them all with one timer that runs only while something is guarded, every
``resolution`` seconds: a limit is kept to within that resolution.

A task that overruns is cancelled, and its await raises :class:`TimeoutError`, as with
``asyncio.timeout``; a cancellation that came from elsewhere stays a cancellation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, Final, TypeVar

T = TypeVar("T")

#: Longest time between two checks of the deadlines.
DEFAULT_RESOLUTION_S: Final = 0.05


class Deadlines:
    """Bounds awaits by one time limit: ``await deadlines.run(awaitable)``.

    Args:
        seconds: how long a bounded await may take.
        resolution: how often overruns are looked for (default: a quarter of
            ``seconds``, at most 50 ms); a block is stopped at most this late.

    """

    def __init__(self, seconds: float, *, resolution: float | None = None) -> None:
        if seconds <= 0:
            raise ValueError("seconds must be positive")
        self.seconds = seconds
        self.resolution = resolution or min(DEFAULT_RESOLUTION_S, seconds / 4)
        # Guarded task -> (deadline on its loop's clock, its cancel count on entry).
        self._active: dict[asyncio.Task[Any], tuple[float, int]] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._ticker: asyncio.TimerHandle | None = None
        self._ticker_loop: asyncio.AbstractEventLoop | None = None

    async def run(self, awaitable: Awaitable[T], task: asyncio.Task[Any] | None = None) -> T:
        """Await ``awaitable`` within :attr:`seconds`.

        A call made while the same task is already inside ``run`` of these deadlines (a
        tool that calls the boundary again) is bounded by the outer call, whose deadline,
        taken earlier, comes first.

        Args:
            awaitable: what to wait for.
            task: the task that runs this call, when the caller already has it (it saves
                looking it up; a hot path guards several awaits of one task).

        Raises:
            TimeoutError: the limit passed first (``awaitable`` was cancelled).

        """
        if task is None:
            task = asyncio.current_task()
            if task is None:
                raise RuntimeError("a deadline needs a running task")
        active = self._active
        if task in active:  # nested: the outer, earlier deadline bounds both
            return await awaitable
        # Entering and leaving are written out here, not called: every store write of a
        # tool call passes this way.
        loop = task.get_loop()
        active[task] = (loop.time() + self.seconds, task.cancelling())
        if self._ticker is None or self._ticker_loop is not loop:
            # (Deadlines used from another event loop than the last one get their own ticker.)
            self._ticker = loop.call_later(self.resolution, self._tick, loop)
            self._ticker_loop = loop
        try:
            result = await awaitable
        except asyncio.CancelledError:
            if self._exit(task, cancelled=True):
                raise TimeoutError from None
            raise
        except BaseException:
            self._exit(task, cancelled=False)
            raise
        del active[task]
        if task in self._expired:  # it overran, yet finished before its cancellation came
            self._expired.discard(task)
            task.uncancel()
        return result

    def _exit(self, task: asyncio.Task[Any], cancelled: bool) -> bool:
        """Leave a block; True when it must raise TimeoutError (it overran)."""
        _, cancelling = self._active.pop(task)
        if task not in self._expired:
            return False
        self._expired.discard(task)
        # Ours to turn into a timeout only if no one else cancelled the task meanwhile.
        return task.uncancel() <= cancelling and cancelled

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._ticker_loop is not loop:
            return  # superseded by a ticker on the loop now in use
        self._ticker = None
        if not self._active:
            return
        now = loop.time()
        for task, (deadline, _) in self._active.items():
            if deadline <= now and task not in self._expired and not task.done():
                self._expired.add(task)
                task.cancel()
        self._ticker = loop.call_later(self.resolution, self._tick, loop)
