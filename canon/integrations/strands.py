"""Strands Agents tools that run through a canon boundary: :func:`as_tools`.

``as_tools(boundary, TOOLS, run=...)`` gives one Strands
:class:`~strands.types.tools.AgentTool` per ``ToolSpec``, for an ``Agent``: the model sees
the spec's ``description`` and its ``input_schema`` as written. A call goes to the boundary
with Strands' ``toolUseId`` (the model's own tool call id, exactly as its provider sent it)
and the arguments the model sent; the tools are never run here. A call whose id is in no
response of the model's is refused with INVALID_TOOL_CALL_ID, never recorded under a
made-up one: a direct call (``agent.tool.search(q=...)``), whose id Strands invents
(Strands itself drops a model's call that came without an id).

Replies are Strands tool results under the call's ``toolUseId``: a result is one text
block holding the bounded result as JSON; an error is ``status: "error"`` with the safe
error JSON as its text, as Strands makes of a tool that raises (the agent goes on, and the
model reads it). A re-sent turn with the same ids replays the recorded replies when the
boundary is built with ``on_duplicate="replay"``.

Governed tools (a ``ToolSpec`` with ``approval``) wait in Strands' own human-in-the-loop
way, an interrupt: a call canon records as waiting for an operator stops the agent with an
``Interrupt`` named ``"canon_approval"`` (``result.stop_reason == "interrupt"``), whose
``reason`` names the run, the call, the approval, the tool and its arguments. Operators
decide in canon (``store.decide``, ``canon approve``, the console); the harness then
resumes the agent with :func:`approval_responses` (``agent(approval_responses(result))``),
which only makes the interrupted calls ask canon again, whatever a response says: still
waiting (or approved in a paused run), the agent stops with a new interrupt; approved, the
tool runs once; denied or expired, its error. The turn's other calls, which completed
before the interrupt, are kept by Strands and do not run again.

A ``SyncBoundary`` serves any event loop (``agent(...)`` runs the agent on a loop of its
own, in a thread); a ``ToolBoundary`` serves ``await agent.invoke_async(...)`` on its
store's loop.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, Final

from canon.integrations._shared import (
    Boundary,
    ToolSchema,
    invoke_awaiting,
    is_error,
    reply_content,
    reply_payload,
    require,
    tool_schemas,
)
from eventstore.boundary.contracts import ApprovalPending, RunContext, ToolEnvelope, ToolSpec

require("strands", "strands")

from strands.interrupt import (  # noqa: E402  (only once the SDK is known to be there)
    Interrupt,
    InterruptException,
)
from strands.types.tools import (  # noqa: E402
    AgentTool,
    ToolGenerator,
    ToolResult,
    ToolUse,
)
from strands.types.tools import ToolSpec as StrandsToolSpec  # noqa: E402

__all__ = ["APPROVAL_INTERRUPT", "BoundaryTool", "approval_responses", "as_tools"]

#: The ``name`` of the interrupt a governed call raises while it waits for an operator.
APPROVAL_INTERRUPT: Final = "canon_approval"
#: What :func:`approval_responses` answers (Strands needs a response; canon never reads it).
_ASK_CANON: Final = "ask canon"


class BoundaryTool(AgentTool):  # type: ignore[misc,unused-ignore]  # Any without the SDK
    """A Strands tool whose calls run through a canon boundary; see :func:`as_tools`.

    Attributes:
        boundary: the boundary whose ToolSpec of the same name runs the call.
        run: the canon run of every call.

    """

    def __init__(self, boundary: Boundary, name: str, schema: ToolSchema, run: RunContext) -> None:
        super().__init__()
        self.boundary = boundary
        self.run = run
        self._name = name
        self._spec: StrandsToolSpec = {
            "name": name,
            "description": schema["description"] or name,
            "inputSchema": {"json": dict(schema["parameters"])},
        }

    @property
    def tool_name(self) -> str:
        """The tool's name, as the boundary knows it."""
        return self._name

    @property
    def tool_spec(self) -> StrandsToolSpec:
        """What the model is told: the ToolSpec's description and arguments' JSON Schema."""
        return self._spec

    @property
    def tool_type(self) -> str:
        """``"canon"``: the call runs through a canon boundary."""
        return "canon"

    async def stream(
        self, tool_use: ToolUse, invocation_state: dict[str, Any], **kwargs: Any
    ) -> ToolGenerator:
        """Run the call through the boundary under Strands' ``toolUseId``.

        Yields:
            The ``ToolResult``: the bounded result, or the safe error with ``status:
            "error"``.

        Raises:
            InterruptException: Strands' own interrupt, named ``"canon_approval"``: the
                call is governed and waits for an operator; the agent stops until it is
                resumed, and the call then asks canon again.

        """
        call_id = _model_call_id(tool_use, invocation_state)
        arguments = tool_use.get("input")
        envelope = ToolEnvelope(
            run_id=self.run.run_id,
            # No id: the boundary refuses the call (INVALID_TOOL_CALL_ID), nothing recorded.
            tool_call_id=call_id,
            tool=self.tool_name,
            arguments={} if arguments is None or arguments == "" else arguments,
        )
        reply = await invoke_awaiting(self.boundary, self.run, envelope)
        if isinstance(reply, ApprovalPending):
            raise InterruptException(self._interrupt(reply, envelope))
        result: ToolResult = {
            "toolUseId": str(tool_use.get("toolUseId")),  # Strands pairs results by its id
            "status": "error" if is_error(reply) else "success",
            "content": [{"text": reply_content(reply)}],
        }
        yield result  # a tool's last event is its result

    def _interrupt(self, reply: ApprovalPending, envelope: ToolEnvelope) -> Interrupt:
        """The interrupt of one wait: each wait has its own id, as Strands keeps answered ones."""
        reason = {
            **reply_payload(reply),
            "run_id": self.run.run_id,
            "tool_call_id": reply.tool_call_id,
            "tool": envelope.tool,
            "arguments": envelope.arguments,
        }
        wait = uuid.uuid4().hex  # an interrupt's id is opaque to Strands; never a call id
        return Interrupt(
            id=f"canon:{reply.invocation_id}:{wait}", name=APPROVAL_INTERRUPT, reason=reason
        )


