"""Microsoft Agent Framework tools that run through a canon boundary: :func:`as_tools`.

``as_tools(boundary, TOOLS, run=...)`` gives one Agent Framework
:class:`~agent_framework.FunctionTool` per ``ToolSpec``, for an ``Agent`` (or a chat
client's ``get_response``): the model sees the spec's ``description`` and its
``input_schema`` as written. A call goes to the boundary with the framework's
``tool_call_id``, the model's own call id (the provider's ``call_id``), and the arguments
the model sent; the tools are never run here. A call without the model's id is refused
with INVALID_TOOL_CALL_ID, never recorded under a made-up one: ``tool.invoke(...)`` by
hand, or a model's call that came without an id, which the framework gives an id of its
own making (``af-call-<hex>``).

Replies are function results under the call's id: a result is the bounded result as JSON
text; an error is ``Error: `` then the safe error JSON (the text the framework's own
failed calls start with, never valid JSON, so never taken for a result), and the agent
goes on. A re-sent turn with the same ids replays the recorded replies when the boundary
is built with ``on_duplicate="replay"``.

Governed tools (a ``ToolSpec`` with ``approval``) wait in the framework's own
human-in-the-loop way, a function approval request: a call canon records as waiting for
an operator ends the run with a ``function_approval_request`` in
``response.user_input_requests`` (its ``function_call`` is the call, its
``additional_properties`` name the run, the call and canon's approval). Operators decide
in canon (``store.decide``, ``canon approve``, the console); the harness then runs the
agent again with :func:`approval_responses` (approval responses that only make the calls
ask canon again): approved, the tool runs once; denied or expired, its error; still
waiting (or approved in a paused run), a new approval request. The framework's
``approved`` never decides: a response of ``approved=True`` only asks canon, and one of
``approved=False`` is the framework's own refusal, which the model is told while the
call stays waiting in canon, never run.

A ``SyncBoundary`` serves any event loop; a ``ToolBoundary`` serves agents on its store's
loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from canon.integrations._shared import (
    Boundary,
    ToolSchema,
    flagged_content,
    invoke_awaiting,
    reply_payload,
    require,
    tool_schemas,
)
from eventstore.boundary.contracts import ApprovalPending, RunContext, ToolEnvelope, ToolSpec

require("agent_framework", "agent_framework")

from agent_framework import Content, FunctionTool  # noqa: E402  (only once the SDK is there)
from agent_framework.exceptions import UserInputRequiredException  # noqa: E402

__all__ = ["APPROVAL_KEY", "MADE_UP_ID_PREFIX", "BoundaryTool", "approval_responses", "as_tools"]

#: The key of an approval request's ``additional_properties`` that canon's requests carry.
APPROVAL_KEY: Final = "canon_approval"
#: How the ids the framework makes up begin: it gives a model's call that came without a
#: ``call_id`` its own occurrence id (``af-call-<hex>``), which canon must never record.
MADE_UP_ID_PREFIX: Final = "af-call-"


async def _never_called(**arguments: Any) -> None:
    raise AssertionError("BoundaryTool answers in invoke")  # pragma: no cover


class BoundaryTool(FunctionTool):  # type: ignore[misc,unused-ignore]  # Any without the SDK
    """An Agent Framework tool whose calls run through a canon boundary; see :func:`as_tools`.

    Attributes:
        boundary: the boundary whose ToolSpec of the same name runs the call.
        run: the canon run of every call.

    """

    def __init__(self, boundary: Boundary, name: str, schema: ToolSchema, run: RunContext) -> None:
        super().__init__(
            name=name,
            description=schema["description"] or name,
            approval_mode="never_require",  # canon asks its operators, not the framework
            func=_never_called,
            input_model=dict(schema["parameters"]),
        )
        self.boundary = boundary
        self.run = run

    async def invoke(
        self,
        *,
        arguments: Any = None,
        context: Any = None,
        tool_call_id: str | None = None,
        skip_parsing: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Run the call through the boundary under the model's ``tool_call_id``.

        Returns:
            The text the model reads: the bounded result as JSON, or ``Error: `` and the
            safe error JSON (INVALID_TOOL_CALL_ID when the call has no id).

        Raises:
            UserInputRequiredException: the framework's pause, carrying a
                ``function_approval_request``: the call is governed and waits for an
                operator in canon.

        """
        if arguments is None:
            arguments = kwargs or (context.arguments if context is not None else {})
        if hasattr(arguments, "model_dump"):
            arguments = arguments.model_dump()
        if not tool_call_id or tool_call_id.startswith(MADE_UP_ID_PREFIX):
            tool_call_id = ""  # no id of the model's: refused, nothing recorded
        arguments = dict(arguments)
        envelope = ToolEnvelope(
            run_id=self.run.run_id, tool_call_id=tool_call_id, tool=self.name, arguments=arguments
        )
        reply = await invoke_awaiting(self.boundary, self.run, envelope)
        if isinstance(reply, ApprovalPending):
            raise UserInputRequiredException(
                [self._approval_request(reply, arguments)],
                "The call waits for an operator's decision in canon.",
            )
        return flagged_content(reply)

    def _approval_request(self, reply: ApprovalPending, arguments: dict[str, Any]) -> Any:
        """The framework's approval request for a call that waits in canon."""
        # The request and its call share one occurrence id, as the framework's own requests
        # do: canon's invocation, so a response binds to this wait and no other.
        occurrence = f"canon-{reply.invocation_id}"
        call = Content.from_function_call(
            call_id=reply.tool_call_id, name=self.name, arguments=arguments, id=occurrence
        )
        return Content.from_function_approval_request(
            id=occurrence,
            function_call=call,
            additional_properties={
                APPROVAL_KEY: {**reply_payload(reply), "run_id": self.run.run_id},
            },
        )


def as_tools(
    boundary: Boundary,
    tools: Mapping[str, ToolSpec | ToolSchema],
    *,
    run: RunContext | str,
) -> list[BoundaryTool]:
    """One Agent Framework tool per tool, each running through ``boundary`` in ``run``.

    Args:
        boundary: a ``SyncBoundary`` (any loop) or a ``ToolBoundary`` (its store's loop);
            its ``on_duplicate`` decides what a re-sent call gets (``"replay"``: its record).
        tools: the boundary's ``{name: ToolSpec}`` (each one's ``description`` and
            ``input_schema``), or ToolSchemas.
        run: the canon run of the agent's calls.

    """
    ctx = run if isinstance(run, RunContext) else RunContext(run)
    return [
        BoundaryTool(boundary, name, schema, ctx) for name, schema in tool_schemas(tools).items()
    ]


def approval_responses(response: Any) -> list[Any]:
    """Approval responses that make canon's waiting calls ask canon again.

    ``response`` is the agent's response whose ``user_input_requests`` hold canon's
    approval requests; send the returned contents as the next run's user message. Each
    response says ``approved=True`` to the framework, which only lets the call ask canon:
    canon's operators decide. Requests of other tools are not answered here.
    """
    return [
        request.to_function_approval_response(approved=True)
        for request in response.user_input_requests
        if request.type == "function_approval_request"
        and APPROVAL_KEY in (request.additional_properties or {})
    ]
