"""LlamaIndex agent tools that run through a canon boundary: :func:`as_tools`.

``as_tools(boundary, TOOLS, run=...)`` gives one LlamaIndex
:class:`~llama_index.core.tools.FunctionTool` per ``ToolSpec`` for a ``FunctionAgent``
(or any agent workflow): the model sees the spec's ``description`` and its
``input_schema`` as written. A call goes to the boundary with the model's own tool call
id and the arguments the model sent; the tools are never run here.

Ids: LlamaIndex hands a tool its arguments (and, if it asks, the workflow's ``Context``),
never the call's id. The id is in the model's response the agent received, which the
agent keeps in its scratchpad (``ctx.store``, ``scratchpad_key``) while the turn's tools
run: each tool takes the id of the ``ToolCallBlock`` with its name and arguments (two
identical calls of one turn take one id each). A call without such an id is refused with
INVALID_TOOL_CALL_ID, never recorded under a made-up one: a tool called outside an agent
workflow, or from an LLM whose response carries no call id.

Replies follow LlamaIndex's conventions: a result is a ``ToolOutput`` whose content is
the bounded result as JSON text; an error is a ``ToolOutput`` with ``is_error=True`` and
the safe error JSON as content, as LlamaIndex makes of a tool that raises; the agent goes
on. A re-sent turn with the same ids replays the recorded replies when the boundary is
built with ``on_duplicate="replay"``.

Governed tools (a ``ToolSpec`` with ``approval``) wait in LlamaIndex's own
human-in-the-loop way: a call canon records as waiting for an operator waits for a
``HumanResponseEvent`` (``ctx.wait_for_event``), announcing itself with an
:class:`ApprovalRequired` event (an ``InputRequiredEvent`` naming the run, the call, the
approval, the tool and its arguments) on the workflow's event stream. Operators decide
in canon (``store.decide``, ``canon approve``, the console); the harness then sends the
event's :meth:`ApprovalRequired.response` (a ``HumanResponseEvent`` naming the call and
the wait), which is only a nudge to ask canon again, whatever it says: still waiting
(or approved in a paused run), a new ``ApprovalRequired`` is emitted and the call
waits on; approved, the tool runs once; denied or expired, the error output.

A ``SyncBoundary`` serves any event loop (an agent run under ``asyncio.run`` in a
thread, ...); a ``ToolBoundary`` serves agents on its store's loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from canon.integrations._shared import (
    Boundary,
    ToolSchema,
    TurnIds,
    arguments_digest,
    invoke_awaiting,
    is_error,
    reply_content,
    reply_payload,
    require,
    tool_schemas,
)
from eventstore.boundary.contracts import (
    AgentReply,
    ApprovalPending,
    RunContext,
    ToolEnvelope,
    ToolSpec,
)

require("llama_index.core", "llamaindex")

from llama_index.core.base.llms.types import ChatMessage, ToolCallBlock  # noqa: E402
from llama_index.core.tools import FunctionTool, ToolMetadata, ToolOutput  # noqa: E402
from llama_index.core.workflow import (  # noqa: E402
    Context,
    HumanResponseEvent,
    InputRequiredEvent,
)

__all__ = ["APPROVAL_REQUIRED", "ApprovalRequired", "BoundaryTool", "as_tools"]

#: The ``kind`` of the event a governed call announces while it waits for an operator.
APPROVAL_REQUIRED: Final = "tool_approval"
#: Where LlamaIndex's agents keep the turn's messages while its tools run.
SCRATCHPAD: Final = "scratchpad"


class ApprovalRequired(InputRequiredEvent):
    """A governed call waits for canon's operator: an ``InputRequiredEvent`` to show them.

    Answer it, once operators decided in canon, with :meth:`response`, the
    ``HumanResponseEvent`` that names this wait (``tool_call_id`` and ``wait``): it makes
    the call ask canon again and decides nothing.

    Attributes:
        kind: ``"tool_approval"``.
        run_id: the canon run.
        tool_call_id: the model's id of the call (what an operator decides).
        approval_id: the approval waiting for a decision.
        tool: the tool's name.
        arguments: the arguments the model sent.
        wait: how many times this call waited before (0 the first time): a response
            answers one wait.

    """

    kind: str = APPROVAL_REQUIRED
    run_id: str
    tool_call_id: str
    approval_id: str
    tool: str
    arguments: dict[str, Any]
    wait: int = 0

    def response(self, text: str = "") -> HumanResponseEvent:
        """The ``HumanResponseEvent`` that answers this wait: the call asks canon again.

        Send it with ``handler.ctx.send_event``; ``text`` is not read (canon decides).
        """
        # A workflow Event's fields are free: ``response`` by convention, and this wait.
        fields: dict[str, Any] = {
            "response": text,
            "tool_call_id": self.tool_call_id,
            "wait": self.wait,
        }
        return HumanResponseEvent(**fields)


@dataclass
class _Metadata(ToolMetadata):
    """A tool's metadata whose parameters are its ToolSpec's JSON Schema, as written."""

    parameters: dict[str, Any] = field(default_factory=dict)

    def get_parameters_dict(self) -> dict[str, Any]:
        """The arguments' JSON Schema the model is shown."""
        return dict(self.parameters)