def _model_call_id(tool_use: ToolUse, invocation_state: Mapping[str, Any]) -> str:
    """The call's ``toolUseId`` when the model's latest response asked for it, else ``""``.

    Strands gives a call the model made the model's id; a direct call
    (``agent.tool.search(...)``) gets an id Strands made up (``tooluse_<name>_<random>``),
    which canon must never record: such a call is in no response of the model's.
    """
    call_id = tool_use.get("toolUseId")
    agent = invocation_state.get("agent")
    if not isinstance(call_id, str) or not call_id or agent is None:
        return ""
    for message in reversed(getattr(agent, "messages", None) or ()):
        if message.get("role") == "assistant":
            asked = (block.get("toolUse") for block in message.get("content") or ())
            return call_id if any(use and use.get("toolUseId") == call_id for use in asked) else ""
    return ""


def as_tools(
    boundary: Boundary,
    tools: Mapping[str, ToolSpec | ToolSchema],
    *,
    run: RunContext | str,
) -> list[BoundaryTool]:
    """One Strands tool per tool, each running through ``boundary`` in ``run``.

    Args:
        boundary: a ``SyncBoundary`` (any loop: ``agent(...)`` too) or a ``ToolBoundary``
            (``await agent.invoke_async(...)`` on its store's loop); its ``on_duplicate``
            decides what a re-sent call gets (``"replay"``: its record).
        tools: the boundary's ``{name: ToolSpec}`` (each one's ``description`` and
            ``input_schema``), or ToolSchemas.
        run: the canon run of the agent's calls.

    """
    ctx = run if isinstance(run, RunContext) else RunContext(run)
    return [
        BoundaryTool(boundary, name, schema, ctx) for name, schema in tool_schemas(tools).items()
    ]


def approval_responses(result: Any) -> list[dict[str, Any]]:
    """The prompt that resumes an agent its canon calls stopped: one response per interrupt.

    ``result`` is the ``AgentResult`` the agent stopped with (``stop_reason ==
    "interrupt"``). Each ``"canon_approval"`` interrupt is answered, so the calls that
    waited ask canon again: canon's operators decide, never this response. Interrupts of
    other hooks or tools are not answered here; add their responses to the list.
    """
    return [
        {"interruptResponse": {"interruptId": interrupt.id, "response": _ASK_CANON}}
        for interrupt in result.interrupts or ()
        if interrupt.name == APPROVAL_INTERRUPT
    ]
