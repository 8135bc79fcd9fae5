"""A LangGraph ``ToolNode`` whose every call goes through a canon boundary.

``tool_node(boundary, tools)`` is LangGraph's own :class:`~langgraph.prebuilt.ToolNode`
with its ``wrap_tool_call`` and ``awrap_tool_call`` hooks set to
:class:`BoundaryToolCalls`: each ``ToolCall`` of the model's turn (run concurrently, as
the node runs them) becomes one boundary call whose run id is the graph config's
``configurable[run_id_key]`` (``thread_id`` by default) and whose tool call id is the
``ToolCall``'s ``id``. The hooks never call the node's own tool: the node's ``tools`` only
tell the model (and LangGraph) what exists, the boundary's ToolSpec runs the call, and a
name the boundary does not know answers UNKNOWN_TOOL. Every reply is a ``ToolMessage``
(JSON text; ``status="error"`` with the safe error JSON for an error).

Durable execution: a graph resumed from its checkpointer re-runs an interrupted node
from its start, and a fork from an earlier checkpoint re-runs the tools node. With
``ToolBoundary(..., on_duplicate="replay")`` those calls (same thread, same call ids,
same arguments) get the recorded replies: the tools are not executed again and the model
sees the same results.

``graph.invoke`` runs the node's calls in threads: give a
:class:`~eventstore.SyncBoundary` (it serves ``graph.ainvoke`` too). An async
``ToolBoundary`` serves ``ainvoke`` on its store's loop only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from canon.integrations._shared import require

require("langgraph.prebuilt", "langgraph")

from langchain_core.messages import ToolMessage  # noqa: E402
from langchain_core.tools import BaseTool  # noqa: E402
from langgraph.prebuilt import ToolNode  # noqa: E402
from langgraph.prebuilt.tool_node import ToolCallRequest  # noqa: E402
from langgraph.types import Command  # noqa: E402

from canon.integrations.langchain import (  # noqa: E402
    THREAD_ID,
    Boundary,
    call_awaiting,
    call_blocking,
    run_id_of,
)

__all__ = ["BoundaryToolCalls", "tool_node"]


class BoundaryToolCalls:
    """``ToolNode`` hooks that answer every call from the boundary, never the node's tool.

    Args:
        boundary: a ``SyncBoundary`` (``invoke`` and ``ainvoke``) or a ``ToolBoundary``
            (``ainvoke`` on its store's loop).
        run_id_key: the ``configurable`` key of the graph config that names the run.

    Pass :meth:`wrap_tool_call` and :meth:`awrap_tool_call` to a ``ToolNode`` (or use
    :func:`tool_node`).

    """

    def __init__(self, boundary: Boundary, *, run_id_key: str = THREAD_ID) -> None:
        self.boundary = boundary
        self.run_id_key = run_id_key

    def _run_id(self, request: ToolCallRequest) -> str:
        runtime = request.runtime
        return run_id_of(runtime.config if runtime is not None else None, self.run_id_key)

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage:
        """Answer one call of a sync run (``graph.invoke``) through a ``SyncBoundary``.

        Raises:
            TypeError: the boundary is an async ``ToolBoundary``.
            ValueError: the graph's config names no run.

        """
        call = request.tool_call
        return call_blocking(
            self.boundary, self._run_id(request), call["id"], call["name"], call["args"]
        )

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage:
        """Answer one call of an async run (``graph.ainvoke``).

        Raises:
            ValueError: the graph's config names no run.

        """
        call = request.tool_call
        return await call_awaiting(
            self.boundary, self._run_id(request), call["id"], call["name"], call["args"]
        )


def tool_node(
    boundary: Boundary,
    tools: Sequence[BaseTool | Callable[..., Any]],
    *,
    run_id_key: str = THREAD_ID,
    **options: Any,
) -> ToolNode:
    """A ``ToolNode`` over ``tools`` whose calls all go through ``boundary``.

    Args:
        boundary: see :class:`BoundaryToolCalls`.
        tools: what the model is told exists, e.g. ``as_tools(boundary, schemas)``.
        run_id_key: the ``configurable`` key of the graph config that names the run.
        options: any other ``ToolNode`` option (``name``, ``messages_key``, ...).

    """
    hooks = BoundaryToolCalls(boundary, run_id_key=run_id_key)
    return ToolNode(
        tools,
        wrap_tool_call=hooks.wrap_tool_call,
        awrap_tool_call=hooks.awrap_tool_call,
        **options,
    )
