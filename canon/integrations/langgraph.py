"""A LangGraph ``ToolNode`` whose every call goes through a canon boundary.

``tool_node(boundary, tools)`` is LangGraph's own :class:`~langgraph.prebuilt.ToolNode`
with its ``wrap_tool_call`` and ``awrap_tool_call`` hooks set to
:class:`BoundaryToolCalls`: each ``ToolCall`` of the model's turn (run concurrently, as
the node runs them) becomes one boundary call whose run id is the graph config's
``configurable[run_id_key]`` (``thread_id`` by default) and whose tool call id is the
``ToolCall``'s ``id``. The hooks never call the node's own tool: the node's ``tools`` say
what this node may run (and tell the model what exists), the boundary's ToolSpec runs the
call. A name the node does not list never reaches canon: LangGraph answers it with its
own invalid-tool ``ToolMessage``, as it does without canon, so agents that share one
boundary cannot reach each other's tools. A listed name the boundary does not know
answers UNKNOWN_TOOL. Every reply is a ``ToolMessage`` (JSON text; ``status="error"``
with the safe error JSON for an error).

Durable execution: a graph resumed from its checkpointer re-runs an interrupted node
from its start, and a fork from an earlier checkpoint re-runs the tools node. The node's
calls therefore answer duplicates by replay, whatever the boundary was built with
(``on_duplicate="replay"`` by default; ``"refuse"`` or None, the boundary's own choice,
on request): those calls (same thread, same call ids, same arguments) get the recorded
replies, the tools are not executed again and the model sees the same results. A
different request under a used id is still DUPLICATE_TOOL_CALL.

Governed tools (a ``ToolSpec`` with ``approval``) wait in LangGraph's own way. A call
canon records as waiting for an operator interrupts the graph (``interrupt``) with
``{"type": "tool_approval", "run_id", "tool_call_id", "approval_id", "name", "args"}``
(:func:`~canon.integrations.langchain.approval_request`); the node's other calls run and
are recorded, or, for one LangGraph cancelled before it started (the node stops at its
first interrupt), when the graph is resumed: each runs once. The graph is resumed with
``Command(resume=...)``: LangGraph re-runs the node, and each call asks canon again. The
resume value is never read: canon's operators decide (``store.decide``, ``canon
approve``), never the graph's caller. Still
waiting, the call interrupts again and nothing runs; approved, its one dispatch runs and
the ``ToolMessage`` carries the result; denied or expired, a ``ToolMessage`` with
``status="error"`` carries APPROVAL_DENIED or APPROVAL_EXPIRED. A pause holds a call:
an approved call of a paused run interrupts again, as one still waiting (never an error
``ToolMessage``), and runs once on a resume after the unpause. A node re-run after
that (a restart from the last checkpoint, a second resume, a fork from an earlier
checkpoint) gets the recorded outcome, and a dispatch a crash cut short answers
ALREADY_DISPATCHED: the tool never runs twice. When several calls of one node wait, LangGraph shows
the first interrupt only (a ``ToolNode`` stops at its first raised interrupt);
``eventstore.audit.waiting.pending_approvals(store)`` lists them all, and one resume asks
canon for each.

``graph.invoke`` runs the node's calls in threads: give a
:class:`~eventstore.SyncBoundary` (it serves ``graph.ainvoke`` too). An async
``ToolBoundary`` serves ``ainvoke`` on its store's loop only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from canon.integrations._shared import OnDuplicateOrNone, require, with_duplicates

require("langgraph.prebuilt", "langgraph")

from langchain_core.messages import ToolMessage  # noqa: E402
from langchain_core.tools import BaseTool  # noqa: E402
from langgraph.prebuilt import ToolNode  # noqa: E402
from langgraph.prebuilt.tool_node import ToolCallRequest  # noqa: E402
from langgraph.types import Command  # noqa: E402

from canon.integrations.langchain import (  # noqa: E402
    APPROVAL_INTERRUPT,
    THREAD_ID,
    Boundary,
    approval_request,
    call_awaiting,
    call_blocking,
    run_id_of,
)

__all__ = ["APPROVAL_INTERRUPT", "BoundaryToolCalls", "approval_request", "tool_node"]


class BoundaryToolCalls:
    """``ToolNode`` hooks that answer every call from the boundary, never the node's tool.

    Args:
        boundary: a ``SyncBoundary`` (``invoke`` and ``ainvoke``) or a ``ToolBoundary``
            (``ainvoke`` on its store's loop).
        run_id_key: the ``configurable`` key of the graph config that names the run.
        on_duplicate: what a call with a used (run, tool call id) gets, as
            ``ToolBoundary``'s option: ``"replay"`` (default, for LangGraph's resumes and
            forks), ``"refuse"``, or None for the boundary's own choice.

    Pass :meth:`wrap_tool_call` and :meth:`awrap_tool_call` to a ``ToolNode`` (or use
    :func:`tool_node`). A call of a tool the node does not list goes to the node itself,
    which answers LangGraph's invalid-tool message without running anything. A governed
    call waiting for an operator interrupts the graph (see the module's docstring).

    Raises:
        InvalidArgument: ``on_duplicate`` is not one of its values.

    """

    def __init__(
        self,
        boundary: Boundary,
        *,
        run_id_key: str = THREAD_ID,
        on_duplicate: OnDuplicateOrNone = "replay",
    ) -> None:
        with_duplicates(boundary, on_duplicate)  # an unknown value fails here, not per call
        self.boundary = boundary
        self.run_id_key = run_id_key
        self.on_duplicate = on_duplicate

    def _boundary(self) -> Boundary:
        # Taken per call, so that the view follows the boundary's own state (closed...).
        return with_duplicates(self.boundary, self.on_duplicate)

    def _run_id(self, request: ToolCallRequest) -> str:
        runtime = request.runtime
        return run_id_of(runtime.config if runtime is not None else None, self.run_id_key)

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        """Answer one call of a sync run (``graph.invoke``) through a ``SyncBoundary``.

        Raises:
            TypeError: the boundary is an async ``ToolBoundary``.
            ValueError: the graph's config names no run.
            GraphInterrupt: the call is governed and waits for an operator.

        """
        if request.tool is None:  # not this node's tool: LangGraph answers, nothing runs
            return execute(request)
        call = request.tool_call
        return call_blocking(
            self._boundary(), self._run_id(request), call["id"], call["name"], call["args"]
        )

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        """Answer one call of an async run (``graph.ainvoke``).

        Raises:
            ValueError: the graph's config names no run.
            GraphInterrupt: the call is governed and waits for an operator.

        """
        if request.tool is None:  # not this node's tool: LangGraph answers, nothing runs
            return await execute(request)
        call = request.tool_call
        return await call_awaiting(
            self._boundary(), self._run_id(request), call["id"], call["name"], call["args"]
        )


def tool_node(
    boundary: Boundary,
    tools: Sequence[BaseTool | Callable[..., Any]],
    *,
    run_id_key: str = THREAD_ID,
    on_duplicate: OnDuplicateOrNone = "replay",
    **options: Any,
) -> ToolNode:
    """A ``ToolNode`` over ``tools`` whose calls all go through ``boundary``.

    Args:
        boundary: see :class:`BoundaryToolCalls`.
        tools: what this node may run and the model is told exists, e.g.
            ``as_tools(boundary, TOOLS)``; a call of any other name never reaches canon.
        run_id_key: the ``configurable`` key of the graph config that names the run.
        on_duplicate: see :class:`BoundaryToolCalls` (``"replay"`` by default).
        options: any other ``ToolNode`` option (``name``, ``messages_key``, ...).

    Raises:
        InvalidArgument: ``on_duplicate`` is not one of its values.

    """
    hooks = BoundaryToolCalls(boundary, run_id_key=run_id_key, on_duplicate=on_duplicate)
    return ToolNode(
        tools,
        wrap_tool_call=hooks.wrap_tool_call,
        awrap_tool_call=hooks.awrap_tool_call,
        **options,
    )
