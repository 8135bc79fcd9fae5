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

Governed tools (a ``ToolSpec`` with ``approval``): canon records the call frozen and
answers that it waits for an operator. Inside a LangGraph graph (a node, or LangGraph's
``ToolNode``), the call then interrupts the graph with :func:`approval_request`'s
payload (LangGraph's ``interrupt``); when the graph is resumed, whatever the resume value
says, the call asks canon again: still waiting, it interrupts again; approved, the one
dispatch runs; denied or expired, the ``ToolMessage`` is the error (``status="error"``).
Outside a graph, the waiting reply is the ``ToolMessage`` (``{"status":
"awaiting_approval", ...}``), and calling the tool again later with the same call asks
canon again. Only canon's operators decide: a resume value never approves anything. A
paused run holds an approved call: it waits (interrupts) again, and runs once after the
unpause.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from canon.integrations._shared import (
    Boundary,
    OnDuplicateOrNone,
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
    ApprovalPending,
    RunContext,
    ToolEnvelope,
    ToolSpec,
)

__all__ = [
    "APPROVAL_INTERRUPT",
    "THREAD_ID",
    "Boundary",
    "BoundaryTool",
    "approval_request",
    "as_tools",
    "run_id_of",
]

#: The config key LangGraph names a conversation by; a run of canon by default.
THREAD_ID = "thread_id"

#: The ``type`` of the interrupt a governed call raises while it waits for an operator.
APPROVAL_INTERRUPT: Final = "tool_approval"


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


def approval_request(run_id: str, pending: ApprovalPending, name: str, args: Any) -> dict[str, Any]:
    """The value a governed call interrupts its graph with while it waits for an operator.

    ``{"type": "tool_approval", "run_id", "tool_call_id", "approval_id", "name",
    "args"}``: what a harness shows a reviewer, and the ids an operator decides with
    (``store.decide(run_id, tool_call_id, ...)``, ``canon approve RUN CALL``). It is
    information, not a question: the graph's resume value is never read as a decision.
    """
    return {
        "type": APPROVAL_INTERRUPT,
        "run_id": run_id,
        "tool_call_id": pending.tool_call_id,
        "approval_id": pending.approval_id,
        "name": name,
        "args": args,
    }


def graph_interrupt() -> Callable[[Any], Any] | None:
    """LangGraph's ``interrupt`` when this runs inside a graph's node, else None."""
    try:
        from langgraph.runtime import get_runtime
        from langgraph.types import interrupt
    except ImportError:  # the langchain extra alone: no graph can be running
        return None
    try:
        runtime = get_runtime()
    except RuntimeError:  # not even inside a runnable
        return None
    return interrupt if runtime is not None else None


def resumed_in_graph(run_id: str, pending: ApprovalPending, name: str, args: Any) -> bool:
    """Wait for an operator in LangGraph's way: interrupt the graph, ask canon on resume.

    Inside a graph's node, the first time this raises LangGraph's ``GraphInterrupt``
    (the node stops; the graph returns the :func:`approval_request`). When the graph is
    resumed, LangGraph re-runs the node from its start, so the call reaches this again
    and LangGraph's ``interrupt`` returns the resume value instead of raising: True then,
    whatever the value says, and the caller asks canon again. Outside a graph, False: the
    waiting reply is the answer.

    Raises:
        GraphInterrupt: inside a graph, the call waits and no resume value is left.

    """
    interrupt = graph_interrupt()
    if interrupt is None:
        return False
    interrupt(approval_request(run_id, pending, name, args))  # the value decides nothing
    return True


def call_blocking(
    boundary: Boundary, run_id: str, tool_call_id: str | None, name: str, args: Any
) -> ToolMessage:
    """Run one ``ToolCall`` through ``boundary`` from a thread; see :func:`invoke_blocking`.

    A governed call that waits interrupts its graph (:func:`resumed_in_graph`); each
    resume sends the same call again, which canon answers from its record.

    Raises:
        GraphInterrupt: inside a LangGraph graph, the call waits for an operator.

    """
    envelope = envelope_of(run_id, tool_call_id, name, args)
    ctx = RunContext(run_id)
    reply = invoke_blocking(boundary, ctx, envelope)
    while isinstance(reply, ApprovalPending) and resumed_in_graph(run_id, reply, name, args):
        reply = invoke_blocking(boundary, ctx, envelope)
    return tool_message(reply, tool_call_id, name)


async def call_awaiting(
    boundary: Boundary, run_id: str, tool_call_id: str | None, name: str, args: Any
) -> ToolMessage:
    """Run one ``ToolCall`` through ``boundary`` from a loop; see :func:`invoke_awaiting`.

    A governed call that waits interrupts its graph, as :func:`call_blocking`.

    Raises:
        GraphInterrupt: inside a LangGraph graph, the call waits for an operator.

    """
    envelope = envelope_of(run_id, tool_call_id, name, args)
    ctx = RunContext(run_id)
    reply = await invoke_awaiting(boundary, ctx, envelope)
    while isinstance(reply, ApprovalPending) and resumed_in_graph(run_id, reply, name, args):
        reply = await invoke_awaiting(boundary, ctx, envelope)
    return tool_message(reply, tool_call_id, name)


class BoundaryTool(BaseTool):
    """A LangChain tool that runs through a canon boundary; built by :func:`as_tools`.

    A governed call waiting for an operator interrupts the LangGraph graph the tool runs
    in, and asks canon again when the graph is resumed (see the module's docstring).

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
    on_duplicate: OnDuplicateOrNone = "replay"

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
    on_duplicate: OnDuplicateOrNone = "replay",
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
