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
``{"input": text}``. A result is its JSON text. An error reply becomes the tool's output
all the same, flagged the one way a text output can be: ``Error: `` then the safe error
JSON (code and fixed message), which the model can read and which is never valid JSON,
so it cannot be mistaken for a result (a tool may itself answer ``{"error_code": ...}``).
Streaming users pass the assembled message or the final response.

Governed tools (a ``ToolSpec`` with ``approval``): a call waiting for an operator is
answered with canon's pending payload, ``{"status": "awaiting_approval", "approval_id":
..., "message": ...}``, as a result (no ``Error: ``): the tool has not run and the text
tells the model not to retry it. Once an operator decided, call :func:`tool_messages`
(or :func:`call_outputs`) again on the same assistant message: an approved call runs
once, with the request canon recorded, and its output answers the same ``tool_call_id``;
a denied one is the ``Error: `` APPROVAL_DENIED text; calling again answers the same,
running nothing. Build the boundary with ``on_duplicate="replay"`` when the message holds
other calls too, so that they answer their recorded replies. A pause holds a call: an
approved call in a paused run is answered with the pending payload again (not
``Error: RUN_PAUSED``), and runs once when called after the unpause.

Sync and async: the async functions take either boundary (a ``SyncBoundary`` runs the
calls on its own loop while this one waits); the ``*_sync`` variants, for the sync
client, take a :class:`~eventstore.sync.SyncBoundary` and refuse an async
``ToolBoundary`` with a ``TypeError`` before any call is recorded.

What the model is told: :func:`chat_tools` and :func:`response_tools` build the
``tools=`` of a request from the boundary's ``ToolSpec``s (name, ``description``,
``input_schema``), so each tool is described once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from canon.integrations._shared import (
    ERROR_PREFIX,
    Boundary,
    ToolSchema,
    arguments_or_empty,
    flagged_content,
    invoke_all,
    invoke_all_sync,
    require,
    tool_schemas,
)
from eventstore.boundary.contracts import AgentReply, RunContext, ToolEnvelope, ToolSpec

require("openai", "openai")

from openai.types.chat import (  # noqa: E402  (only once the SDK is known to be there)
    ChatCompletionFunctionToolParam,
    ChatCompletionMessage,
    ChatCompletionToolMessageParam,
)
from openai.types.responses import (  # noqa: E402
    FunctionToolParam,
    Response,
    ResponseInputItemParam,
)
from openai.types.shared_params import FunctionDefinition  # noqa: E402

__all__ = [
    "ERROR_PREFIX",
    "call_outputs",
    "call_outputs_sync",
    "chat_tools",
    "response_tools",
    "tool_messages",
    "tool_messages_sync",
]

#: A Chat Completions assistant message, as the SDK parsed it or as plain data.
ChatMessage = ChatCompletionMessage | Mapping[str, Any]
#: A Responses API response, or its output items (SDK models or plain data).
ResponseOutput = Response | Iterable[Any]

#: The input item type that answers each output item type that calls a tool.
_CALL_OUTPUT_TYPES = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
}


def chat_tools(
    tools: Mapping[str, ToolSpec | ToolSchema], *, strict: bool | None = None
) -> list[ChatCompletionFunctionToolParam]:
    """The Chat Completions ``tools=`` of ``tools``: one function per name, in order.

    Args:
        tools: the boundary's ``{name: ToolSpec}`` (each one's ``description``, when it
            has one, and ``input_schema``, any object when it has none), or ToolSchemas.
        strict: the function's ``strict`` flag (None: not sent, the API's default).

    """
    definitions: list[ChatCompletionFunctionToolParam] = []
    for name, schema in tool_schemas(tools).items():
        function: FunctionDefinition = {"name": name, "parameters": schema["parameters"]}
        if schema["description"]:
            function["description"] = schema["description"]
        if strict is not None:
            function["strict"] = strict
        definitions.append({"type": "function", "function": function})
    return definitions


def response_tools(
    tools: Mapping[str, ToolSpec | ToolSchema], *, strict: bool | None = None
) -> list[FunctionToolParam]:
    """The Responses API ``tools=`` of ``tools``: one function per name, in order.

    Args:
        tools: the boundary's ``{name: ToolSpec}``, or ToolSchemas (see :func:`chat_tools`).
        strict: the function's ``strict`` flag (None: the API's default).

    """
    definitions: list[FunctionToolParam] = []
    for name, schema in tool_schemas(tools).items():
        function: FunctionToolParam = {
            "type": "function",
            "name": name,
            "parameters": schema["parameters"],
            "strict": strict,
        }
        if schema["description"]:
            function["description"] = schema["description"]
        definitions.append(function)
    return definitions


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
        {"role": "tool", "tool_call_id": _get(call, "id"), "content": flagged_content(reply)}
        for call, reply in zip(calls, replies, strict=True)
    ]


async def tool_messages(
    boundary: Boundary, ctx: RunContext, message: ChatMessage
) -> list[ChatCompletionToolMessageParam]:
    """Run the message's tool calls; return the ``role: "tool"`` messages to append.

    Args:
        boundary: the boundary that runs the tools, either kind (its ``on_duplicate``
            decides what a re-sent turn gets: ``"replay"`` answers it from the records).
        ctx: the run the calls belong to.
        message: ``completion.choices[0].message`` (or its dict form); a message without
            tool calls gives ``[]``.

    """
    calls = _chat_calls(message)
    replies = await invoke_all(boundary, ctx, [_chat_envelope(ctx, call) for call in calls])
    return _chat_replies(calls, replies)


def tool_messages_sync(
    boundary: Boundary, ctx: RunContext, message: ChatMessage
) -> list[ChatCompletionToolMessageParam]:
    """:func:`tool_messages` for the sync client, through a ``SyncBoundary``.

    Raises:
        TypeError: ``boundary`` is an async ``ToolBoundary``; nothing was run or recorded.

    """
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
            "output": flagged_content(reply),
        }
        # A call made by a hosted program is answered to that program (as the SDK does).
        caller = _caller(item)
        if caller is not None:
            output["caller"] = caller
        outputs.append(output)  # type: ignore[arg-type]  # one of the two TypedDicts
    return outputs


async def call_outputs(
    boundary: Boundary, ctx: RunContext, response: ResponseOutput
) -> list[ResponseInputItemParam]:
    """Run a response's function and custom tool calls; return their output items.

    Args:
        boundary: the boundary that runs the tools, either kind.
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
    boundary: Boundary, ctx: RunContext, response: ResponseOutput
) -> list[ResponseInputItemParam]:
    """:func:`call_outputs` for the sync client, through a ``SyncBoundary``.

    Raises:
        TypeError: ``boundary`` is an async ``ToolBoundary``; nothing was run or recorded.

    """
    items = _response_calls(response)
    replies = invoke_all_sync(boundary, ctx, [_response_envelope(ctx, item) for item in items])
    return _response_replies(items, replies)
