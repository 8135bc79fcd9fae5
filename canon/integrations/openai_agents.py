"""OpenAI Agents SDK tools that run through a ``ToolBoundary``: :func:`function_tool`.

``function_tool(boundary, name, description=..., params_json_schema=...)`` builds the SDK's
own ``FunctionTool`` for a tool registered in the boundary under ``name``. The SDK shows
the model the schema (made strict exactly as the SDK does when ``strict_json_schema`` is
true, the default); when the model calls the tool, the call goes to the boundary with the
SDK's own ``ToolContext.tool_call_id`` and the arguments as the model sent them (``""``
meaning ``{}``).

The run: the ``run=`` given here, else the Runner's ``context=`` object, which must be a
:class:`~eventstore.RunContext` or carry a ``run_id`` string (your own context class may
hold it; so may a mapping, under ``"run_id"``, which a saved ``RunState`` keeps). One
agent then serves every run: ``Runner.run(agent, input, context=run)``.

Replies follow the SDK's convention for a tool's answer: a string, an error being a
text the model reads (as the SDK's own failed-tool and timeout messages are). A success
is the bounded result as JSON; an error is ``Error: `` then the safe error JSON (code and
fixed message), never valid JSON, so a tool whose own result is shaped like canon's
error is never mistaken for one. Only a harness mistake (no run id, an async store used
from another event loop) raises, which ends the run with the SDK's ``UserError``.

:func:`function_tools` builds one ``FunctionTool`` per ``ToolSpec`` of the boundary's
tools, described by the spec's ``description`` and ``input_schema``, so each tool is
described once.

Governed tools (a ``ToolSpec`` with ``approval``) use the SDK's own human-in-the-loop
flow, with canon deciding. Their ``needs_approval`` is canon's: when the tool's policy
wants an approval, the call is recorded in canon, frozen and waiting (asking again for
the same call answers the same waiting call), and the SDK interrupts the run
(``result.interruptions``). Operators decide in canon (``store.decide``, the CLI, the
console). :func:`apply_decisions` then resumes each call in canon and applies the outcome
to the saved ``RunState``: an approved call runs there, once, with the request canon
recorded (canon's one dispatch permit), and only then is it approved in the state, so the
SDK's resume hands the model that recorded result; denied or expired ones are rejected
with canon's denial as the text the model reads; calls still waiting, undecided or
approved in a paused run, are left pending (resuming interrupts on them again, and
applying the decisions after the unpause runs them). A pause holds a call, it never
ends it: nothing is approved in the SDK's state that canon has not run. The SDK's own
``approve`` never dispatches anything by itself: a call canon has not approved
is answered, as its output, that it waits for an operator (not an error), and has not
run. One canon approval covers one call, so ``approve(..., always_approve=True)`` on a
governed tool ends the run with a ``UserError``, and a ``needs_approval`` of your own
for a governed tool is refused when the tool is built.

Sync and async: with a :class:`~eventstore.ToolBoundary` (async store), use
``await Runner.run`` on the store's event loop. ``Runner.run_sync`` drives a loop of its
own, so give it a :class:`~eventstore.sync.SyncBoundary`: each call then runs on the
boundary's loop while the Runner's loop waits in a worker thread (a call the SDK stops
waiting for still finishes there, and its record keeps the outcome). A SyncBoundary works
under ``Runner.run`` too; :func:`apply_decisions_sync` serves ``Runner.run_sync`` harnesses.

Every other option (``needs_approval`` of a tool that is not governed, ``is_enabled``,
guardrails, ``timeout_seconds``) passes to ``FunctionTool`` untouched: an approval the
SDK holds back for a tool canon does not govern never reaches the boundary, so a call
the SDK rejects is never run nor recorded.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from canon.integrations._shared import (
    ToolSchema,
    arguments_or_empty,
    flagged_content,
    held_by_pause,
    require,
    resume_awaiting,
    still_waiting,
    tool_schemas,
)
from eventstore.boundary.contracts import (
    AgentReply,
    ApprovalPending,
    RunContext,
    ToolCall,
    ToolEnvelope,
    ToolError,
    ToolSpec,
)
from eventstore.boundary.tool_boundary import ToolBoundary
from eventstore.errors import WrongEventLoop
from eventstore.store import Store
from eventstore.sync import SyncBoundary, SyncStore
from machine.codes import ErrorCode
from machine.errors import InvalidArgument
from machine.ids import invocation_id

require("agents", "openai_agents")

from agents import FunctionTool, RunContextWrapper, RunState  # noqa: E402  (SDK is there)
from agents.exceptions import UserError  # noqa: E402
from agents.items import ToolApprovalItem  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402

__all__ = [
    "AppliedDecisions",
    "apply_decisions",
    "apply_decisions_sync",
    "function_tool",
    "function_tools",
]

#: The outcomes canon records for a governed call that never ran.
_REFUSED_BY_OPERATORS: Final = frozenset({ErrorCode.APPROVAL_DENIED, ErrorCode.APPROVAL_EXPIRED})
#: What canon says of an interrupted call: approve it in the SDK (canon ran it, or its
#: policy wants no approval), leave it pending, or reject it with canon's error.
_Verdict = Literal["approve", "pending"] | ToolError
#: No real call id: the SDK says a tool is approved for it only when it is approved for
#: every call (``always_approve``).
_ANY_CALL: Final = "canon: any call of this tool"
#: Most answers held between an ask and the tool's call (see ``_CanonApproval``).
_MAX_HELD_ANSWERS: Final = 1024


def _run_of(context: Any) -> RunContext:
    """The canon run of a Runner's ``context=`` object."""
    if isinstance(context, RunContext):
        return context
    # A mapping is the context a saved RunState keeps as it is (the SDK's JSON).
    run_id = (
        context.get("run_id") if isinstance(context, Mapping) else getattr(context, "run_id", None)
    )
    if isinstance(run_id, str):
        return RunContext(run_id)
    raise UserError(
        "canon: no run id for this tool call: pass function_tool(..., run=RunContext(...)) "
        "or Runner.run(..., context=...) with a RunContext, an object with a run_id or a "
        "mapping with a 'run_id' key"
    )


