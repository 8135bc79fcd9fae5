"""What every adapter needs: the extra's import, concurrent calls, reply texts, schemas.

Adapters turn one model turn's tool calls into :class:`~eventstore.ToolEnvelope`s, run
them with :func:`invoke_all` (or :func:`invoke_all_sync` from threads), and turn each
reply into the stack's tool-result shape with :func:`reply_content` and
:func:`is_error`. What the model is told about a tool comes from its
:class:`~eventstore.ToolSpec` (:func:`tool_schemas`), so a schema is written once. A
governed call that meets its run's pause is answered as still waiting
(:func:`held_by_pause`): a pause holds a call, it never ends it.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any, Final, Literal, TypedDict

import msgspec

from eventstore.boundary.contracts import (
    AgentReply,
    ApprovalPending,
    RunContext,
    ToolEnvelope,
    ToolError,
    ToolSpec,
)
from eventstore.boundary.tool_boundary import OnDuplicate, ToolBoundary
from eventstore.reader import InvocationRecord
from eventstore.sync import SyncBoundary
from machine.codes import ErrorCode, Stage
from machine.events import payload_digest
from machine.limits import Limits
from machine.requests import InvalidRequest, canonical_request

_encoder = msgspec.json.Encoder()

#: Either kind of boundary: async (``ToolBoundary``) or for threads (``SyncBoundary``).
Boundary = ToolBoundary | SyncBoundary

#: The arguments' schema shown for a ToolSpec that declares none: any JSON object.
ANY_OBJECT: Final[Mapping[str, Any]] = {"type": "object"}

#: What marks an error in a stack whose tool results are plain text (OpenAI): a result is
#: always JSON text, which never starts with this, so the two cannot be confused.
ERROR_PREFIX: Final = "Error: "

_NEEDS_SYNC_BOUNDARY: Final = (
    "a synchronous call needs a SyncBoundary (eventstore.SyncBoundary): "
    "an async ToolBoundary belongs to its event loop"
)


#: The limits a call's arguments are made canonical within, to match it to the model's.
_MATCHING_LIMITS: Final = Limits()
#: Most turns whose identical calls are being matched at once (see TurnIds).
_MAX_TURNS: Final = 1024


def arguments_digest(arguments: Any) -> str | None:
    """The digest of a call's canonical request, to match a tool's call to the model's.

    For the stacks that hand a tool its arguments but not the model's id of the call
    (CrewAI, LlamaIndex): a dict, JSON text (blank: no arguments) or None. None when they
    are no canonical request (not JSON, too deep or too large): such a call matches none.
    """
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else None
        except ValueError:
            return None
    try:
        request = canonical_request(
            arguments if arguments is not None else {},
            max_depth=_MATCHING_LIMITS.json_depth,
            max_text_bytes=4 * _MATCHING_LIMITS.request_bytes,
        )
    except (InvalidRequest, OverflowError):
        return None
    return payload_digest(request)


class TurnIds:
    """Hands out the model's ids of one turn's identical calls, one to each call.

    A turn's tools run concurrently (threads or tasks), each asking for the id of the call
    with its name and arguments; identical calls share those candidates and take one id
    each, in order. A turn is forgotten once its ids are all taken, so a step the stack
    replays (after a wait) finds its id again.
    """

    def __init__(self) -> None:
        """No turn is being matched yet."""
        self._lock = threading.Lock()
        self._left: OrderedDict[tuple[str, ...], list[str]] = OrderedDict()

    def take(self, candidates: Sequence[str]) -> str:
        """The next id of ``candidates`` (the ids of the turn's identical calls)."""
        # Keyed by the ids themselves: no stack gives its turns an identity of their own.
        key = tuple(candidates)
        with self._lock:
            left = self._left.pop(key, None) or list(candidates)
            taken = left.pop(0)
            if left:
                self._left[key] = left
                while len(self._left) > _MAX_TURNS:
                    self._left.popitem(last=False)
            return taken


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise one ImportError naming the extra that installs it.

    Raises:
        ImportError: the SDK is not installed; the message names
            ``pip install 'canon-store[<extra>]'``.

    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"canon.integrations.{extra} needs the {module!r} package: "
            f"pip install 'canon-store[{extra}]'"
        ) from error


