"""OpenAI tool calls through a ``ToolBoundary``: Chat Completions and the Responses API.

Chat Completions: :func:`tool_messages` takes the assistant's ``ChatCompletionMessage``
(or its dict form) and returns the ``role: "tool"`` messages to append, one per tool call,
in the calls' order, each with the call's ``tool_call_id`` exactly as the model sent it.

Responses API: :func:`call_outputs` takes a ``Response`` (or its ``output`` items) and
returns the ``function_call_output`` / ``custom_tool_call_output`` input items for the next
request, keyed by ``call_id``; reasoning, message and hosted-tool items are skipped.

Every call of one turn runs concurrently through the boundary. Arguments reach it as the
model sent them, with one normalization: empty arguments (``""``, or a dict form's
``null``: a call of a tool without parameters) are ``{}``; truncated or non-object JSON is
refused there as INVALID_INPUT. A custom (free-form) tool's text input becomes
``{"input": text}``. An error reply becomes the tool's output all the same: the safe error
JSON (code and fixed message), which the model can read. Streaming users pass the
assembled message or the final response. The ``*_sync`` variants take a
:class:`~eventstore.sync.SyncBoundary`, for the sync client.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from canon.integrations._shared import (
    arguments_or_empty,
    invoke_all,
    invoke_all_sync,
    reply_content,
    require,
)
from eventstore.boundary.contracts import AgentReply, RunContext, ToolEnvelope
from eventstore.boundary.tool_boundary import ToolBoundary
from eventstore.sync import SyncBoundary

require("openai", "openai")

from openai.types.chat import (  # noqa: E402  (only once the SDK is known to be there)
    ChatCompletionMessage,
    ChatCompletionToolMessageParam,
)
from openai.types.responses import Response, ResponseInputItemParam  # noqa: E402

__all__ = ["call_outputs", "call_outputs_sync", "tool_messages", "tool_messages_sync"]

#: A Chat Completions assistant message, as the SDK parsed it or as plain data.
ChatMessage = ChatCompletionMessage | Mapping[str, Any]
#: A Responses API response, or its output items (SDK models or plain data).
ResponseOutput = Response | Iterable[Any]

#: The input item type that answers each output item type that calls a tool.
_CALL_OUTPUT_TYPES = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
}


def _get(item: Any, name: str) -> Any:
    """A field of an SDK model or of its dict form."""
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def _chat_calls(message: ChatMessage) -> list[Any]:
    return list(_get(message, "tool_calls") or [])


def _chat_envelope(ctx: RunContext, call: Any) -> ToolEnvelope:
    custom = _get(call, "custom")
    arguments: Mapping[str, Any] | str | bytes
    if _get(call, "type") == "custom" and custom is not None:
        tool, arguments = _get(custom, "name"), {"input": _get(custom, "input")}
    else:
        function = _get(call, "function")
        tool = _get(function, "name")
        arguments = arguments_or_empty(_get(function, "arguments"))
    return ToolEnvelope(
        run_id=ctx.run_id, tool_call_id=_get(call, "id"), tool=tool, arguments=arguments
    )


def _chat_replies(
    calls: list[Any], replies: list[AgentReply]
) -> list[ChatCompletionToolMessageParam]:
    # The id the model sent is echoed, not the reply's: the API pairs every call with
    # its answer, and a refused id (never echoed in a reply) still needs one.
    return [
        {"role": "tool", "tool_call_id": _get(call, "id"), "content": reply_content(reply)}
        for call, reply in zip(calls, replies, strict=True)
    ]


async def tool_messages(
    boundary: ToolBoundary, ctx: RunContext, message: ChatMessage
) -> list[ChatCompletionToolMessageParam]:
    """Run the message's tool calls; return the ``role: "tool"`` messages to append.

    Args:
        boundary: the boundary that runs the tools (its ``on_duplicate`` decides what a
            re-sent turn gets: ``"replay"`` answers it from the records).
        ctx: the run the calls belong to.
        message: ``completion.choices[0].message`` (or its dict form); a message without
            tool calls gives ``[]``.

    """
    calls = _chat_calls(message)
    replies = await invoke_all(boundary, ctx, [_chat_envelope(ctx, call) for call in calls])
    return _chat_replies(calls, replies)


def tool_messages_sync(
    boundary: SyncBoundary, ctx: RunContext, message: ChatMessage
) -> list[ChatCompletionToolMessageParam]:
    """:func:`tool_messages` for the sync client, through a ``SyncBoundary``."""
    calls = _chat_calls(message)
    replies = invoke_all_sync(boundary, ctx, [_chat_envelope(ctx, call) for call in calls])
    return _chat_replies(calls, replies)


def _response_calls(output: ResponseOutput) -> list[Any]:
    items = output.output if isinstance(output, Response) else output
    return [item for item in items if _get(item, "type") in _CALL_OUTPUT_TYPES]


def _response_envelope(ctx: RunContext, item: Any) -> ToolEnvelope:
    name, namespace = _get(item, "name"), _get(item, "namespace")
    # A namespaced function is the tool ``namespace.name``, as the Agents SDK names it.
    tool = f"{namespace}.{name}" if namespace else name
    if _get(item, "type") == "custom_tool_call":
        arguments: Mapping[str, Any] | str | bytes = {"input": _get(item, "input")}
    else:
        arguments = arguments_or_empty(_get(item, "arguments"))
    return ToolEnvelope(
        run_id=ctx.run_id, tool_call_id=_get(item, "call_id"), tool=tool, arguments=arguments
    )


def _caller(item: Any) -> Any:
    caller = _get(item, "caller")
    if caller is None or isinstance(caller, Mapping):
        return caller
    return caller.model_dump(mode="json", exclude_none=True)


def _response_replies(items: list[Any], replies: list[AgentReply]) -> list[ResponseInputItemParam]:
    outputs: list[ResponseInputItemParam] = []
    for item, reply in zip(items, replies, strict=True):
        output: dict[str, Any] = {
            "type": _CALL_OUTPUT_TYPES[_get(item, "type")],
            "call_id": _get(item, "call_id"),
            "output": reply_content(reply),
        }
        # A call made by a hosted program is answered to that program (as the SDK does).
        caller = _caller(item)
        if caller is not None:
            output["caller"] = caller
        outputs.append(output)  # type: ignore[arg-type]  # one of the two TypedDicts
    return outputs


async def call_outputs(
    boundary: ToolBoundary, ctx: RunContext, response: ResponseOutput
) -> list[ResponseInputItemParam]:
    """Run a response's function and custom tool calls; return their output items.

    Args:
        boundary: the boundary that runs the tools.
        ctx: the run the calls belong to.
        response: the ``Response`` (``stream.get_final_response()`` when streaming) or
            its ``output`` items; items other than ``function_call`` and
            ``custom_tool_call`` are skipped.

    Returns:
        The ``function_call_output`` / ``custom_tool_call_output`` items, in the calls'
        order, to send as (part of) the next request's ``input``.

    """
    items = _response_calls(response)
    replies = await invoke_all(boundary, ctx, [_response_envelope(ctx, item) for item in items])
    return _response_replies(items, replies)


def call_outputs_sync(
    boundary: SyncBoundary, ctx: RunContext, response: ResponseOutput
) -> list[ResponseInputItemParam]:
    """:func:`call_outputs` for the sync client, through a ``SyncBoundary``."""
    items = _response_calls(response)
    replies = invoke_all_sync(boundary, ctx, [_response_envelope(ctx, item) for item in items])
    return _response_replies(items, replies)
