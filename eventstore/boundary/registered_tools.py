"""A tool as the boundary runs it: what each call needs, decided once at registration.

An exception the executor itself raised reaches the boundary wrapped in
:class:`ToolRaised`, so that it is told apart from the boundary's own failures of the
same call (the tool's time limit, no tool thread left): only the tool's own error may
become the agent's text (``ToolSpec.error_result``).
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from eventstore.boundary.contracts import ToolCall, ToolSpec
from eventstore.boundary.tool_threads import ToolThreads, ToolThreadsExhausted
from eventstore.errors import CanonError, InvalidArgument
from eventstore.wire.deadlines import Deadlines
from machine.governance import MAX_APPROVALS_REQUIRED
from machine.ids import is_tool_name


def valid_time_limit(seconds: float | None) -> bool:
    """Tell whether ``seconds`` is an acceptable tool time limit (None: no limit)."""
    return seconds is None or (isinstance(seconds, int | float) and 0 < seconds < math.inf)


def check_tools(tools: Mapping[str, ToolSpec]) -> None:
    """Check the tools a boundary is given, before any call.

    Raises:
        InvalidArgument: a name the store refuses (:func:`machine.ids.is_tool_name`), a
            time limit that is not a positive number of seconds, an ``error_result``
            that is not callable, or an ``approval`` that is not a bool or a callable,
            is set on a read-only tool, or has an ``approval_timeout`` that is not a
            positive ``timedelta`` or ``approvals_required`` that is not 1 to 10, or a
            ``reconcile`` hook that is not callable, is set on a read-only tool or has
            a ``reconcile_timeout_s`` that is not a positive number of seconds.

    """
    refused = [name for name in tools if not is_tool_name(name)]
    if refused:
        shown = ", ".join(repr(name) for name in refused[:5])
        raise InvalidArgument(f"tool names not allowed (letters, digits, _ . -): {shown}")
    slow = [name for name, spec in tools.items() if not valid_time_limit(spec.timeout_s)]
    if slow:
        shown = ", ".join(repr(name) for name in slow[:5])
        raise InvalidArgument(f"tool time limits must be positive seconds: {shown}")
    uncallable = [
        name
        for name, spec in tools.items()
        if spec.error_result is not None and not callable(spec.error_result)
    ]
    if uncallable:
        shown = ", ".join(repr(name) for name in uncallable[:5])
        raise InvalidArgument(f"a tool's error_result must be callable: {shown}")
    for name, spec in tools.items():
        _check_approval(name, spec)
        _check_reconcile(name, spec)


def _check_reconcile(name: str, spec: ToolSpec) -> None:
    """A reconcile hook: callable, only for a side-effecting tool, with a time limit."""
    if spec.reconcile is None:
        return
    if not callable(spec.reconcile):
        raise InvalidArgument(f"tool {name!r}: reconcile must be callable")
    if spec.read_only:
        raise InvalidArgument(
            f"tool {name!r}: reconcile applies to side-effecting tools (read_only=False): "
            "a read-only call left by a dead process is run again by its retry"
        )
    if not valid_time_limit(spec.reconcile_timeout_s):
        raise InvalidArgument(f"tool {name!r}: reconcile_timeout_s must be positive seconds")


def _check_approval(name: str, spec: ToolSpec) -> None:
    """A tool's approval policy: a bool or a callable, only for a side-effecting tool."""
    approval = spec.approval
    if not (isinstance(approval, bool) or callable(approval)):
        raise InvalidArgument(f"tool {name!r}: approval must be True, False or a callable")
    if approval is not False and spec.read_only:
        raise InvalidArgument(
            f"tool {name!r}: approval applies to side-effecting tools (read_only=False)"
        )
    required = spec.approvals_required
    if (
        not isinstance(required, int)
        or isinstance(required, bool)
        or not 1 <= required <= MAX_APPROVALS_REQUIRED
    ):
        raise InvalidArgument(
            f"tool {name!r}: approvals_required must be a whole number from 1 to "
            f"{MAX_APPROVALS_REQUIRED}"
        )
    timeout = spec.approval_timeout
    if not isinstance(timeout, timedelta) or timeout <= timedelta(0):
        raise InvalidArgument(f"tool {name!r}: approval_timeout must be a positive timedelta")


async def call_tool_function(
    fn: Callable[..., Any], *args: Any, threads: ToolThreads | None
) -> Any:
    """Call a plain or async callable; with ``threads``, a plain one runs in one of them."""
    result = await threads.run(fn, *args) if threads is not None else fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


class ToolRaised(CanonError):
    """Raised when a tool's executor raised an ``Exception`` itself; carries it as ``error``.

    Never leaves the boundary. The tool's own ``CancelledError`` is not wrapped: inside the
    executor it cannot be told from the caller's cancellation or the time limit, which must
    go on as they are.
    """

    def __init__(self, error: Exception) -> None:
        super().__init__(type(error).__name__)
        self.error = error


class RegisteredTool:
    """A registered tool with what its calls need decided once, not per call."""

    __slots__ = ("executor_deadlines", "executor_threads", "governed", "projector_threads", "spec")

    def __init__(
        self, spec: ToolSpec, deadlines: dict[float, Deadlines], threads: ToolThreads
    ) -> None:
        self.spec = spec
        #: Its calls may wait for an operator's approval (see :meth:`needs_approval`).
        self.governed = spec.governed
        plain_executor = not inspect.iscoroutinefunction(spec.executor)
        self.executor_threads = threads if spec.thread and plain_executor else None
        plain_projector = not inspect.iscoroutinefunction(spec.projector)
        self.projector_threads = threads if spec.projector_in_thread and plain_projector else None
        # Tools with the same time limit share one timer (see eventstore.wire.deadlines).
        self.executor_deadlines = (
            deadlines.setdefault(spec.timeout_s, Deadlines(spec.timeout_s))
            if spec.timeout_s is not None
            else None
        )

    def needs_approval(self, arguments: dict[str, Any], call: ToolCall) -> bool:
        """Whether this call of a governed tool waits for an operator's approval.

        The spec's policy decides (:meth:`ToolSpec.needs_approval`).
        """
        return self.spec.needs_approval(arguments, call)

    async def execute(self, arguments: Any, call: ToolCall, task: asyncio.Task[Any]) -> Any:
        """Run the executor in ``task`` within the tool's time limit.

        Raises:
            ToolRaised: the executor raised an ``Exception`` (it carries it).
            TimeoutError: the time limit passed first.
            ToolThreadsExhausted: every tool thread is stuck; the executor never ran.

        """
        running = self._executor(arguments, call)
        if self.executor_deadlines is None:
            return await running
        return await self.executor_deadlines.run(running, task)

    async def _executor(self, arguments: Any, call: ToolCall) -> Any:
        try:
            return await call_tool_function(
                self.spec.executor, arguments, call, threads=self.executor_threads
            )
        except ToolThreadsExhausted:
            raise  # the boundary's refusal to start the tool, not the tool's error
        except Exception as exc:
            raise ToolRaised(exc) from None