def arguments_or_empty(arguments: str | bytes | None) -> str | bytes:
    """Return a model's JSON arguments, with ``""`` and ``None`` meaning ``{}``.

    Models send an empty string (or no value) for a call of a tool without parameters.
    That is the one normalization an adapter makes; anything else (truncated JSON, an
    array) reaches the boundary as sent and is refused there as INVALID_INPUT.
    """
    if arguments is None or (isinstance(arguments, str | bytes) and not arguments.strip()):
        return "{}"
    return arguments


async def invoke_all(
    boundary: Boundary, ctx: RunContext, envelopes: Sequence[ToolEnvelope]
) -> list[AgentReply]:
    """Run every call of one turn concurrently; the replies come in the calls' order.

    A ``ToolBoundary`` runs them on this loop (its store must belong to it); a
    ``SyncBoundary`` runs them on its own loop while this one waits without blocking. A
    governed call a pause stopped answers that it still waits (:func:`held_by_pause`).
    """
    return list(await asyncio.gather(*(invoke_awaiting(boundary, ctx, e) for e in envelopes)))


def invoke_all_sync(
    boundary: Boundary, ctx: RunContext, envelopes: Sequence[ToolEnvelope]
) -> list[AgentReply]:
    """:func:`invoke_all` from a thread, on a ``SyncBoundary``'s own event loop.

    Raises:
        TypeError: ``boundary`` is an async ``ToolBoundary``, which only the event loop of
            its store may use; raised before any call is checked or recorded.

    """
    if not isinstance(boundary, SyncBoundary):
        raise TypeError(_NEEDS_SYNC_BOUNDARY)
    replies = boundary.invoke_all(ctx, envelopes)
    return [
        held_by_pause_sync(boundary, ctx, envelope, reply)
        for envelope, reply in zip(envelopes, replies, strict=True)
    ]


def is_error(reply: AgentReply) -> bool:
    """Tell whether the agent should be told this call failed."""
    return isinstance(reply, ToolError)


def reply_payload(reply: AgentReply) -> Any:
    """What the model is shown: the bounded result, the safe error, or that a call waits.

    An error is its code and message; a governed call waiting for an operator is its
    approval id and the fixed text (not run, not to be retried).
    """
    if isinstance(reply, ToolError):
        return {"error_code": reply.error_code.value, "message": reply.message}
    if isinstance(reply, ApprovalPending):
        return {
            "status": "awaiting_approval",
            "approval_id": reply.approval_id,
            "message": reply.message,
        }
    return reply.result


def reply_content(reply: AgentReply) -> str:
    """:func:`reply_payload` as compact JSON text, for stacks whose tool results are text."""
    return _encoder.encode(reply_payload(reply)).decode()


def flagged_content(reply: AgentReply) -> str:
    """The reply as a tool output for stacks with no error flag of their own (OpenAI).

    A result is :func:`reply_content` unchanged; an error is :data:`ERROR_PREFIX` followed
    by the safe error JSON (``Error: {"error_code": ..., "message": ...}``). Text that
    starts with ``Error: `` is never JSON, so a tool whose own result looks like canon's
    error (``{"error_code": ..., "message": ...}``) is still read as a result.
    """
    content = reply_content(reply)
    return ERROR_PREFIX + content if is_error(reply) else content


class ToolSchema(TypedDict):
    """How the model is told about one tool: what it does and its arguments' JSON Schema.

    The boundary's :class:`~eventstore.ToolSpec` says how a tool runs; this says how a
    framework presents it (the OpenAI function shape, which every stack accepts).
    :func:`tool_schemas` derives it from the ToolSpec's ``description`` and
    ``input_schema``, so each is written once.
    """

    description: str
    parameters: dict[str, Any]


def tool_schema(tool: ToolSpec | ToolSchema) -> ToolSchema:
    """The schema of one tool, from its ToolSpec (or a ToolSchema as given).

    A ToolSpec's ``description`` and ``input_schema``; any JSON object when it declares
    no schema, as the MCP listing shows it.
    """
    if isinstance(tool, ToolSpec):
        return {
            "description": tool.description,
            "parameters": dict(tool.input_schema or ANY_OBJECT),
        }
    return tool


