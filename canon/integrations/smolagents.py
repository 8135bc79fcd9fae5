"""smolagents tools that run through a canon boundary: :func:`as_tools` and :func:`keep_call_ids`.

``as_tools(boundary, TOOLS, run=...)`` gives one smolagents :class:`~smolagents.Tool` per
``ToolSpec``, its ``inputs`` taken from the spec's ``input_schema`` (each property as
written, ``nullable`` when it is not required) and its description from the spec, for a
``ToolCallingAgent``. A call goes to the boundary with the model's own tool call id and
the arguments smolagents validated; the tools are never run here.

Ids: smolagents hands a tool its arguments only, never the call's id. The id is in the
model's response, which the agent receives from its model: :func:`keep_call_ids` wraps
that model (``ToolCallingAgent(tools=..., model=keep_call_ids(model))``) and keeps the
tool calls of each response it returns, so each tool takes the id of the call with its
name and arguments (two identical calls of one turn take one id each). A call without
such an id is refused with INVALID_TOOL_CALL_ID, never recorded under a made-up one:
a model left unwrapped, a response whose calls smolagents parsed from text (it invents
``uuid4`` ids for them), or a ``CodeAgent``, whose tools are called from the code it
writes and have no call id at all.

Replies are the tool's observation, the text the model reads: the bounded result as JSON
text, or an error flagged as the OpenAI adapters flag theirs, ``Error: `` then the safe
error JSON (never valid JSON, so never taken for a result). An error is not raised:
smolagents has no per-call error result, and a tool that raises ends the whole step, so
the model would never see the results of the turn's other calls, which ran and are
recorded. A re-sent turn with the same ids replays the recorded replies when the
boundary is built with ``on_duplicate="replay"``.

Governed tools (a ``ToolSpec`` with ``approval``): smolagents has no human-in-the-loop of
its own, so a call waiting for an operator is answered with canon's pending payload as
the tool's output (``{"status": "awaiting_approval", ...}``: not run, not to be retried),
and so is an approved call whose run is paused. Once operators decided in canon,
:func:`resume_waiting` resumes the calls the agent's tools answered as waiting: an
approved call runs once, a denied or expired one is its error; it returns the text for
each decided call, to tell the model in the agent's next run
(``agent.run(..., reset=False)``), and keeps the calls still waiting for a later try.

smolagents runs its tools in threads, synchronously: give a
:class:`~eventstore.SyncBoundary` (an async ``ToolBoundary`` is a ``TypeError`` naming it,
raised before anything is recorded).
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Mapping
from contextvars import ContextVar
from typing import Any, Final

from canon.integrations._shared import (
    Boundary,
    ToolSchema,
    flagged_content,
    invoke_blocking,
    require,
    still_waiting,
    tool_schemas,
)
from eventstore.boundary.contracts import ApprovalPending, RunContext, ToolEnvelope, ToolSpec
from eventstore.sync import SyncBoundary
from machine.events import payload_digest
from machine.limits import Limits
from machine.requests import InvalidRequest, canonical_request

require("smolagents", "smolagents")

from smolagents import Tool  # noqa: E402  (only once the SDK is known to be there)
from smolagents.agents import MultiStepAgent  # noqa: E402
from smolagents.models import (  # noqa: E402
    ChatMessage,
    ChatMessageStreamDelta,
    agglomerate_stream_deltas,
)

__all__ = [
    "BoundaryTool",
    "CallIdModel",
    "as_tools",
    "keep_call_ids",
    "resume_waiting",
]

#: The limits a call's arguments are made canonical within, to match it to the model's.
_LIMITS: Final = Limits()
#: The JSON Schema types smolagents accepts as an input's ``type``.
_SMOLAGENTS_TYPES: Final = frozenset(
    {"string", "boolean", "integer", "number", "array", "object", "null", "any"}
)


class _TurnCalls:
    """The tool calls of one model response: (name, request digest, id), each taken once."""

    def __init__(self, calls: list[tuple[str, str | None, str]]) -> None:
        self._calls = calls
        self._lock = threading.Lock()  # a turn's tools run in parallel threads

    def take(self, name: str, digest: str | None) -> str | None:
        """The id of the first call not taken yet with this name and request, or None."""
        with self._lock:
            for index, (called, sent, call_id) in enumerate(self._calls):
                # Arguments too large to digest match only each other: the boundary
                # refuses the call for its size, under the model's own id.
                if called == name and sent == digest:
                    del self._calls[index]
                    return call_id
        return None


#: The tool calls of the response the agent is acting on, set by :class:`CallIdModel`
#: in the agent's context (which smolagents copies into each tool's thread).
_turn: ContextVar[_TurnCalls | None] = ContextVar("canon_smolagents_turn", default=None)


def _digest(arguments: Any) -> str | None:
    """The digest of a call's canonical request, to match a tool's call to the model's.

    None when the arguments are no JSON object within the default limits (the boundary
    decides what such a call gets).
    """
    try:
        request = canonical_request(
            arguments, max_depth=_LIMITS.json_depth, max_text_bytes=4 * _LIMITS.request_bytes
        )
    except (InvalidRequest, OverflowError):
        return None
    return payload_digest(request)


class CallIdModel:
    """A smolagents model that keeps each response's tool call ids for canon's tools.

    Everything is the wrapped model's; :meth:`generate` and :meth:`generate_stream` also
    note the tool calls of what they return (as the provider sent them, ids included),
    for the tools of the turn to find their ids. A response without tool calls (whose
    calls smolagents then parses from text, with ids of its own making) notes none.
    """

    def __init__(self, model: Any) -> None:
        self.model = model

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __call__(self, *args: Any, **kwargs: Any) -> ChatMessage:
        """As the wrapped model's ``__call__``: :meth:`generate`."""
        return self.generate(*args, **kwargs)

    def generate(self, *args: Any, **kwargs: Any) -> ChatMessage:
        """The wrapped model's response; its tool calls noted for canon's tools."""
        message: ChatMessage = self.model.generate(*args, **kwargs)
        self._note(message)
        return message

    def generate_stream(self, *args: Any, **kwargs: Any) -> Generator[ChatMessageStreamDelta]:
        """The wrapped model's stream; the assembled calls noted once it ends."""
        deltas: list[ChatMessageStreamDelta] = []
        for delta in self.model.generate_stream(*args, **kwargs):
            deltas.append(delta)
            yield delta
        self._note(agglomerate_stream_deltas(deltas))

    @staticmethod
    def _note(message: ChatMessage) -> None:
        calls = [
            (call.function.name, _digest(_arguments(call.function.arguments)), call.id)
            for call in message.tool_calls or ()
            if isinstance(call.id, str) and call.id
        ]
        _turn.set(_TurnCalls(calls))


