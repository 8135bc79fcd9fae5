"""Google ADK tools that run through a canon boundary: :func:`as_tools`.

``as_tools(boundary, TOOLS, run=...)`` gives one ADK :class:`~google.adk.tools.BaseTool`
per ``ToolSpec``, for an ``LlmAgent``: the model sees the spec's ``description`` and its
``input_schema`` as written (the declaration's ``parameters_json_schema``). A call goes to
the boundary with ``tool_context.function_call_id``, the id of the model's function call
(Gemini 3 and later send one with each call), and the arguments the model sent; the tools
are never run here.

Ids: ADK gives a function call that came without an id (Gemini 2.x sends none) an id of
its own making, ``adk-<uuid>``, and strips it again before the model sees the turn. canon
never records a call under such an id: the model's response carries no id for the call
(ADK's model hooks do not see the response's id either), so the call is refused with
INVALID_TOOL_CALL_ID and the model reads that error. Use a model that sends call ids.

Replies follow ADK's conventions: a result is ``{"result": <bounded result>}``, an error
``{"error": <safe error JSON text>}`` (the key ADK's own failed calls use), and the agent
goes on. A re-sent turn with the same ids replays the recorded replies when the boundary
is built with ``on_duplicate="replay"``.

Governed tools (a ``ToolSpec`` with ``approval``) wait in ADK's own human-in-the-loop way,
tool confirmation: a call canon records as waiting for an operator asks for a confirmation
(``tool_context.request_confirmation``), whose payload names the run, the call and canon's
approval; ADK ends the invocation with an ``adk_request_confirmation`` function call.
Operators decide in canon (``store.decide``, ``canon approve``, the console);
:func:`confirmations` is None until canon decided every call the requests wait on (and a
paused run is unpaused), then the user message that answers them: sent to the runner, it
makes each call ask canon: approved, the tool runs once; denied or expired, its error.
ADK's ``confirmed`` decides nothing: a confirmation sent by other means only makes the call
ask canon too, and a call still waiting then answers canon's pending payload (ADK re-runs
a confirmed tool once, and cannot ask again).

A ``SyncBoundary`` serves any event loop (``runner.run(...)`` runs the agent on a loop of
its own, in a thread); a ``ToolBoundary`` serves ``runner.run_async(...)`` on its store's
loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any, Final

from canon.integrations._shared import (
    Boundary,
    ToolSchema,
    invoke_awaiting,
    is_error,
    read_record,
    reply_content,
    reply_payload,
    require,
    tool_schemas,
)
from eventstore.boundary.contracts import ApprovalPending, RunContext, ToolEnvelope, ToolSpec
from eventstore.sync import SyncBoundary
from machine.codes import Stage

require("google.adk", "google_adk")

from google.adk.tools.base_tool import BaseTool  # noqa: E402  (only once the SDK is there)
from google.adk.tools.tool_confirmation import ToolConfirmation  # noqa: E402
from google.adk.tools.tool_context import ToolContext  # noqa: E402
from google.genai import types  # noqa: E402

__all__ = [
    "APPROVAL_KEY",
    "MADE_UP_ID_PREFIX",
    "REQUEST_CONFIRMATION",
    "BoundaryTool",
    "as_tools",
    "awaiting_canon",
    "confirmations",
]

#: How the ids ADK makes up for calls that came without one begin (never recorded).
MADE_UP_ID_PREFIX: Final = "adk-"
#: The name of the function call by which ADK asks the client for a tool confirmation.
REQUEST_CONFIRMATION: Final = "adk_request_confirmation"
#: The key of a confirmation's payload that canon's confirmation requests carry.
APPROVAL_KEY: Final = "canon_approval"


class BoundaryTool(BaseTool):  # type: ignore[misc,unused-ignore]  # Any without the SDK
    """An ADK tool whose calls run through a canon boundary; see :func:`as_tools`.

    Attributes:
        boundary: the boundary whose ToolSpec of the same name runs the call.
        run: the canon run of every call.

    """

    def __init__(self, boundary: Boundary, name: str, schema: ToolSchema, run: RunContext) -> None:
        super().__init__(name=name, description=schema["description"] or name)
        self.boundary = boundary
        self.run = run
        self._parameters = dict(schema["parameters"])

    def _get_declaration(self) -> types.FunctionDeclaration:
        """What the model is told: the ToolSpec's description and arguments' JSON Schema."""
        return types.FunctionDeclaration(
            name=self.name,
            description=self.description,
            parameters_json_schema=self._parameters,
        )

    async def run_async(self, *, args: dict[str, Any], tool_context: ToolContext) -> Any:
        """Run the call through the boundary under the model's function call id.

        Returns:
            ``{"result": ...}``, or ``{"error": <safe error JSON>}`` (INVALID_TOOL_CALL_ID
            for an id ADK made up). A governed call that waits for an operator asks for
            ADK's tool confirmation and answers canon's pending payload meanwhile.

        """
        call_id = tool_context.function_call_id
        if not isinstance(call_id, str) or call_id.startswith(MADE_UP_ID_PREFIX):
            call_id = ""  # no id of the model's: refused, nothing recorded
        envelope = ToolEnvelope(
            run_id=self.run.run_id, tool_call_id=call_id, tool=self.name, arguments=args or {}
        )
        reply = await invoke_awaiting(self.boundary, self.run, envelope)
        if isinstance(reply, ApprovalPending) and tool_context.tool_confirmation is not None:
            # ADK re-ran the call on a confirmation sent before canon decided: it cannot ask
            # again, so the model reads that the call waits (not run, not to be retried).
            return {"result": reply_payload(reply)}
        if isinstance(reply, ApprovalPending):
            tool_context.request_confirmation(
                hint=f"The call of {self.name} waits for an operator's decision in canon.",
                payload={APPROVAL_KEY: {**reply_payload(reply), "run_id": self.run.run_id}},
            )
            # The invocation ends here, waiting for the confirmation: as ADK's own tools do.
            tool_context.actions.skip_summarization = True
            return {"result": reply_payload(reply)}
        if is_error(reply):
            return {"error": reply_content(reply)}
        return {"result": reply_payload(reply)}


def as_tools(
    boundary: Boundary,
    tools: Mapping[str, ToolSpec | ToolSchema],
    *,
    run: RunContext | str,
) -> list[BoundaryTool]:
    """One ADK tool per tool, each running through ``boundary`` in ``run``.

    Args:
        boundary: a ``SyncBoundary`` (any loop: ``runner.run(...)`` too) or a
            ``ToolBoundary`` (``runner.run_async(...)`` on its store's loop); its
            ``on_duplicate`` decides what a re-sent call gets (``"replay"``: its record).
        tools: the boundary's ``{name: ToolSpec}`` (each one's ``description`` and
            ``input_schema``), or ToolSchemas.
        run: the canon run of the agent's calls.

    """
    ctx = run if isinstance(run, RunContext) else RunContext(run)
    return [
        BoundaryTool(boundary, name, schema, ctx) for name, schema in tool_schemas(tools).items()
    ]


def _requests(events: Iterable[Any]) -> list[types.FunctionCall]:
    """The confirmation requests of canon's tools among ``events``, in order."""
    found: list[types.FunctionCall] = []
    for event in events:
        for call in event.get_function_calls() if event.content else ():
            confirmation = (call.args or {}).get("toolConfirmation") or {}
            payload = confirmation.get("payload") if isinstance(confirmation, dict) else None
            ours = isinstance(payload, dict) and APPROVAL_KEY in payload
            if call.name == REQUEST_CONFIRMATION and ours:
                found.append(call)
    return found