def tool_schemas(tools: Mapping[str, ToolSpec | ToolSchema]) -> dict[str, ToolSchema]:
    """:func:`tool_schema` of each tool, by name and in order.

    Give the same ``{name: ToolSpec}`` mapping the boundary runs, and the model is shown
    exactly the tools the boundary knows, described once, in the ToolSpecs.
    """
    return {name: tool_schema(tool) for name, tool in tools.items()}


#: What a second call with a used (run, tool call id) gets (the boundary's
#: :data:`~eventstore.boundary.tool_boundary.OnDuplicate`), or None: the boundary's own.
OnDuplicateOrNone = OnDuplicate | None


def with_duplicates(boundary: Boundary, on_duplicate: OnDuplicateOrNone) -> Boundary:
    """``boundary`` answering duplicates as ``on_duplicate`` says (None: as it was built).

    For stacks whose own resume sends the same calls again (LangGraph): the boundary's
    view (``answering_duplicates``) shares its store, tools and threads.

    Raises:
        InvalidArgument: ``on_duplicate`` is not ``"refuse"``, ``"replay"`` or None.

    """
    if on_duplicate is None:
        return boundary
    return boundary.answering_duplicates(on_duplicate)


async def invoke_awaiting(
    boundary: Boundary, ctx: RunContext, envelope: ToolEnvelope
) -> AgentReply:
    """Await one call from a running event loop, on either kind of boundary.

    A ``ToolBoundary`` runs it on this loop (its store must belong to this loop); a
    ``SyncBoundary`` runs it on its own loop, so a framework that starts a fresh loop
    (``run_sync``) still reaches the store.
    """
    if isinstance(boundary, SyncBoundary):
        reply = await boundary.ainvoke(ctx, envelope)
    else:
        reply = await boundary.invoke(ctx, envelope)
    return await held_by_pause(boundary, ctx, envelope, reply)


def invoke_blocking(boundary: Boundary, ctx: RunContext, envelope: ToolEnvelope) -> AgentReply:
    """Run one call from a thread without a loop of its own: that needs a ``SyncBoundary``.

    Raises:
        TypeError: ``boundary`` is an async ``ToolBoundary``, which only the event loop of
            its store may use.

    """
    if not isinstance(boundary, SyncBoundary):
        raise TypeError(_NEEDS_SYNC_BOUNDARY)
    return held_by_pause_sync(boundary, ctx, envelope, boundary.invoke(ctx, envelope))


# A pause holds a call, it never ends it. A governed call that was recorded (waiting, or
# approved) and meets its run's (or the namespace's) pause when it is resumed or re-entered
# has not run and still runs once after the unpause; the adapters answer it with their
# framework's "still waiting" shape, as for a call waiting for an operator.

#: The codes a resume or re-entry meets while the run or the whole namespace is paused.
PAUSED: Final = frozenset({ErrorCode.RUN_PAUSED, ErrorCode.EXECUTION_PAUSED})
#: The stages of a governed call that has not been dispatched yet.
_NOT_DISPATCHED: Final = frozenset({Stage.AWAITING_APPROVAL, Stage.APPROVED})


def limits_of(boundary: Boundary) -> Limits:
    """The limits of the boundary's store (what its preflight makes canonical with)."""
    if isinstance(boundary, SyncBoundary):
        return boundary.store.limits
    return boundary.store.settings.limits


def is_recorded_request(
    record: InvocationRecord, tool: str, arguments: Any, limits: Limits
) -> bool:
    """Whether ``tool`` with ``arguments`` is the call ``record`` froze (tool and digest).

    ``arguments`` as a framework hands them (a mapping, or JSON text, ``""`` meaning
    ``{}``), made canonical exactly as the boundary's preflight makes them.
    """
    if record.state.tool != tool:
        return False
    if isinstance(arguments, str | bytes):
        arguments = arguments_or_empty(arguments)
    try:
        request = canonical_request(
            arguments, max_depth=limits.json_depth, max_text_bytes=4 * limits.request_bytes
        )
    except (InvalidRequest, OverflowError):
        return False
    # A run whose payloads are encrypted keys its digests; its record, read through the
    # keyring, holds the request opened (GCM authenticated it for this call).
    return payload_digest(request) == record.state.request_sha256 or request == record.request


