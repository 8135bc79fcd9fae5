"""LangChain tools whose every call goes through a canon boundary.

``as_tools(boundary, schemas)`` gives one LangChain :class:`~langchain_core.tools.BaseTool`
per tool, with the arguments schema the caller gives: bind them to a chat model
(``model.bind_tools(tools)``) and run the model's tool calls with them. A call never
runs the tool here: it becomes one :class:`~eventstore.ToolEnvelope` whose run id is the
config's ``configurable[run_id_key]`` (LangGraph's ``thread_id`` by default) and whose
tool call id is the ``ToolCall``'s own ``id``. The reply comes back as a
``ToolMessage``: its content is the bounded result as JSON text, or the safe error JSON
with ``status="error"``.

A tool runs from a ``ToolCall`` only (``tool.invoke(call, config)``), never from bare
arguments: canon keeps the framework's call id and never invents one. The synchronous
path (``invoke``) needs a :class:`~eventstore.SyncBoundary`; the asynchronous one
(``ainvoke``) takes either kind of boundary.

The tools are described once, in the boundary's ``ToolSpec``s: ``as_tools(boundary,
TOOLS)`` shows the model each spec's ``description`` and ``input_schema`` (a
:class:`~canon.integrations._shared.ToolSchema` may be given instead). Like LangGraph's
``tool_node``, the tools answer a call with a used (run, tool call id) by replay unless
told otherwise (``on_duplicate=``): a graph that resumes or forks sends its calls again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from canon.integrations._shared import (
    Boundary,
    OnDuplicate,
    ToolSchema,
    invoke_awaiting,
    invoke_blocking,
    is_error,
    reply_content,
    require,
    tool_schemas,
    with_duplicates,
)

require("langchain_core", "langchain")

from langchain_core.messages import ToolMessage  # noqa: E402
from langchain_core.runnables import RunnableConfig  # noqa: E402
from langchain_core.tools import BaseTool  # noqa: E402
from pydantic import ConfigDict  # noqa: E402

from eventstore.boundary.contracts import (  # noqa: E402
    AgentReply,
    RunContext,
    ToolEnvelope,
    ToolSpec,
)

__all__ = ["THREAD_ID", "Boundary", "BoundaryTool", "as_tools", "run_id_of"]

#: The config key LangGraph names a conversation by; a run of canon by default.
THREAD_ID = "thread_id"


def run_id_of(config: RunnableConfig | None, run_id_key: str = THREAD_ID) -> str:
    """Return the run id a config names: ``config["configurable"][run_id_key]``.

    Raises:
        ValueError: the config names no run: a graph with a checkpointer is invoked
            with ``{"configurable": {"thread_id": ...}}``, which canon uses as the run.

    """
    value = ((config or {}).get("configurable") or {}).get(run_id_key)
    if value is None or value == "":
        raise ValueError(
            f"the config has no configurable {run_id_key!r}: canon takes the run id from it "
            f"(invoke with config={{'configurable': {{{run_id_key!r}: <run id>}}}})"
        )
    return str(value)


def envelope_of(run_id: str, tool_call_id: str | None, name: str, args: Any) -> ToolEnvelope:
    """The envelope of one LangChain ``ToolCall`` (its ``id``, ``name`` and ``args``).

    A call without an id (LangChain allows ``None``) is sent with an empty id, which the
    boundary refuses as INVALID_TOOL_CALL_ID: canon never generates one.
    """
    return ToolEnvelope(
        run_id=run_id,
        tool_call_id=tool_call_id or "",
        tool=name,
        arguments=args if args is not None else {},
    )


def tool_message(reply: AgentReply, tool_call_id: str | None, name: str) -> ToolMessage:
    """The ``ToolMessage`` that answers a call: JSON text, ``status="error"`` for an error."""
    return ToolMessage(
        content=reply_content(reply),
        tool_call_id=tool_call_id or "",
        name=name,
        status="error" if is_error(reply) else "success",
    )


def call_blocking(
    boundary: Boundary, run_id: str, tool_call_id: str | None, name: str, args: Any
) -> ToolMessage:
    """Run one ``ToolCall`` through ``boundary`` from a thread; see :func:`invoke_blocking`."""
    envelope = envelope_of(run_id, tool_call_id, name, args)
    return tool_message(invoke_blocking(boundary, RunContext(run_id), envelope), tool_call_id, name)


async def call_awaiting(
    boundary: Boundary, run_id: str, tool_call_id: str | None, name: str, args: Any
) -> ToolMessage:
    """Run one ``ToolCall`` through ``boundary`` from a loop; see :func:`invoke_awaiting`."""
    envelope = envelope_of(run_id, tool_call_id, name, args)
    reply = await invoke_awaiting(boundary, RunContext(run_id), envelope)
    return tool_message(reply, tool_call_id, name)


class BoundaryTool(BaseTool):
    """A LangChain tool that runs through a canon boundary; built by :func:`as_tools`.

    Attributes:
        boundary: the ``ToolBoundary`` or ``SyncBoundary`` whose ToolSpec of the same name
            runs the call.
        run_id_key: the ``configurable`` key that names the run.
        on_duplicate: what a call with a used (run, tool call id) gets: ``"replay"``
            (default), ``"refuse"``, or None for the boundary's own choice.

    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    boundary: Boundary
    run_id_key: str = THREAD_ID
    on_duplicate: OnDuplicate = "replay"

    def _to_args_and_kwargs(
        self, tool_input: str | dict[str, Any], tool_call_id: str | None
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        # The one place LangChain still knows the ToolCall's id: hand it to _run with the
        # arguments, as LangChain does for an InjectedToolCallId argument.
        args, kwargs = super()._to_args_and_kwargs(tool_input, tool_call_id)
        if args or tool_call_id is None:
            raise ValueError(
                f"tool {self.name!r} runs only from a model's ToolCall "
                "(tool.invoke({'type': 'tool_call', 'id': ..., 'name': ..., 'args': {...}})): "
                "canon keeps the call's id and never invents one"
            )
        return (), {"arguments": kwargs, "tool_call_id": tool_call_id}

    def _run(
        self, *, arguments: dict[str, Any], tool_call_id: str, config: RunnableConfig
    ) -> ToolMessage:
        run_id = run_id_of(config, self.run_id_key)
        boundary = with_duplicates(self.boundary, self.on_duplicate)
        return call_blocking(boundary, run_id, tool_call_id, self.name, arguments)

    async def _arun(
        self, *, arguments: dict[str, Any], tool_call_id: str, config: RunnableConfig
    ) -> ToolMessage:
        run_id = run_id_of(config, self.run_id_key)
        boundary = with_duplicates(self.boundary, self.on_duplicate)
        return await call_awaiting(boundary, run_id, tool_call_id, self.name, arguments)


def as_tools(
    boundary: Boundary,
    tools: Mapping[str, ToolSpec | ToolSchema],
    *,
    run_id_key: str = THREAD_ID,
    on_duplicate: OnDuplicate = "replay",
) -> list[BaseTool]:
    """One LangChain tool per tool, each running through ``boundary``.

    Args:
        boundary: a ``SyncBoundary`` (sync and async runs) or a ``ToolBoundary`` (async
            runs on its store's loop).
        tools: by tool name, what the model sees: the boundary's own ToolSpecs (their
            ``description`` and ``input_schema``, any object without one) or ToolSchemas
            (description and arguments' JSON Schema). The boundary's ToolSpec of that
            name runs the call; a name it does not know answers UNKNOWN_TOOL.
        run_id_key: the ``configurable`` key of the config that names the run.
        on_duplicate: what a call with a used (run, tool call id) gets: ``"replay"``
            (default: a graph's resume sends its calls again), ``"refuse"``, or None for
            the boundary's own choice.

    Raises:
        InvalidArgument: ``on_duplicate`` is not one of its values.

    """
    with_duplicates(boundary, on_duplicate)  # an unknown value fails here, not per call
    return [
        BoundaryTool(
            name=name,
            description=schema["description"],
            args_schema=schema["parameters"],
            boundary=boundary,
            run_id_key=run_id_key,
            on_duplicate=on_duplicate,
        )
        for name, schema in tool_schemas(tools).items()
    ]
