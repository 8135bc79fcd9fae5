"""CrewAI tools that run through a canon boundary: :func:`as_tools` and :func:`resume_waiting`.

``as_tools(boundary, TOOLS, run=...)`` gives one CrewAI :class:`~crewai.tools.BaseTool` per
``ToolSpec``, for an ``Agent``: the model sees the spec's ``description`` and its
``input_schema`` (which CrewAI makes strict, as it does every tool's: every property
required, no others). A call goes to the boundary with the model's own tool call id and
the arguments the model sent; the tools are never run here.

Ids: CrewAI hands a tool, and its ``before_tool_call`` hooks, the arguments only, never the
call's id. The id is in the model's response, which CrewAI appends to the agent's messages
(the assistant message's ``tool_calls``) before it runs the turn's tools: a
``before_tool_call`` hook that :func:`as_tools` registers once reads it there and hands it
to the tool (each call takes the id of the call with its name and arguments; two identical
calls of one turn take one id each). A call without such an id is refused with
INVALID_TOOL_CALL_ID, never recorded under a made-up one: a call outside an agent
(``tool.run(...)`` by hand), a call whose arguments CrewAI changed, or a model's call that
came without an id, which CrewAI gives one of its own making (``call_<digits>``).

Replies are the tool's output, the text the model reads: the bounded result as JSON text,
or an error flagged as the OpenAI adapters flag theirs, ``Error: `` then the safe error
JSON (never valid JSON, so never taken for a result). A re-sent turn with the same ids
replays the recorded replies when the boundary is built with ``on_duplicate="replay"``.

Governed tools (a ``ToolSpec`` with ``approval``): CrewAI has no human-in-the-loop for a
tool call, so a call waiting for an operator is answered with canon's pending payload as
the tool's output (``{"status": "awaiting_approval", ...}``: not run, not to be retried),
and so is an approved call whose run is paused. Once operators decided in canon,
:func:`resume_waiting` resumes the calls the tools answered as waiting: an approved call
runs once, a denied or expired one is its error; it returns the text of each decided
call, to give the crew in its next kickoff, and keeps the calls still waiting.

CrewAI runs tools in threads, synchronously (``kickoff_async`` too): give a
:class:`~eventstore.SyncBoundary` (an async ``ToolBoundary`` is a ``TypeError`` naming it,
raised before anything is recorded).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from typing import Any, Final

from canon.integrations._shared import (
    Boundary,
    ToolSchema,
    TurnIds,
    arguments_digest,
    flagged_content,
    invoke_blocking,
    require,
    still_waiting,
    tool_schemas,
)
from eventstore.boundary.contracts import ApprovalPending, RunContext, ToolEnvelope, ToolSpec
from eventstore.sync import SyncBoundary

require("crewai", "crewai")

from crewai.hooks import (  # noqa: E402  (only once the SDK is there)
    get_before_tool_call_hooks,
    register_before_tool_call_hook,
)
from crewai.tools import BaseTool  # noqa: E402
from pydantic import BaseModel, ConfigDict, PrivateAttr  # noqa: E402

__all__ = ["BoundaryTool", "as_tools", "resume_waiting"]

#: The ids CrewAI makes up for a call that came without one (``call_<id(object)>``).
_MADE_UP: Final = re.compile(r"call_\d+")


_ids = TurnIds()

#: The model's id of the call the hook is letting run, for the tool (same thread).
_call: ContextVar[tuple[str, str | None, str] | None] = ContextVar(
    "canon_crewai_call", default=None
)


def _turn_calls(messages: Iterable[Any]) -> list[dict[str, Any]]:
    """The tool calls of the latest assistant message of the agent's messages."""
    for message in reversed(list(messages or ())):
        if isinstance(message, dict) and message.get("role") == "assistant":
            calls = message.get("tool_calls") or []
            return [call for call in calls if isinstance(call, dict)]
    return []


def _note_call_id(context: Any) -> None:
    """CrewAI's ``before_tool_call`` hook: find the model's id of a canon tool's call.

    Notes the id for the tool that runs next in this thread (a canon tool checks the
    name and arguments); never blocks a call (returns None).
    """
    name = context.tool_name
    digest = arguments_digest(dict(context.tool_input or {}))
    executor = getattr(getattr(context, "agent", None), "agent_executor", None)
    messages = getattr(executor, "messages", None) or []
    candidates = [
        str(call.get("id"))
        for call in _turn_calls(messages)
        if (call.get("function") or {}).get("name") == name
        and call.get("id")
        and not _MADE_UP.fullmatch(str(call.get("id")))
        and arguments_digest((call.get("function") or {}).get("arguments")) == digest
    ]
    _call.set((name, digest, _ids.take(candidates)) if candidates else None)


_hook_lock = threading.Lock()


def _register_hook() -> None:
    """Register :func:`_note_call_id` once, before any agent snapshots CrewAI's hooks.

    Asked of CrewAI's own list, so hooks cleared since (``clear_before_tool_call_hooks``)
    get it back.
    """
    with _hook_lock:
        if _note_call_id not in get_before_tool_call_hooks():
            register_before_tool_call_hook(_note_call_id)