_ids = TurnIds()


def _turn_calls(scratchpad: Any) -> list[ToolCallBlock]:
    """The tool call blocks of the latest assistant message of the agent's scratchpad."""
    for message in reversed(list(scratchpad or ())):
        if isinstance(message, ChatMessage) and message.role.value == "assistant":
            return [block for block in message.blocks if isinstance(block, ToolCallBlock)]
    return []


async def _call_id(ctx: Context | None, scratchpad_key: str, name: str, arguments: Any) -> str:
    """The model's id of this call, from the agent's scratchpad ("" when there is none)."""
    if ctx is None:
        return ""
    digest = arguments_digest(arguments)
    calls = _turn_calls(await ctx.store.get(scratchpad_key, default=[]))
    candidates = [
        block.tool_call_id
        for block in calls
        if block.tool_name == name
        and block.tool_call_id
        and arguments_digest(block.tool_kwargs) == digest
    ]
    return _ids.take(candidates) if candidates else ""


class BoundaryTool(FunctionTool):
    """A LlamaIndex tool whose calls run through a canon boundary; see :func:`as_tools`.

    Attributes:
        boundary: the boundary whose ToolSpec of the same name runs the call.
        run: the canon run of every call.
        scratchpad_key: where the agent keeps the turn's messages (its ``scratchpad_key``).

    """

    def __init__(
        self,
        boundary: Boundary,
        name: str,
        schema: ToolSchema,
        run: RunContext,
        scratchpad_key: str = SCRATCHPAD,
    ) -> None:
        metadata = _Metadata(
            description=schema["description"] or name,
            name=name,
            fn_schema=None,
            parameters=dict(schema["parameters"]),
        )
        super().__init__(async_fn=self._never_called, metadata=metadata)
        # The agent hands the workflow's Context to a tool that asks for it.
        self.requires_context = True
        self.ctx_param_name = "ctx"
        self.boundary = boundary
        self.run = run
        self.scratchpad_key = scratchpad_key

    @staticmethod
    async def _never_called(**arguments: Any) -> None:
        raise AssertionError("BoundaryTool answers in acall")  # pragma: no cover

    def call(self, *args: Any, **kwargs: Any) -> ToolOutput:
        """Not supported: LlamaIndex's agents call ``acall``, inside a workflow.

        Raises:
            TypeError: always; a call needs the workflow's Context for its id.

        """
        raise TypeError(
            f"tool {self.metadata.name!r} runs through canon from an agent workflow "
            "(acall with the workflow's Context), where the model's call id is known"
        )

    async def acall(self, *args: Any, ctx: Context | None = None, **arguments: Any) -> ToolOutput:
        """Run the call through the boundary under the model's id.

        Returns:
            The ``ToolOutput``: the bounded result as JSON text, or ``is_error=True``
            with the safe error JSON (INVALID_TOOL_CALL_ID when no model id is known).

        Raises:
            WaitingForEvent: LlamaIndex's own pause (from ``ctx.wait_for_event``): the
                call is governed and waits for an operator; the step is replayed when
                a ``HumanResponseEvent`` for it arrives.

        """
        name = self.metadata.get_name()
        call_id = await _call_id(ctx, self.scratchpad_key, name, arguments)
        envelope = ToolEnvelope(
            run_id=self.run.run_id, tool_call_id=call_id, tool=name, arguments=arguments
        )
        reply = await invoke_awaiting(self.boundary, self.run, envelope)
        if isinstance(reply, ApprovalPending) and ctx is not None:  # ctx: it has an id
            reply = await self._wait(ctx, reply, envelope, arguments)
        return self._output(reply, arguments)

    async def _wait(
        self,
        ctx: Context,
        reply: ApprovalPending,
        envelope: ToolEnvelope,
        arguments: Mapping[str, Any],
    ) -> AgentReply:
        """Wait in LlamaIndex's way until canon's answer is no longer "waiting".

        LlamaIndex replays the whole step when a response arrives, and a wait it answered
        is gone afterwards: so each wait has its own id, numbered by the responses this
        call consumed (kept in the workflow's state, which replays and saved contexts
        keep), and every response only makes the call ask canon again.
        """
        consumed = f"canon_approval_waits_{reply.invocation_id}"
        waits: int = await ctx.store.get(consumed, default=0)
        answer: AgentReply = reply
        while isinstance(answer, ApprovalPending):
            await ctx.wait_for_event(
                HumanResponseEvent,
                waiter_event=ApprovalRequired(
                    run_id=self.run.run_id,
                    tool_call_id=answer.tool_call_id,
                    approval_id=answer.approval_id,
                    tool=envelope.tool,
                    arguments=dict(arguments),
                    wait=waits,
                ),
                waiter_id=f"canon-approval:{answer.invocation_id}:{waits}",
                # A wait LlamaIndex answered stays listed until the step completes: a
                # response names its wait, so it never resumes an older one too.
                requirements={"tool_call_id": answer.tool_call_id, "wait": waits},
                timeout=None,  # operators take their time; the approval's own expiry ends it
            )
            waits += 1
            await ctx.store.set(consumed, waits)
            answer = await invoke_awaiting(self.boundary, self.run, envelope)
        return answer

    def _output(self, reply: AgentReply, arguments: Mapping[str, Any]) -> ToolOutput:
        return ToolOutput(
            content=reply_content(reply),
            tool_name=self.metadata.get_name(),
            raw_input={"kwargs": dict(arguments)},
            raw_output=reply_payload(reply),
            is_error=is_error(reply),
        )


def as_tools(
    boundary: Boundary,
    tools: Mapping[str, ToolSpec | ToolSchema],
    *,
    run: RunContext | str,
    scratchpad_key: str = SCRATCHPAD,
) -> list[BoundaryTool]:
    """One LlamaIndex tool per tool, each running through ``boundary`` in ``run``.

    Args:
        boundary: a ``SyncBoundary`` (any loop) or a ``ToolBoundary`` (its store's
            loop); its ``on_duplicate`` decides what a re-sent call gets.
        tools: the boundary's ``{name: ToolSpec}`` (each one's ``description`` and
            ``input_schema``), or ToolSchemas.
        run: the canon run of the agent's calls.
        scratchpad_key: the agent's ``scratchpad_key`` (LlamaIndex's default unless you
            changed it), where the turn's tool calls and their ids are read.

    """
    ctx = run if isinstance(run, RunContext) else RunContext(run)
    return [
        BoundaryTool(boundary, name, schema, ctx, scratchpad_key)
        for name, schema in tool_schemas(tools).items()
    ]
