"""Claude's client tools through canon: ``tool_use`` blocks in, ``tool_result`` blocks out.

Give :func:`tool_results` (or :func:`tool_results_sync` from plain threads) the
``Message`` the SDK returned, or its dict form; append the assistant turn and the message
it returns, and ask for the next turn::

    messages += [{"role": "assistant", "content": message.content},
                 await tool_results(boundary, ctx, message)]

Every ``tool_use`` block runs through the boundary, all of one turn's concurrently; the
``tool_result`` blocks come in the order of the calls, each with the block's ``id`` as
``tool_use_id``, exactly as it came (``toolu_01…``, Vertex AI's ``toolu_vrtx_01…``,
Bedrock's ``tooluse_…``). A result is the text of its JSON; an error is the safe error
JSON (code and fixed message) with ``is_error: true``, so the model knows the call failed.
Server-side blocks (``server_tool_use``, ``web_search_tool_result``, code execution ...)
were already answered by Anthropic's servers and are skipped, as are text and thinking
blocks. A harness that may re-send a turn builds its boundary with
``on_duplicate="replay"``: a re-sent ``tool_use`` id gets its first reply again.

Governed tools (a ``ToolSpec`` with ``approval``): a call waiting for an operator is
answered with canon's pending payload (``{"status": "awaiting_approval", "approval_id":
..., "message": ...}``) without ``is_error``: the tool has not run, and the text tells
Claude not to retry it. Once an operator decided, call :func:`tool_results` again on the
same ``Message``: an approved call runs once, with the request canon recorded, and its
result answers the same ``tool_use_id``; a denied one is APPROVAL_DENIED with
``is_error: true``; calling again answers the same, running nothing (with
``on_duplicate="replay"``, the turn's other calls answer their recorded replies). A
pause holds a call: an approved call in a paused run is answered with the pending payload
again, and runs once when called after the unpause.

:func:`tool_results` takes either boundary (a ``SyncBoundary`` runs the calls on its own
loop); :func:`tool_results_sync` takes a ``SyncBoundary`` and refuses an async
``ToolBoundary`` with a ``TypeError`` before any call is recorded. :func:`tool_params`
builds the request's ``tools=`` from the boundary's ``ToolSpec``s (``description``,
``input_schema``), so each tool is described once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from canon.integrations._shared import (
    Boundary,
    ToolSchema,
    arguments_or_empty,
    invoke_all,
    invoke_all_sync,
    is_error,
    reply_content,
    require,
    tool_schemas,
)
from eventstore.boundary.contracts import AgentReply, RunContext, ToolEnvelope, ToolSpec

require("anthropic", "anthropic")

# After require(): without the extra, importing this module raises its one clear error.
from anthropic.types import (  # noqa: E402
    Message,
    MessageParam,
    ToolParam,
    ToolResultBlockParam,
)

__all__ = ["AnthropicMessage", "tool_params", "tool_results", "tool_results_sync", "tool_uses"]

#: What the adapter reads: the SDK's ``Message`` (or ``BetaMessage``), or its dict form.
AnthropicMessage = Message | Mapping[str, Any]


def tool_params(tools: Mapping[str, ToolSpec | ToolSchema]) -> list[ToolParam]:
    """The ``tools=`` of a Messages request: one client tool per name, in order.

    Args:
        tools: the boundary's ``{name: ToolSpec}`` (each one's ``description``, when it
            has one, and ``input_schema``, any object when it has none), or ToolSchemas.

    """
    params: list[ToolParam] = []
    for name, schema in tool_schemas(tools).items():
        param: ToolParam = {"name": name, "input_schema": schema["parameters"]}
        if schema["description"]:
            param["description"] = schema["description"]
        params.append(param)
    return params


def _field(item: Any, name: str) -> Any:
    """A field of an SDK model or of its dict form; None when absent."""
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def _tool_use_blocks(message: Any) -> list[Any]:
    """The client ``tool_use`` blocks in their order; every other block is not ours."""
    content = _field(message, "content")
    if isinstance(content, str) or not isinstance(content, Sequence):
        return []
    return [block for block in content if _field(block, "type") == "tool_use"]


def _envelope(ctx: RunContext, block: Any) -> ToolEnvelope:
    arguments = _field(block, "input")
    return ToolEnvelope(
        run_id=ctx.run_id,
        tool_call_id=_field(block, "id"),
        tool=_field(block, "name"),
        # The SDK parses ``input`` into an object; a dict form may lack it (a call
        # without parameters). Anything else reaches the boundary as sent.
        arguments=arguments if isinstance(arguments, Mapping) else arguments_or_empty(arguments),
    )


def tool_uses(ctx: RunContext, message: AnthropicMessage) -> list[ToolEnvelope]:
    """The envelopes of the message's client ``tool_use`` blocks, in their order."""
    return [_envelope(ctx, block) for block in _tool_use_blocks(message)]


def _tool_result(block: Any, reply: AgentReply) -> ToolResultBlockParam:
    result: ToolResultBlockParam = {
        "type": "tool_result",
        # The block's own id, not the reply's: a refused unsafe id is never in a reply,
        # yet the API needs the tool_use answered.
        "tool_use_id": _field(block, "id"),
        "content": reply_content(reply),
    }
    if is_error(reply):
        result["is_error"] = True
    toolset = _field(block, "toolset_name")
    if toolset is not None:  # a toolset member's result names its family, as its call did
        result["toolset_name"] = toolset
    return result


def _user_message(blocks: Sequence[Any], replies: Sequence[AgentReply]) -> MessageParam:
    return {
        "role": "user",
        "content": [
            _tool_result(block, reply) for block, reply in zip(blocks, replies, strict=True)
        ],
    }


async def tool_results(
    boundary: Boundary, ctx: RunContext, message: AnthropicMessage
) -> MessageParam:
    """Run the message's ``tool_use`` blocks concurrently; return the ``user`` message.

    It holds one ``tool_result`` per call, in the calls' order; its ``content`` is empty
    when the message asked for no client tool (then the turn is over: ``stop_reason`` is
    not ``"tool_use"``).
    """
    blocks = _tool_use_blocks(message)
    replies = await invoke_all(boundary, ctx, [_envelope(ctx, block) for block in blocks])
    return _user_message(blocks, replies)


def tool_results_sync(
    boundary: Boundary, ctx: RunContext, message: AnthropicMessage
) -> MessageParam:
    """:func:`tool_results` for code without an event loop, through a ``SyncBoundary``.

    Raises:
        TypeError: ``boundary`` is an async ``ToolBoundary``; nothing was run or recorded.

    """
    blocks = _tool_use_blocks(message)
    replies = invoke_all_sync(boundary, ctx, [_envelope(ctx, block) for block in blocks])
    return _user_message(blocks, replies)
