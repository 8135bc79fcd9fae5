"""What every adapter needs: the extra's import, concurrent calls, and reply texts.

Adapters turn one model turn's tool calls into :class:`~eventstore.ToolEnvelope`s, run
them with :func:`invoke_all` (or :func:`invoke_all_sync` from threads), and turn each
reply into the stack's tool-result shape with :func:`reply_content` and
:func:`is_error`.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any, TypedDict

import msgspec

from eventstore.boundary.contracts import AgentReply, RunContext, ToolEnvelope, ToolError
from eventstore.boundary.tool_boundary import ToolBoundary
from eventstore.sync import SyncBoundary

_encoder = msgspec.json.Encoder()


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
    boundary: ToolBoundary, ctx: RunContext, envelopes: Sequence[ToolEnvelope]
) -> list[AgentReply]:
    """Run every call of one turn concurrently; the replies come in the calls' order."""
    return list(await asyncio.gather(*(boundary.invoke(ctx, envelope) for envelope in envelopes)))


def invoke_all_sync(
    boundary: SyncBoundary, ctx: RunContext, envelopes: Sequence[ToolEnvelope]
) -> list[AgentReply]:
    """:func:`invoke_all` from a thread, on the boundary's own event loop."""
    return boundary.invoke_all(ctx, envelopes)


def is_error(reply: AgentReply) -> bool:
    """Tell whether the agent should be told this call failed."""
    return isinstance(reply, ToolError)


def reply_payload(reply: AgentReply) -> Any:
    """What the model is shown: the bounded result, or the safe error (code and message)."""
    if isinstance(reply, ToolError):
        return {"error_code": reply.error_code.value, "message": reply.message}
    return reply.result


def reply_content(reply: AgentReply) -> str:
    """:func:`reply_payload` as compact JSON text, for stacks whose tool results are text."""
    return _encoder.encode(reply_payload(reply)).decode()


class ToolSchema(TypedDict):
    """How the model is told about one tool: what it does and its arguments' JSON Schema.

    The boundary's :class:`~eventstore.ToolSpec` says how a tool runs; this says how a
    framework presents it (the OpenAI function shape, which every stack accepts).
    """

    description: str
    parameters: dict[str, Any]


async def invoke_awaiting(
    boundary: ToolBoundary | SyncBoundary, ctx: RunContext, envelope: ToolEnvelope
) -> AgentReply:
    """Await one call from a running event loop, on either kind of boundary.

    A ``ToolBoundary`` runs it on this loop (its store must belong to this loop); a
    ``SyncBoundary`` runs it on its own loop, so a framework that starts a fresh loop
    (``run_sync``) still reaches the store.
    """
    if isinstance(boundary, SyncBoundary):
        return await boundary.ainvoke(ctx, envelope)
    return await boundary.invoke(ctx, envelope)


def invoke_blocking(
    boundary: ToolBoundary | SyncBoundary, ctx: RunContext, envelope: ToolEnvelope
) -> AgentReply:
    """Run one call from a thread without a loop of its own: that needs a ``SyncBoundary``.

    Raises:
        TypeError: ``boundary`` is an async ``ToolBoundary``, which only the event loop of
            its store may use.

    """
    if not isinstance(boundary, SyncBoundary):
        raise TypeError(
            "a synchronous run needs a SyncBoundary (eventstore.SyncBoundary): "
            "an async ToolBoundary belongs to its event loop"
        )
    return boundary.invoke(ctx, envelope)