def awaiting_canon(events: Iterable[Any]) -> bool:
    """Whether ``events`` ask for the confirmation of a canon call (see :func:`confirmations`)."""
    return bool(_requests(events))


async def _can_go_on(boundary: Boundary, call: types.FunctionCall) -> bool:
    """Whether canon decided the call a confirmation request waits on, and it may proceed.

    Undecided, it waits; approved but not yet run in a paused run (or namespace), it waits
    for the unpause. Decided otherwise (denied, expired, run), the call answers that.
    """
    args = call.args or {}
    original = args.get("originalFunctionCall") or {}
    told = args["toolConfirmation"]["payload"][APPROVAL_KEY]
    run_id, call_id = told.get("run_id"), original.get("id")
    if not isinstance(run_id, str) or not isinstance(call_id, str):
        return True  # not a call canon recorded: let the tool answer it
    record = await read_record(boundary, run_id, call_id)
    if record is None or record.state.stage is Stage.AWAITING_APPROVAL:
        return record is None
    if record.state.stage is not Stage.APPROVED:
        return True
    return not await _paused(boundary, run_id)


async def _paused(boundary: Boundary, run_id: str) -> bool:
    """Whether the run, or the whole namespace, is paused."""
    if isinstance(boundary, SyncBoundary):
        store = boundary.store
        info = await asyncio.to_thread(store.run_info, run_id)
        return bool(info is not None and info.paused) or await asyncio.to_thread(store.is_paused)
    info = await boundary.store.run_info(run_id)
    return bool(info is not None and info.paused) or await boundary.store.is_paused()


async def confirmations(boundary: Boundary, events: Iterable[Any]) -> types.Content | None:
    """The user message that answers canon's confirmation requests, once canon decided.

    ``events`` are the events of the invocation that ended waiting (what
    ``runner.run_async`` yielded). None while a call they wait on is undecided in canon (or
    approved in a paused run): ask again later. Then each request of a canon tool is
    answered, so its call asks canon: approved, it runs once; denied or expired, the model
    reads the error. Canon's operators decide, never the confirmation's ``confirmed``.
    Requests of other tools are not answered here (add their parts); None when no canon
    tool asked.

    ADK re-runs a confirmed tool once and cannot ask for a confirmation again, so the
    answer waits for canon's decision here rather than in the tool.
    """
    requests = _requests(events)
    if not requests:
        return None
    for call in requests:
        if not await _can_go_on(boundary, call):
            return None
    parts = [
        types.Part(
            function_response=types.FunctionResponse(
                id=call.id,
                name=REQUEST_CONFIRMATION,
                response=ToolConfirmation(confirmed=True).model_dump(by_alias=True),
            )
        )
        for call in requests
    ]
    return types.Content(role="user", parts=parts)
