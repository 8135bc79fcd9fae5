"""A Pydantic AI toolset whose every call goes through a canon boundary.

``BoundaryToolset(boundary, TOOLS, run_id=...)`` is an
:class:`~pydantic_ai.toolsets.AbstractToolset`: it lists one tool per entry of ``TOOLS``
(the boundary's ``ToolSpec``s, whose ``description`` and ``input_schema`` the model sees,
or ToolSchemas) and sends each call to the
boundary with Pydantic AI's own ``ctx.tool_call_id`` and the harness's run id (a string,
or a function of the run context, e.g. ``lambda ctx: ctx.deps.run_id``). The arguments
reach the boundary as the model sent them (no schema validation here: the boundary
decides what is INVALID_INPUT); a call without arguments is ``{}``.

Replies:

- a result is returned as the bounded value, which Pydantic AI sends as the tool return;
- an error raises :class:`~pydantic_ai.exceptions.ToolFailed` with the safe error JSON,
  which Pydantic AI turns into a ``ToolReturnPart(outcome="failed")``: the provider's
  native error result (Anthropic ``is_error``, ...), the run goes on, and no retry budget
  is spent. ``ModelRetry`` would instead ask the model to call again, which a refused or
  failed canon call (its id is recorded) cannot honour.

A name the toolset does not list never reaches canon: Pydantic AI answers it with its
own retry prompt. A listed name the boundary does not know answers UNKNOWN_TOOL.

Governed tools (a ``ToolSpec`` with ``approval``) are Pydantic AI *deferred* tools. A call
canon records as waiting for an operator (``ApprovalPending``) raises
:class:`~pydantic_ai.exceptions.CallDeferred` whose metadata names the run, the
invocation and the approval, so the agent run ends with a
:class:`~pydantic_ai.tools.DeferredToolRequests` output listing the call in ``calls``
(give the agent ``output_type=[str, DeferredToolRequests]``). The tool has not run.
Operators decide in canon (``store.decide``, ``canon approve``, the console); then
:func:`deferred_results` resumes each call through the boundary and builds the
:class:`~pydantic_ai.tools.DeferredToolResults` the agent continues with
(``agent.run(message_history=..., deferred_tool_results=...)``). Pydantic AI hands those
results to the model without calling the toolset again, and canon runs an approved call
once however often it is resumed.

No framework decision is an approval: ``DeferredToolResults.approvals`` (``True``,
``ToolApproved``) for a canon call only makes Pydantic AI call the toolset again, which
re-enters the same call in the boundary: still waiting, it is deferred again, and
nothing runs until an operator approves it in canon.

``agent.run`` may use a ``ToolBoundary`` on its store's loop or a
:class:`~eventstore.SyncBoundary`; ``agent.run_sync`` runs a loop of its own, so it needs
a ``SyncBoundary`` (an async store used from another loop raises ``WrongEventLoop``).
Pydantic AI generates ids for providers that send none, so for them a re-sent turn is a
new call, not a replay.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final

from canon.integrations._shared import (
    ToolSchema,
    invoke_awaiting,
    is_error,
    reply_content,
    reply_payload,
    require,
    tool_schemas,
)

require("pydantic_ai", "pydantic-ai")

from pydantic_ai import RunContext as AgentContext  # noqa: E402
from pydantic_ai.exceptions import CallDeferred, ToolFailed  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    ModelMessage,
    ModelResponse,
    ToolCallPart,
    ToolReturn,
)
from pydantic_ai.tools import (  # noqa: E402
    DeferredToolRequests,
    DeferredToolResults,
    ToolDefinition,
    ToolDenied,
)
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool  # noqa: E402
from pydantic_core import SchemaValidator, ValidationError, core_schema  # noqa: E402

from eventstore.boundary.contracts import (  # noqa: E402
    AgentReply,
    ApprovalPending,
    RunContext,
    ToolEnvelope,
    ToolError,
    ToolSpec,
)
from eventstore.boundary.tool_boundary import ToolBoundary  # noqa: E402
from eventstore.reader import InvocationRecord  # noqa: E402
from eventstore.sync import SyncBoundary  # noqa: E402
from machine.codes import ErrorCode  # noqa: E402
from machine.errors import CanonError  # noqa: E402
from machine.events import payload_digest  # noqa: E402
from machine.ids import invocation_id  # noqa: E402
from machine.limits import Limits  # noqa: E402
from machine.requests import InvalidRequest, canonical_request  # noqa: E402

__all__ = ["AlteredToolCall", "BoundaryToolset", "deferred_results", "waiting_calls"]

# Any JSON value passes: the boundary, not the toolset, refuses what is not an object.
_AS_SENT = SchemaValidator(schema=core_schema.any_schema())


class BoundaryToolset(AbstractToolset[Any]):
    """The tools of ``schemas``, each call run by ``boundary``.

    Args:
        boundary: a ``SyncBoundary`` (``run`` and ``run_sync``) or a ``ToolBoundary``
            (``run`` on its store's loop).
        schemas: by tool name, what the model sees: the boundary's own ToolSpecs (their
            ``description`` and ``input_schema``, any object without one), or
            ToolSchemas (description and arguments' JSON Schema).
        run_id: the canon run of the agent run: a string, or a function of the run
            context (``lambda ctx: ctx.deps.run_id``).
        max_retries: how often the model may re-send a call whose arguments are not
            JSON (Pydantic AI's retry prompt); canon's errors spend none.
        id: the toolset's id among the agent's toolsets.

    """

    def __init__(
        self,
        boundary: ToolBoundary | SyncBoundary,
        schemas: Mapping[str, ToolSpec | ToolSchema],
        *,
        run_id: str | Callable[[AgentContext[Any]], str],
        max_retries: int = 1,
        id: str | None = None,
    ) -> None:
        self.boundary = boundary
        self.run_id = run_id
        self.max_retries = max_retries
        self._id = id
        self._definitions = [
            ToolDefinition(
                name=name,
                description=schema["description"] or None,
                parameters_json_schema=schema["parameters"],
            )
            for name, schema in tool_schemas(schemas).items()
        ]

    @property
    def id(self) -> str | None:
        """The toolset's id, if one was given."""
        return self._id

    async def get_tools(self, ctx: AgentContext[Any]) -> dict[str, ToolsetTool[Any]]:
        """One tool per schema; arguments pass unvalidated to the boundary."""
        return {
            definition.name: ToolsetTool(
                toolset=self,
                tool_def=definition,
                max_retries=self.max_retries,
                args_validator=_AS_SENT,
            )
            for definition in self._definitions
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: AgentContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        """Run the call through the boundary; return the bounded result.

        Raises:
            CallDeferred: the call is governed and waits for an operator: its metadata
                holds ``run_id``, ``invocation_id`` and ``approval_id``; the tool has not
                run (see :func:`deferred_results`).
            ToolFailed: the boundary answered an error; the message is the safe error JSON.

        """
        run_id = self.run_id if isinstance(self.run_id, str) else self.run_id(ctx)
        envelope = ToolEnvelope(
            run_id=run_id, tool_call_id=ctx.tool_call_id or "", tool=name, arguments=tool_args
        )
        reply = await invoke_awaiting(self.boundary, RunContext(run_id), envelope)
        if isinstance(reply, ApprovalPending):
            raise CallDeferred(
                metadata={
                    "run_id": run_id,
                    "invocation_id": reply.invocation_id,
                    "approval_id": reply.approval_id,
                }
            )
        if is_error(reply):
            raise ToolFailed(reply_content(reply))
        return reply_payload(reply)


# Governed calls: what canon decided, handed back to Pydantic AI as deferred tool results.

#: Resumed calls these codes answer still wait: nothing was decided or recorded yet
#: (a paused run, or a store that could not be reached); a later resume goes on.
_STILL_WAITING: Final = frozenset(
    {ErrorCode.RUN_PAUSED, ErrorCode.EXECUTION_PAUSED, ErrorCode.STORE_UNAVAILABLE}
)
#: An operator's "no" (or no answer in time): the model reads Pydantic AI's own denial.
_DENIED: Final = frozenset({ErrorCode.APPROVAL_DENIED, ErrorCode.APPROVAL_EXPIRED})


class AlteredToolCall(CanonError, ValueError):
    """Raised when a deferred call in the message history is not the one canon recorded.

    Its tool name or arguments differ from the frozen request of the call's record (its
    ``request_sha256``): a result given for it would tell the model that the altered
    call ran. :func:`deferred_results` raises it before it resumes any call, so nothing
    runs and no result is given.

    Attributes:
        tool_call_id: the id of the altered call.

    """

    def __init__(self, tool_call_id: str) -> None:
        super().__init__(
            f"deferred tool call {tool_call_id!r} is not the call canon recorded: its tool "
            "or arguments were changed in the message history; no result is given for it"
        )
        self.tool_call_id = tool_call_id


async def deferred_results(
    boundary: ToolBoundary | SyncBoundary,
    ctx: RunContext,
    requests: DeferredToolRequests,
    *,
    message_history: Sequence[ModelMessage],
) -> DeferredToolResults:
    """Resume the canon calls of ``requests`` that operators decided; their results.

    For each call :class:`BoundaryToolset` deferred in ``ctx``'s run (its metadata names
    the call's invocation), ``boundary.resume`` goes on from the call's record, so the
    decision is canon's alone:

    - approved: canon runs the frozen request once (a call already run answers its
      recorded reply; nothing runs twice however often this is called), and its result
      is in ``calls`` as a :class:`~pydantic_ai.messages.ToolReturn` (an error as
      :class:`~pydantic_ai.exceptions.ToolFailed` with the safe error JSON, which the
      model reads as a failed tool result);
    - denied, or not approved in time: ``approvals`` holds a
      :class:`~pydantic_ai.tools.ToolDenied` with the safe error JSON, which Pydantic AI
      shows the model as a denied call (``outcome="denied"``; a ``ToolDenied`` among
      ``calls`` would reach the model as an ordinary result);
    - still waiting (undecided, its run paused, the store unreachable): left out;
      :func:`waiting_calls` lists it, and calling this again later goes on.

    Pass the result as ``deferred_tool_results`` with the same ``message_history`` once
    :func:`waiting_calls` is empty: Pydantic AI needs every deferred call answered, and
    hands these answers to the model without calling the toolset. A call that is not
    canon's is left out for the application to answer.

    Args:
        boundary: the boundary the toolset used (a ``ToolBoundary`` on its store's loop,
            or a ``SyncBoundary``).
        ctx: the canon run of the agent run that deferred the calls.
        requests: the ``DeferredToolRequests`` output of that agent run.
        message_history: the messages the agent continues with: each deferred call in
            them must be the call canon recorded (tool and arguments).

    Raises:
        AlteredToolCall: a call in ``requests`` or ``message_history`` has another tool
            or other arguments than its record; raised before any call is resumed.
        StoreUnavailable: the calls' records could not be read.
        WrongEventLoop: ``boundary`` is a ``ToolBoundary`` of another event loop.

    """
    calls = [call for call in requests.calls if _deferred_by_canon(ctx.run_id, call, requests)]
    records = await asyncio.gather(*(_record(boundary, ctx.run_id, call) for call in calls))
    limits = _limits(boundary)
    for call, record in zip(calls, records, strict=True):
        if record is None:
            continue  # gone (expired): the resume answers RECORD_EXPIRED, runs nothing
        for sent in (call, *_calls_in(message_history, call.tool_call_id)):
            if not _is_recorded_call(sent, record, limits):
                raise AlteredToolCall(call.tool_call_id)
    replies = await asyncio.gather(*(_resume(boundary, ctx, call) for call in calls))
    results = DeferredToolResults()
    for call, reply in zip(calls, replies, strict=True):
        _answer(results, call.tool_call_id, reply)
    return results


def waiting_calls(
    requests: DeferredToolRequests, results: DeferredToolResults
) -> list[ToolCallPart]:
    """The calls of ``requests`` that ``results`` does not answer yet.

    After :func:`deferred_results`: canon calls still waiting for an operator (or for
    their run to be unpaused), and any other deferred call the application has not
    answered. Continue the agent once this is empty. (``DeferredToolRequests.remaining``
    would count a denied canon call as unanswered: its ``ToolDenied`` is in
    ``results.approvals``, which ``remaining`` only matches against approval requests.)
    """
    answered = results.calls.keys() | results.approvals.keys()
    return [
        call for call in (*requests.calls, *requests.approvals) if call.tool_call_id not in answered
    ]


def _deferred_by_canon(run_id: str, call: ToolCallPart, requests: DeferredToolRequests) -> bool:
    """Whether the toolset deferred ``call`` in this run (its metadata names the invocation)."""
    metadata = requests.metadata.get(call.tool_call_id) or {}
    return metadata.get("invocation_id") == invocation_id(run_id, call.tool_call_id)


def _calls_in(messages: Sequence[ModelMessage], tool_call_id: str) -> Iterator[ToolCallPart]:
    """Every call with this id in the models' responses of ``messages``."""
    for message in messages:
        if isinstance(message, ModelResponse):
            yield from (part for part in message.tool_calls if part.tool_call_id == tool_call_id)


def _is_recorded_call(call: ToolCallPart, record: InvocationRecord, limits: Limits) -> bool:
    """Whether ``call`` is the recorded one: its tool, and its arguments' canonical digest.

    The arguments are read as the toolset received them (JSON text parsed as Pydantic AI
    parses it, none as ``{}``), then made canonical as the boundary made them.
    """
    if call.tool_name != record.state.tool:
        return False
    try:
        if isinstance(call.args, str):
            arguments = _AS_SENT.validate_json(call.args or "{}")
        else:
            arguments = _AS_SENT.validate_python(call.args or {})
        request = canonical_request(
            arguments,
            max_depth=limits.json_depth,
            max_text_bytes=4 * limits.request_bytes,
        )
    except (ValidationError, InvalidRequest, OverflowError):
        return False
    # A run whose payloads are encrypted keys its digests; its record, read through the
    # keyring, holds the request opened (GCM authenticated it for this call).
    return payload_digest(request) == record.state.request_sha256 or request == record.request


def _limits(boundary: ToolBoundary | SyncBoundary) -> Limits:
    if isinstance(boundary, SyncBoundary):
        return boundary.store.limits
    return boundary.store.settings.limits


async def _record(
    boundary: ToolBoundary | SyncBoundary, run_id: str, call: ToolCallPart
) -> InvocationRecord | None:
    """The call's record, read on the boundary's loop (a SyncBoundary's from a thread)."""
    if isinstance(boundary, SyncBoundary):
        return await asyncio.to_thread(boundary.store.get, run_id, call.tool_call_id)
    return await boundary.store.get(run_id, call.tool_call_id)


async def _resume(
    boundary: ToolBoundary | SyncBoundary, ctx: RunContext, call: ToolCallPart
) -> AgentReply:
    """``boundary.resume`` from this loop (a SyncBoundary's from a thread)."""
    if isinstance(boundary, SyncBoundary):
        return await asyncio.to_thread(boundary.resume, ctx, call.tool_call_id)
    return await boundary.resume(ctx, call.tool_call_id)


def _answer(results: DeferredToolResults, tool_call_id: str, reply: AgentReply) -> None:
    """Put a resumed call's reply where Pydantic AI reads it; leave a waiting call out."""
    if isinstance(reply, ApprovalPending):
        return
    if isinstance(reply, ToolError):
        if reply.error_code in _STILL_WAITING:
            return
        if reply.error_code in _DENIED:
            results.approvals[tool_call_id] = ToolDenied(reply_content(reply))
            return
        results.calls[tool_call_id] = ToolFailed(reply_content(reply))
        return
    # Wrapped, so a result that looks like one of Pydantic AI's tagged answers (a dict
    # with "kind": "tool-failed") stays a result when the DeferredToolResults is stored.
    results.calls[tool_call_id] = ToolReturn(reply_payload(reply))
