"""OpenAI Agents SDK tools that run through a ``ToolBoundary``: :func:`function_tool`.

``function_tool(boundary, name, description=..., params_json_schema=...)`` builds the SDK's
own ``FunctionTool`` for a tool registered in the boundary under ``name``. The SDK shows
the model the schema (made strict exactly as the SDK does when ``strict_json_schema`` is
true, the default); when the model calls the tool, the call goes to the boundary with the
SDK's own ``ToolContext.tool_call_id`` and the arguments as the model sent them (``""``
meaning ``{}``).

The run: the ``run=`` given here, else the Runner's ``context=`` object, which must be a
:class:`~eventstore.RunContext` or carry a ``run_id`` string (your own context class may
hold it). One agent then serves every run: ``Runner.run(agent, input, context=run)``.

Replies follow the SDK's convention for a tool's answer: a string, an error being a
text the model reads (as the SDK's own failed-tool and timeout messages are). A success
is the bounded result as JSON; an error is ``Error: `` then the safe error JSON (code and
fixed message), never valid JSON, so a tool whose own result is shaped like canon's
error is never mistaken for one. Only a harness mistake (no run id, an async store used
from another event loop) raises, which ends the run with the SDK's ``UserError``.

:func:`function_tools` builds one ``FunctionTool`` per ``ToolSpec`` of the boundary's
tools, described by the spec's ``description`` and ``input_schema``, so each tool is
described once.

Sync and async: with a :class:`~eventstore.ToolBoundary` (async store), use
``await Runner.run`` on the store's event loop. ``Runner.run_sync`` drives a loop of its
own, so give it a :class:`~eventstore.sync.SyncBoundary`: each call then runs on the
boundary's loop while the Runner's loop waits in a worker thread (a call the SDK stops
waiting for still finishes there, and its record keeps the outcome). A SyncBoundary works
under ``Runner.run`` too.

Every other option (``needs_approval``, ``is_enabled``, guardrails, ``timeout_seconds``)
passes to ``FunctionTool`` untouched: an approval the SDK holds back never reaches the
boundary, so a rejected call is never run nor recorded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from canon.integrations._shared import (
    ToolSchema,
    arguments_or_empty,
    flagged_content,
    require,
    tool_schemas,
)
from eventstore.boundary.contracts import AgentReply, RunContext, ToolEnvelope, ToolSpec
from eventstore.boundary.tool_boundary import ToolBoundary
from eventstore.errors import WrongEventLoop
from eventstore.sync import SyncBoundary

require("agents", "openai_agents")

from agents import FunctionTool  # noqa: E402  (only once the SDK is there)
from agents.exceptions import UserError  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402

__all__ = ["function_tool", "function_tools"]


def _run_of(context: Any) -> RunContext:
    """The canon run of a Runner's ``context=`` object."""
    if isinstance(context, RunContext):
        return context
    run_id = getattr(context, "run_id", None)
    if isinstance(run_id, str):
        return RunContext(run_id)
    raise UserError(
        "canon: no run id for this tool call: pass function_tool(..., run=RunContext(...)) "
        "or Runner.run(..., context=...) with a RunContext or an object with a run_id"
    )


async def _invoke(
    boundary: ToolBoundary | SyncBoundary, ctx: RunContext, envelope: ToolEnvelope
) -> AgentReply:
    if isinstance(boundary, SyncBoundary):
        # The boundary's own loop runs the call; this loop (Runner.run_sync's) stays free.
        return await asyncio.to_thread(boundary.invoke, ctx, envelope)
    try:
        return await boundary.invoke(ctx, envelope)
    except WrongEventLoop:
        raise UserError(
            "canon: this ToolBoundary's store runs in another event loop (Runner.run_sync "
            "runs its own): build the tools on a SyncBoundary"
        ) from None


def function_tool(
    boundary: ToolBoundary | SyncBoundary,
    name: str,
    *,
    description: str,
    params_json_schema: Mapping[str, Any],
    strict_json_schema: bool = True,
    run: RunContext | None = None,
    **options: Any,
) -> FunctionTool:
    """Build the Agents SDK ``FunctionTool`` that runs the boundary's tool ``name``.

    Args:
        boundary: the boundary whose tool ``name`` runs the calls; its ``on_duplicate``
            decides what a re-sent call gets (``"replay"``: the recorded reply).
        name: the tool's name, for the model and in the boundary.
        description: what the model is told the tool does.
        params_json_schema: the JSON schema of the arguments.
        strict_json_schema: the SDK's strict mode (made strict by the SDK itself).
        run: the run of every call; None takes it from the Runner's ``context=``.
        options: any other ``FunctionTool`` field (``needs_approval``, ``is_enabled``,
            ``timeout_seconds``, guardrails...), passed untouched.

    """

    async def on_invoke_tool(tool_context: ToolContext[Any], arguments: str) -> str:
        ctx = run if run is not None else _run_of(tool_context.context)
        envelope = ToolEnvelope(
            run_id=ctx.run_id,
            tool_call_id=tool_context.tool_call_id,
            tool=name,
            arguments=arguments_or_empty(arguments),
        )
        return flagged_content(await _invoke(boundary, ctx, envelope))

    return FunctionTool(
        name=name,
        description=description,
        params_json_schema=dict(params_json_schema),
        on_invoke_tool=on_invoke_tool,
        strict_json_schema=strict_json_schema,
        **options,
    )


def function_tools(
    boundary: ToolBoundary | SyncBoundary,
    tools: Mapping[str, ToolSpec | ToolSchema],
    *,
    strict_json_schema: bool = True,
    run: RunContext | None = None,
    **options: Any,
) -> list[FunctionTool]:
    """One :func:`function_tool` per tool, described by its ToolSpec, in order.

    Args:
        boundary: the boundary whose tools run the calls.
        tools: the boundary's ``{name: ToolSpec}`` (each one's ``description`` and
            ``input_schema``; any object when it has none), or ToolSchemas.
        strict_json_schema: the SDK's strict mode, for every tool.
        run: the run of every call; None takes it from the Runner's ``context=``.
        options: any other ``FunctionTool`` field, for every tool.

    """
    return [
        function_tool(
            boundary,
            name,
            description=schema["description"],
            params_json_schema=schema["parameters"],
            strict_json_schema=strict_json_schema,
            run=run,
            **options,
        )
        for name, schema in tool_schemas(tools).items()
    ]