def _paused_governed(boundary: Boundary, envelope: ToolEnvelope, reply: AgentReply) -> bool:
    """Whether ``reply`` is a pause met by a call of a governed tool, nothing recorded."""
    if not isinstance(reply, ToolError) or reply.error_code not in PAUSED:
        return False
    spec = boundary.tools.get(envelope.tool) if isinstance(envelope.tool, str) else None
    return spec is not None and spec.governed and reply.invocation_id is None


def _waiting(record: InvocationRecord) -> ApprovalPending:
    """A governed call that has not run, as the reply that says it waits."""
    state = record.state
    assert state.approval_id is not None  # only asked of governed records
    return ApprovalPending(
        tool_call_id=state.tool_call_id,
        invocation_id=record.invocation_id,
        approval_id=state.approval_id,
    )


def _held(
    boundary: Boundary, envelope: ToolEnvelope, record: InvocationRecord | None
) -> ApprovalPending | Literal["ran", "other"]:
    """What a paused call's record says: it waits, it ran already, or it is not this call."""
    if (
        record is None
        or record.state.approval_id is None
        or not is_recorded_request(record, envelope.tool, envelope.arguments, limits_of(boundary))
    ):
        return "other"  # not a governed call of this request: the pause is the answer
    return _waiting(record) if record.state.stage in _NOT_DISPATCHED else "ran"


async def held_by_pause(
    boundary: Boundary, ctx: RunContext, envelope: ToolEnvelope, reply: AgentReply
) -> AgentReply:
    """``reply``, or, for a governed call a pause stopped, that the call still waits.

    The run's (or namespace's) pause is checked before a re-entered call reaches its
    record, so a governed call that is waiting or approved gets RUN_PAUSED
    (EXECUTION_PAUSED) for an answer. It has not run and still runs once after the
    unpause: it is answered :class:`ApprovalPending`, the reply each adapter shows as its
    framework's "still waiting". A call whose dispatch was taken before the pause
    answers its recorded outcome (``resume``). Any other reply, or a pause met by a call
    canon never recorded (a new call refused), is returned unchanged.
    """
    if not _paused_governed(boundary, envelope, reply):
        return reply
    held = _held(boundary, envelope, await read_record(boundary, ctx.run_id, envelope.tool_call_id))
    if held == "other":
        return reply
    if held == "ran":
        return await resume_awaiting(boundary, ctx, envelope.tool_call_id)
    return held


def held_by_pause_sync(
    boundary: Boundary, ctx: RunContext, envelope: ToolEnvelope, reply: AgentReply
) -> AgentReply:
    """:func:`held_by_pause` from a thread, through a ``SyncBoundary``."""
    if not _paused_governed(boundary, envelope, reply) or not isinstance(boundary, SyncBoundary):
        return reply
    held = _held(boundary, envelope, boundary.store.get(ctx.run_id, envelope.tool_call_id))
    if held == "other":
        return reply
    if held == "ran":
        return boundary.resume(ctx, envelope.tool_call_id)
    return held


def still_waiting(reply: AgentReply) -> bool:
    """Whether a resumed governed call has not run and waits: undecided, or paused.

    For the answers of ``resume``: :class:`ApprovalPending`, or a pause (RUN_PAUSED,
    EXECUTION_PAUSED) met by an approved call, which runs once after the unpause.
    """
    if isinstance(reply, ApprovalPending):
        return True
    return isinstance(reply, ToolError) and reply.error_code in PAUSED


async def read_record(
    boundary: Boundary, run_id: str, tool_call_id: str
) -> InvocationRecord | None:
    """A call's record, read from this loop (a ``SyncBoundary``'s store from a thread)."""
    if isinstance(boundary, SyncBoundary):
        return await asyncio.to_thread(boundary.store.get, run_id, tool_call_id)
    return await boundary.store.get(run_id, tool_call_id)


async def resume_awaiting(boundary: Boundary, ctx: RunContext, tool_call_id: str) -> AgentReply:
    """``boundary.resume`` from this loop (a ``SyncBoundary``'s from a thread)."""
    if isinstance(boundary, SyncBoundary):
        return await asyncio.to_thread(boundary.resume, ctx, tool_call_id)
    return await boundary.resume(ctx, tool_call_id)