def _arguments(arguments: Any) -> Any:
    """A call's arguments as sent: JSON text is decoded by the digest; none is ``{}``."""
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    return arguments


def keep_call_ids(model: Any) -> CallIdModel:
    """``model`` (any smolagents model), keeping its responses' tool call ids for canon.

    Give the agent this instead of the model: ``ToolCallingAgent(tools=...,
    model=keep_call_ids(model))``.
    """
    return model if isinstance(model, CallIdModel) else CallIdModel(model)


def _inputs(parameters: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The ``inputs`` smolagents wants, from an arguments' JSON Schema: each property as written."""
    required = set(parameters.get("required") or ())
    inputs: dict[str, dict[str, Any]] = {}
    for name, schema in (parameters.get("properties") or {}).items():
        entry = dict(schema) if isinstance(schema, Mapping) else {}
        kind = entry.get("type")
        if not (kind in _SMOLAGENTS_TYPES or isinstance(kind, list)):
            entry["type"] = "any"  # no type (or one smolagents cannot name): any value
        entry.setdefault("description", name)
        if name not in required:
            entry["nullable"] = True
        inputs[name] = entry
    return inputs


class BoundaryTool(Tool):  # type: ignore[misc]  # Tool is untyped (Any)
    """A smolagents tool whose calls run through a canon boundary; see :func:`as_tools`.

    Attributes:
        boundary: the ``SyncBoundary`` whose ToolSpec of the same name runs the call.
        run: the canon run of every call.
        waiting: the ids of this tool's calls answered as waiting for an operator, until
            :func:`resume_waiting` finds them decided.

    """

    skip_forward_signature_validation = True
    output_type = "string"

    def __init__(self, boundary: Boundary, name: str, schema: ToolSchema, run: RunContext) -> None:
        self.name = name
        self.description = schema["description"] or name
        self.inputs = _inputs(schema["parameters"])
        self.boundary = boundary
        self.run = run
        self.waiting: dict[str, None] = {}
        self._waiting_lock = threading.Lock()
        super().__init__()

    def forward(self, **arguments: Any) -> str:
        """Run the call through the boundary under the model's id; what the model reads.

        Returns:
            The bounded result as JSON text, the pending payload of a call waiting for
            an operator, or ``Error: `` and the safe error JSON (INVALID_TOOL_CALL_ID
            when the model's response gave this call no id).

        Raises:
            TypeError: the boundary is an async ``ToolBoundary``.

        """
        turn = _turn.get()
        call_id = turn.take(self.name, _digest(arguments)) if turn is not None else None
        envelope = ToolEnvelope(
            run_id=self.run.run_id,
            tool_call_id=call_id or "",  # no id: the boundary refuses it, nothing recorded
            tool=self.name,
            arguments=arguments,
        )
        reply = invoke_blocking(self.boundary, self.run, envelope)
        if isinstance(reply, ApprovalPending):
            with self._waiting_lock:
                self.waiting[reply.tool_call_id] = None
        # An error is an observation too (``Error: {...}``): raised, it would end the
        # whole step, and the model would never see the turn's other calls, which ran.
        return flagged_content(reply)


def as_tools(
    boundary: Boundary,
    tools: Mapping[str, ToolSpec | ToolSchema],
    *,
    run: RunContext | str,
) -> list[BoundaryTool]:
    """One smolagents tool per tool, each running through ``boundary`` in ``run``.

    Args:
        boundary: a ``SyncBoundary`` (smolagents calls tools from threads); its
            ``on_duplicate`` decides what a re-sent call gets (``"replay"``: its record).
        tools: the boundary's ``{name: ToolSpec}`` (each one's ``description`` and
            ``input_schema``), or ToolSchemas. Names must be Python identifiers, as
            smolagents requires of every tool.
        run: the canon run of the agent's calls.

    Raises:
        TypeError: ``boundary`` is an async ``ToolBoundary``.

    """
    if not isinstance(boundary, SyncBoundary):
        raise TypeError(
            "smolagents calls tools from threads: give as_tools a SyncBoundary "
            "(eventstore.SyncBoundary), not an async ToolBoundary"
        )
    ctx = run if isinstance(run, RunContext) else RunContext(run)
    return [
        BoundaryTool(boundary, name, schema, ctx) for name, schema in tool_schemas(tools).items()
    ]


def resume_waiting(agent: MultiStepAgent) -> dict[str, str]:
    """Resume the agent's calls that canon answered as waiting; the text of each decided one.

    For each call a canon tool of ``agent`` answered as waiting for an operator:
    approved, it runs once now (a call already run answers its recorded reply); denied or
    expired, its error. Each decided call is returned once, by its tool call id, as the
    text the model reads (a result's JSON, or ``Error: `` and the safe error JSON); calls
    still waiting (undecided, or their run paused) are kept for a later call. Tell the
    model in the agent's next run: ``agent.run(..., reset=False)``.
    """
    decided: dict[str, str] = {}
    for tool in agent.tools.values():
        if not isinstance(tool, BoundaryTool):
            continue
        with tool._waiting_lock:
            call_ids = list(tool.waiting)
        for call_id in call_ids:
            assert isinstance(tool.boundary, SyncBoundary)  # as_tools checked it
            reply = tool.boundary.resume(tool.run, call_id)
            if still_waiting(reply):  # undecided, or its run paused: not run yet
                continue
            decided[call_id] = flagged_content(reply)
            with tool._waiting_lock:
                tool.waiting.pop(call_id, None)
    return decided
