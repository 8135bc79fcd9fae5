"""What every adapter needs: the extra's import, concurrent calls, reply texts, schemas.

Adapters turn one model turn's tool calls into :class:`~eventstore.ToolEnvelope`s, run
them with :func:`invoke_all` (or :func:`invoke_all_sync` from threads), and turn each
reply into the stack's tool-result shape with :func:`reply_content` and
:func:`is_error`. What the model is told about a tool comes from its
:class:`~eventstore.ToolSpec` (:func:`tool_schemas`), so a schema is written once.
"""

from __future__ import annotations

import asyncio
import importlib
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
from eventstore.boundary.tool_boundary import ToolBoundary
from eventstore.sync import SyncBoundary

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
    ``SyncBoundary`` runs them on its own loop while this one waits without blocking.
    """
    if isinstance(boundary, SyncBoundary):
        calls = (boundary.ainvoke(ctx, envelope) for envelope in envelopes)
    else:
        calls = (boundary.invoke(ctx, envelope) for envelope in envelopes)
    return list(await asyncio.gather(*calls))


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
    return boundary.invoke_all(ctx, envelopes)


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


#: What a second call with a used (run, tool call id) gets: see ``ToolBoundary``; None
#: leaves the boundary's own choice.
OnDuplicate = Literal["refuse", "replay"] | None


def with_duplicates(boundary: Boundary, on_duplicate: OnDuplicate) -> Boundary:
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
        return await boundary.ainvoke(ctx, envelope)
    return await boundary.invoke(ctx, envelope)


def invoke_blocking(boundary: Boundary, ctx: RunContext, envelope: ToolEnvelope) -> AgentReply:
    """Run one call from a thread without a loop of its own: that needs a ``SyncBoundary``.

    Raises:
        TypeError: ``boundary`` is an async ``ToolBoundary``, which only the event loop of
            its store may use.

    """
    if not isinstance(boundary, SyncBoundary):
        raise TypeError(_NEEDS_SYNC_BOUNDARY)
    return boundary.invoke(ctx, envelope)
