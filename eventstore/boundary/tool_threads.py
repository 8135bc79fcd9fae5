"""Where a boundary runs plain (non-async) executors and projectors: worker threads.

A plain tool would block the event loop, so it runs in a thread: one of the boundary's
own pool when ``ToolBoundary(max_tool_threads=N)`` sizes one (at most N tools at once,
the pool closed with the boundary), else one of the event loop's default executor, which
the whole process shares (``min(32, CPUs + 4)`` threads). Either way the tool runs in a
copy of the caller's context, so context variables (and tracing spans) follow it.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from eventstore.errors import InvalidArgument


class ToolThreads:
    """The threads one boundary's plain tools run in.

    Args:
        max_threads: size of an own pool; None uses the event loop's default executor.

    Raises:
        InvalidArgument: ``max_threads`` is not a whole number of at least 1.

    """

    __slots__ = ("_pool",)

    def __init__(self, max_threads: int | None = None) -> None:
        if max_threads is not None and not (
            type(max_threads) is int and max_threads >= 1  # bool is not a thread count
        ):
            raise InvalidArgument("max_tool_threads must be a whole number of at least 1")
        self._pool = (
            ThreadPoolExecutor(max_threads, thread_name_prefix="canon-tool")
            if max_threads is not None
            else None
        )

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` in one of the threads, in a copy of the current context."""
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def close(self, *, wait: bool = False) -> None:
        """Stop an own pool: idle threads exit now, busy ones when their tool returns.

        Args:
            wait: block until then (never from the event loop: a tool may need it).

        """
        if self._pool is not None:
            self._pool.shutdown(wait=wait)