async def _invoke(
    boundary: ToolBoundary | SyncBoundary, ctx: RunContext, envelope: ToolEnvelope
) -> AgentReply:
    if isinstance(boundary, SyncBoundary):
        # The boundary's own loop runs the call; this loop (Runner.run_sync's) stays free.
        reply = await asyncio.to_thread(boundary.invoke, ctx, envelope)
    else:
        try:
            reply = await boundary.invoke(ctx, envelope)
        except WrongEventLoop:
            raise UserError(
                "canon: this ToolBoundary's store runs in another event loop (Runner.run_sync "
                "runs its own): build the tools on a SyncBoundary"
            ) from None
    # A governed call its run's pause stopped still waits (or answers its one run).
    return await held_by_pause(boundary, ctx, envelope, reply)


def _json_object(arguments: Mapping[str, Any] | str) -> dict[str, Any] | None:
    """The arguments as an object, or None when they are not one (the boundary refuses)."""
    if isinstance(arguments, Mapping):
        return dict(arguments)
    try:
        decoded = json.loads(arguments_or_empty(arguments))
    except ValueError:
        return None
    return decoded if isinstance(decoded, dict) else None


class _CanonApproval:
    """A governed tool's ``needs_approval``: canon records the call and says whether it waits.

    Asked by the SDK before the tool runs (a resumed run keeps its pending calls without
    asking again). When the tool's policy wants an approval, the call goes to the
    boundary, which records it waiting (asked again, as for a re-sent turn, it answers the
    same call): the SDK interrupts while canon answers :class:`ApprovalPending`. Any other
    answer (the call was decided already, or refused) is held for the tool's own call,
    which follows at once and returns it, so the call reaches canon once.
    """

    def __init__(
        self,
        boundary: ToolBoundary | SyncBoundary,
        name: str,
        spec: ToolSpec,
        run: RunContext | None,
    ) -> None:
        self.boundary = boundary
        self.name = name
        self.spec = spec
        self.run = run
        # One agent may serve runs in many threads (Runner.run_sync): one lock for all.
        self._held: OrderedDict[tuple[str, str], AgentReply] = OrderedDict()
        self._held_lock = threading.Lock()

    async def __call__(
        self, run_context: RunContextWrapper[Any], arguments: dict[str, Any], call_id: str
    ) -> bool:
        """The SDK's question: does this call wait for an approval (interrupt the run)?"""
        ctx = self.run if self.run is not None else _run_of(run_context.context)
        reply = await self.ask(ctx, call_id, arguments)
        if reply is None:
            return False
        if isinstance(reply, ApprovalPending):
            return True
        with self._held_lock:
            self._held[(ctx.run_id, call_id)] = reply
            while len(self._held) > _MAX_HELD_ANSWERS:  # asks whose tool never ran
                self._held.popitem(last=False)
        return False

    async def ask(
        self, ctx: RunContext, call_id: str, arguments: Mapping[str, Any] | str
    ) -> AgentReply | None:
        """Canon's answer to a call of this tool; None when its policy wants no approval.

        The policy is asked first so that a call it lets through runs only when the SDK
        runs the tool, never here.
        """
        decoded = _json_object(arguments)
        call = ToolCall(
            run_id=ctx.run_id,
            tool_call_id=call_id,
            invocation_id=invocation_id(ctx.run_id, call_id),
            tool=self.name,
        )
        if decoded is not None and not self.spec.needs_approval(decoded, call):
            return None
        envelope = ToolEnvelope(
            run_id=ctx.run_id,
            tool_call_id=call_id,
            tool=self.name,
            arguments=arguments
            if isinstance(arguments, Mapping)
            else arguments_or_empty(arguments),
        )
        return await _invoke(self.boundary, ctx, envelope)

    def held(self, run_id: str, call_id: str) -> AgentReply | None:
        """The answer an ask got for this call and held for the tool's call, once."""
        with self._held_lock:
            return self._held.pop((run_id, call_id), None)

    def refuse_standing_approval(self, tool_context: ToolContext[Any]) -> None:
        """Raise when the SDK approves every call of this tool (``always_approve``).

        Raises:
            UserError: it does: canon's approval covers one call, decided by an operator.

        """
        if tool_context.is_tool_approved(self.name, _ANY_CALL) is True:
            raise UserError(
                f"canon: the governed tool {self.name!r} was approved with "
                "always_approve=True; canon approves one call at a time, by an operator: "
                "apply canon's decisions with canon.integrations.openai_agents.apply_decisions"
            )


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

    For a governed tool (its ``ToolSpec`` has ``approval``), the tool's ``needs_approval``
    is canon's (see the module's docstring): the SDK interrupts the run while canon waits
    for an operator, and :func:`apply_decisions` applies the decisions.

    Args:
        boundary: the boundary whose tool ``name`` runs the calls; its ``on_duplicate``
            decides what a re-sent call gets (``"replay"``: the recorded reply).
        name: the tool's name, for the model and in the boundary.
        description: what the model is told the tool does.
        params_json_schema: the JSON schema of the arguments.
        strict_json_schema: the SDK's strict mode (made strict by the SDK itself).
        run: the run of every call; None takes it from the Runner's ``context=``.
        options: any other ``FunctionTool`` field (``needs_approval`` of a tool canon
            does not govern, ``is_enabled``, ``timeout_seconds``, guardrails...), passed
            untouched.

    Raises:
        InvalidArgument: ``needs_approval`` was given for a governed tool (canon decides
            its approvals).

    """
    spec = boundary.tools.get(name)
    approval = None
    if spec is not None and spec.governed:
        if "needs_approval" in options:
            raise InvalidArgument(
                f"tool {name!r} is governed by canon (its ToolSpec has approval): canon "
                "decides which of its calls wait for an operator, so do not pass needs_approval"
            )
        approval = _CanonApproval(boundary, name, spec, run)
        options["needs_approval"] = approval

    async def on_invoke_tool(tool_context: ToolContext[Any], arguments: str) -> str:
        ctx = run if run is not None else _run_of(tool_context.context)
        if approval is not None:
            approval.refuse_standing_approval(tool_context)
            held = approval.held(ctx.run_id, tool_context.tool_call_id)
            if held is not None:
                return flagged_content(held)
        envelope = ToolEnvelope(
            run_id=ctx.run_id,
            tool_call_id=tool_context.tool_call_id,
            tool=name,
            arguments=arguments_or_empty(arguments),
        )
        # A governed call re-enters canon here: it runs once if approved, else canon
        # answers that it waits (the SDK's approval alone dispatches nothing).
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


@dataclass
class AppliedDecisions:
    """What :func:`apply_decisions` did with each interruption of a ``RunState``.

    Attributes:
        approved: canon approved the call and ran it once (or its policy wants no
            approval): approved in the state; on resume the tool's call answers the
            recorded outcome (a call canon's policy let through runs then).
        rejected: an operator denied it, its approval expired, or canon refused it:
            rejected in the state, with canon's error (``Error: {...}``) as the text the
            model reads.
        pending: canon still waits for an operator, or for the unpause of an approved
            call's run: left as they are (resuming the state interrupts on them again).
        others: interruptions canon does not govern (other tools, your own
            ``needs_approval``): left for you to approve or reject.

    """

    approved: list[ToolApprovalItem] = field(default_factory=list)
    rejected: list[ToolApprovalItem] = field(default_factory=list)
    pending: list[ToolApprovalItem] = field(default_factory=list)
    others: list[ToolApprovalItem] = field(default_factory=list)


def _canon_approval(item: ToolApprovalItem) -> _CanonApproval | None:
    """Canon's approval of the governed function tool ``item`` waits on, if it is one."""
    for tool in getattr(item.agent, "tools", ()):
        if (
            isinstance(tool, FunctionTool)
            and tool.name == item.tool_name
            and isinstance(tool.needs_approval, _CanonApproval)
        ):
            return tool.needs_approval
    return None


async def _verdict(
    store: Store, approval: _CanonApproval, ctx: RunContext, call_id: str, arguments: str
) -> _Verdict:
    """What canon says of one interrupted call, once canon decided and dispatched.

    A governed call canon recorded is resumed through the tool's boundary before the
    SDK's state is touched: still waiting (undecided, or approved in a paused run), it
    stays pending; denied, expired or refused, it is rejected with canon's error;
    approved, it runs here, once, and is approved in the SDK, whose tool's call then
    answers that recorded outcome. Nothing is approved in the SDK that canon has not run.
    """
    record = await store.get(ctx.run_id, call_id)
    if record is None:
        # Never recorded: the SDK asks no policy of arguments it cannot parse (``""``).
        # Nothing exists to dispatch, so the boundary records the call waiting (or
        # refuses it, or its policy wants no approval).
        reply = await approval.ask(ctx, call_id, arguments)
        if isinstance(reply, ToolError) and reply.invocation_id is None:
            return reply
        return "pending" if isinstance(reply, ApprovalPending) else "approve"
    if record.state.approval_id is None:  # canon's policy let it run: the tool's call answers
        return "approve"
    reply = await resume_awaiting(approval.boundary, ctx, call_id)
    if still_waiting(reply) or (
        isinstance(reply, ToolError)
        and reply.error_code is ErrorCode.STORE_UNAVAILABLE
        and reply.invocation_id is None
    ):
        return "pending"  # nothing ran: applying the decisions again later goes on
    if isinstance(reply, ToolError) and (
        reply.error_code in _REFUSED_BY_OPERATORS or reply.invocation_id is None
    ):
        return reply  # denied, expired, or refused at the resume: it never ran
    return "approve"  # it ran once, its outcome recorded: the tool's call answers it


async def _apply(
    state: RunState[Any, Any], store: Store, run: RunContext | None
) -> AppliedDecisions:
    applied = AppliedDecisions()
    for item in state.get_interruptions():
        approval = _canon_approval(item)
        call_id = item.call_id
        if approval is None or call_id is None:
            applied.others.append(item)
            continue
        ctx = approval.run if approval.run is not None else run
        if ctx is None:
            raise InvalidArgument(
                "canon: no run id for the interrupted calls: pass apply_decisions(..., "
                "run=RunContext(...)) (the run given to Runner.run as context=)"
            )
        verdict = await _verdict(store, approval, ctx, call_id, item.arguments or "")
        if verdict == "approve":
            # One approval for one call: never always_approve (see _CanonApproval).
            state.approve(item)
            applied.approved.append(item)
        elif verdict == "pending":
            applied.pending.append(item)
        else:
            state.reject(item, rejection_message=flagged_content(verdict))
            applied.rejected.append(item)
    return applied


async def apply_decisions(
    state: RunState[Any, Any], store: Store | SyncStore, *, run: RunContext | None = None
) -> AppliedDecisions:
    """Apply canon's decisions to an interrupted run's state, before resuming it.

    Each interruption of a governed tool built here is resumed in canon through the
    tool's boundary: approved by an operator, the call runs here, once, and is approved
    in the state (``Runner.run(agent, state)`` then hands the model its recorded
    result); denied, expired or refused, it is rejected with canon's error as the
    model's text; undecided, or approved while its run (or the namespace) is paused, it
    is left pending and nothing runs. A call past its approval's expiry has the expiry
    recorded; a call the SDK interrupted without asking canon (arguments it could not
    parse) is recorded waiting. Interruptions of other tools are left alone. Apply again
    (on the new state) after a resume that stopped on pending calls.

    Args:
        state: ``result.to_state()`` of the interrupted run (or one loaded from JSON).
        store: the store of the tools' boundary (a ``SyncStore`` too).
        run: the run the calls belong to (the Runner's ``context=``), unless the tools
            were built with ``run=``.

    Returns:
        Which interruptions were approved, rejected, left pending, or are not canon's.

    Raises:
        InvalidArgument: no run is known for a governed call.
        StoreUnavailable: Redis failed or timed out; nothing was applied to the calls
            not yet read.

    """
    if isinstance(store, SyncStore):
        return await asyncio.to_thread(store.call, _apply(state, store.async_store, run))
    return await _apply(state, store, run)


def apply_decisions_sync(
    state: RunState[Any, Any], store: SyncStore, *, run: RunContext | None = None
) -> AppliedDecisions:
    """:func:`apply_decisions` for code without an event loop (``Runner.run_sync``)."""
    return store.call(_apply(state, store.async_store, run))