def _schema_model(name: str, parameters: Mapping[str, Any]) -> type[BaseModel]:
    """A pydantic model CrewAI reads the tool's JSON Schema from, accepting any arguments.

    CrewAI wants a model class; this one has no fields of its own (CrewAI then passes the
    model's arguments through as sent) and answers the ToolSpec's schema as its own.
    """
    schema = dict(parameters)

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="allow")

        @classmethod
        def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
            copy: dict[str, Any] = json.loads(json.dumps(schema))  # CrewAI edits it in place
            return copy

    Arguments.__name__ = Arguments.__qualname__ = f"{name}_arguments"
    return Arguments


class BoundaryTool(BaseTool):  # type: ignore[misc,unused-ignore]  # Any without the SDK
    """A CrewAI tool whose calls run through a canon boundary; see :func:`as_tools`.

    Attributes:
        waiting: the ids of this tool's calls answered as waiting for an operator, until
            :func:`resume_waiting` finds them decided.

    """

    _boundary: Any = PrivateAttr()
    _run_context: Any = PrivateAttr()
    _waiting: dict[str, None] = PrivateAttr(default_factory=dict)
    _waiting_lock: Any = PrivateAttr(default_factory=threading.Lock)

    @property
    def boundary(self) -> SyncBoundary:
        """The boundary whose ToolSpec of the same name runs the call."""
        boundary: SyncBoundary = self._boundary
        return boundary

    @property
    def canon_run(self) -> RunContext:
        """The canon run of every call."""
        run: RunContext = self._run_context
        return run

    @property
    def waiting(self) -> list[str]:
        """The ids of this tool's calls still answered as waiting."""
        with self._waiting_lock:
            return list(self._waiting)

    def _run(self, **arguments: Any) -> str:
        """Run the call through the boundary under the model's id; what the model reads.

        Returns:
            The bounded result as JSON text, the pending payload of a call waiting for
            an operator, or ``Error: `` and the safe error JSON (INVALID_TOOL_CALL_ID
            when the model's response gave this call no id).

        """
        noted = _call.get()
        _call.set(None)  # one call per note: a later call by hand finds none
        call_id = ""
        if noted is not None and noted[0] == self.name and noted[1] == arguments_digest(arguments):
            call_id = noted[2]
        envelope = ToolEnvelope(
            run_id=self.canon_run.run_id, tool_call_id=call_id, tool=self.name, arguments=arguments
        )
        reply = invoke_blocking(self.boundary, self.canon_run, envelope)
        if isinstance(reply, ApprovalPending):
            with self._waiting_lock:
                self._waiting[reply.tool_call_id] = None
        # An error is the tool's output too (``Error: {...}``): the model reads it.
        return flagged_content(reply)

    def _settle(self, call_id: str) -> None:
        with self._waiting_lock:
            self._waiting.pop(call_id, None)


def as_tools(
    boundary: Boundary,
    tools: Mapping[str, ToolSpec | ToolSchema],
    *,
    run: RunContext | str,
) -> list[BoundaryTool]:
    """One CrewAI tool per tool, each running through ``boundary`` in ``run``.

    Also registers, once, the ``before_tool_call`` hook that finds each call's id in the
    model's response: call it before the agents are built (CrewAI snapshots its hooks).

    Args:
        boundary: a ``SyncBoundary`` (CrewAI calls tools from threads); its
            ``on_duplicate`` decides what a re-sent call gets (``"replay"``: its record).
        tools: the boundary's ``{name: ToolSpec}`` (each one's ``description`` and
            ``input_schema``), or ToolSchemas. Names must be what CrewAI keeps of a name
            (lower case, letters, digits and ``_``).
        run: the canon run of the agent's calls.

    Raises:
        TypeError: ``boundary`` is an async ``ToolBoundary``.

    """
    if not isinstance(boundary, SyncBoundary):
        raise TypeError(
            "CrewAI calls tools from threads: give as_tools a SyncBoundary "
            "(eventstore.SyncBoundary), not an async ToolBoundary"
        )
    _register_hook()
    ctx = run if isinstance(run, RunContext) else RunContext(run)
    built: list[BoundaryTool] = []
    for name, schema in tool_schemas(tools).items():
        tool = BoundaryTool(
            name=name,
            description=schema["description"] or name,
            args_schema=_schema_model(name, schema["parameters"]),
        )
        tool._boundary = boundary
        tool._run_context = ctx
        built.append(tool)
    return built


def resume_waiting(tools: Iterable[Any]) -> dict[str, str]:
    """Resume the calls that canon's tools answered as waiting; the text of each decided one.

    For each call a tool of ``tools`` (an agent's ``tools``, or what :func:`as_tools`
    returned) answered as waiting for an operator: approved, it runs once now (a call
    already run answers its recorded reply); denied or expired, its error. Each decided
    call is returned once, by its tool call id, as the text the model reads; calls still
    waiting (undecided, or their run paused) are kept for a later call. Give the texts to
    the crew's next kickoff (its inputs, or the next task's description).
    """
    decided: dict[str, str] = {}
    for tool in tools:
        if not isinstance(tool, BoundaryTool):
            continue
        for call_id in tool.waiting:
            reply = tool.boundary.resume(tool.canon_run, call_id)
            if still_waiting(reply):  # undecided, or its run paused: not run yet
                continue
            decided[call_id] = flagged_content(reply)
            tool._settle(call_id)
    return decided
