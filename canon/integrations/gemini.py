"""Gemini's function calls through canon (google-genai): ``function_call`` parts answered.

Give :func:`function_responses` (or :func:`function_responses_sync` from plain threads)
the model's turn and send the ``Content`` it returns; its ``parts`` are empty when the
model called no function (the turn is over)::

    while (answers := await function_responses(boundary, ctx, response)).parts:
        contents += [response.candidates[0].content, answers]
        response = await client.aio.models.generate_content(...)

The turn is what the SDK gave: a ``GenerateContentResponse``, one ``Content``, the dict
form of either, the list of a stream's chunks (``generate_content_stream``), or a
``Chat`` / ``AsyncChat`` (``chats.create``, the SDK's recommended path: its last model
turn is answered; send the answer with ``chat.send_message(answers.parts)``).

Every ``function_call`` part runs through the boundary, all of one turn's concurrently;
the ``function_response`` parts come in the order of the calls, in one ``Content`` of
role ``"user"`` (the role the SDK's own automatic function calling answers with, and the
API's: a content is ``"user"`` or ``"model"``). Each is named like its call and says
``{"output": <result>}`` or ``{"error": {"error_code": ..., "message": ...}}``, the keys
Gemini documents for a function's output and its error. A governed call waiting for an
operator is an output, ``{"output": {"status": "awaiting_approval", "approval_id": ...,
"message": ...}}`` (not run, not to be retried); once an operator decided, answering the
same turn again runs an approved call once (its output under the same call) or gives a
denied one's ``{"error": {"error_code": "APPROVAL_DENIED", ...}}``, running nothing more
(``on_duplicate="replay"`` answers the turn's other calls from their records). A pause
holds a call: an approved call in a paused run is the pending output again, and runs
once when the turn is answered after the unpause.

A call without ``args`` is a call without parameters (``{}``). Server-side parts
(``tool_call``, ``tool_response``, ``executable_code``, ``code_execution_result``) and
text are not ours and are skipped.

Ids: canon keys each record by the provider's own tool call id and never invents one.
Gemini 3 models give each ``function_call`` an ``id``: it is used as it came, and echoed
in the ``function_response``'s ``id``. Gemini 2.x models send no id, so the harness says
how to name such a call with ``call_ids``, a function of (response id, candidate index,
part index): values fixed by the model's response, so a re-sent turn names its calls the
same and ``on_duplicate="replay"`` finds their records. The part index is the part's
place in the whole turn: in a stream, counted across the chunks in their order, so two
chunks' calls never share an id. One chunk alone (a candidate without ``finish_reason``)
is not a whole turn, and naming its calls is refused (:class:`MissingCallId`): pass the
chunks together. The default, :func:`response_part_ids`, also refuses a turn without
``response_id`` rather than guess (a ``Content`` and a chat keep none: pass
``response_id=``). Such a derived id names the call in canon only; it is never sent to
Gemini, which matches a 2.x response to its call by order and name.

Automatic function calling is refused: with Python functions in ``tools`` the SDK calls
them itself, with the arguments only (no call id, and none at all from Gemini 2.x), so
no wrapper could record them under the model's call. A turn on which the SDK ran
functions raises :class:`AutomaticFunctionCallingRefused`, whichever entry point ran
them: ``models.generate_content`` and ``generate_content_stream`` mark their responses
(``automatic_function_calling_history``), and a chat keeps the SDK's answers in its
history (a ``function_response`` that is not canon's). Declare the tools with
:func:`function_declarations` instead: built from the boundary's ``ToolSpec``s, they are
``types.FunctionDeclaration``s, which the SDK never runs (and with which it turns
automatic calling off for the whole request).

:func:`function_responses` takes either boundary (a ``SyncBoundary`` runs the calls on
its own loop); :func:`function_responses_sync` takes a ``SyncBoundary`` and refuses an
async ``ToolBoundary`` with a ``TypeError`` before any call is recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from canon.integrations._shared import (
    Boundary,
    ToolSchema,
    invoke_all,
    invoke_all_sync,
    is_error,
    reply_payload,
    require,
    tool_schemas,
)
from eventstore.boundary.contracts import AgentReply, RunContext, ToolEnvelope, ToolSpec
from machine.errors import InvalidArgument

require("google.genai", "gemini")

# After require(): without the extra, importing this module raises its one clear error.
from google.genai import types  # noqa: E402
from google.genai.chats import AsyncChat, Chat  # noqa: E402

__all__ = [
    "AutomaticFunctionCallingRefused",
    "CallIds",
    "GeminiTurn",
    "MissingCallId",
    "function_calls",
    "function_declarations",
    "function_responses",
    "function_responses_sync",
    "response_part_ids",
]

#: One response of the model, as the SDK parsed it or as plain data.
GeminiResponse = types.GenerateContentResponse | Mapping[str, Any]
#: What the adapter reads: a response, one ``Content``, a dict form of either, a stream's
#: chunks in order, or a chat (its last model turn).
GeminiTurn = (
    types.GenerateContentResponse
    | types.Content
    | Mapping[str, Any]
    | Sequence[GeminiResponse]
    | Chat
    | AsyncChat
)
#: Names a call that came without an id: (response id, candidate index, part index) -> id.
CallIds = Callable[[str | None, int, int], str]

#: The keys of canon's answers: ``{"output": ...}`` or ``{"error": {<the safe error>}}``.
_OUTPUT, _ERROR = "output", "error"
_SAFE_ERROR_KEYS = frozenset({"error_code", "message"})


class MissingCallId(InvalidArgument):
    """Raised when a function call has no id and ``call_ids`` cannot derive one.

    By default: the call came from a Gemini 2.x model (no ``function_call.id``) in a
    turn without ``response_id`` (a response without one, or a ``Content`` or chat given
    no ``response_id``), or in one chunk of a stream given alone. Nothing was run.
    """


class AutomaticFunctionCallingRefused(InvalidArgument):
    """Raised when the SDK already ran Python functions itself (automatic function calling).

    Those calls ran outside canon and have no record; declare the tools as
    ``types.FunctionDeclaration``s (:func:`function_declarations`) so that every call
    comes back to the harness. Nothing was run through canon.
    """


def function_declarations(
    tools: Mapping[str, ToolSpec | ToolSchema],
) -> list[types.FunctionDeclaration]:
    """The ``types.FunctionDeclaration`` of each tool, by name and in order.

    Args:
        tools: the boundary's ``{name: ToolSpec}`` (each one's ``description`` and
            ``input_schema``; any object when it has none), or ToolSchemas.

    Use them as ``types.Tool(function_declarations=function_declarations(TOOLS))``: the
    SDK only declares them to the model and never calls anything itself.
    """
    return [
        types.FunctionDeclaration(
            name=name,
            description=schema["description"] or None,
            parameters_json_schema=schema["parameters"],
        )
        for name, schema in tool_schemas(tools).items()
    ]


def response_part_ids(response_id: str | None, candidate_index: int, part_index: int) -> str:
    """The default :data:`CallIds`: ``"<response_id>.<candidate_index>.<part_index>"``.

    Gemini's response ids are URL-safe base64 text, so the dots keep the three apart.

    Raises:
        MissingCallId: there is no response id to derive the call's id from.

    """
    if not response_id:
        raise MissingCallId(
            "a Gemini function call has no id and its response no response_id: pass "
            "function_responses(..., response_id=...) or call_ids=... to name it"
        )
    return f"{response_id}.{candidate_index}.{part_index}"


def _refuse_automatic_calls() -> AutomaticFunctionCallingRefused:
    return AutomaticFunctionCallingRefused(
        "the SDK ran Python functions itself (automatic function calling), outside "
        "canon: declare the tools as types.FunctionDeclaration instead "
        "(canon.integrations.gemini.function_declarations)"
    )


def _answered_by_canon(answer: types.FunctionResponse) -> bool:
    """Tell whether a ``function_response`` has the shape of canon's answers.

    The SDK's automatic calls answer ``{"result": ...}`` or ``{"error": "<text>"}``.
    """
    response = answer.response or {}
    if set(response) == {_OUTPUT}:
        return True
    error = response.get(_ERROR)
    return (
        set(response) == {_ERROR} and isinstance(error, Mapping) and set(error) == _SAFE_ERROR_KEYS
    )


def _response_parts(
    response: types.GenerateContentResponse, candidate_index: int
) -> tuple[list[types.Part], bool]:
    """One response's parts of the candidate, and whether it is a whole turn.

    Raises:
        AutomaticFunctionCallingRefused: the SDK ran functions for this response.

    """
    for earlier in response.automatic_function_calling_history or ():
        if any(part.function_response is not None for part in earlier.parts or ()):
            raise _refuse_automatic_calls()
    candidates = response.candidates or []
    if candidate_index >= len(candidates):
        return [], True
    candidate = candidates[candidate_index]
    parts = list(candidate.content.parts or []) if candidate.content is not None else []
    return parts, candidate.finish_reason is not None


def _chat_turn(chat: Chat | AsyncChat) -> list[types.Part]:
    """The parts of a chat's last model turn (one content, or one per streamed chunk).

    Raises:
        AutomaticFunctionCallingRefused: since the user's last message, the chat holds a
            function response that is not canon's: the SDK answered a call itself.

    """
    history = chat.get_history()
    start = len(history)
    while start > 0 and history[start - 1].role == "model":
        start -= 1
    asked = max(
        (
            index
            for index, content in enumerate(history)
            if content.role == "user" and not _function_responses_of(content)
        ),
        default=0,
    )
    for content in history[asked:start]:
        if not all(_answered_by_canon(answer) for answer in _function_responses_of(content)):
            raise _refuse_automatic_calls()
    return [part for content in history[start:] for part in content.parts or ()]


def _function_responses_of(content: types.Content) -> list[types.FunctionResponse]:
    return [part.function_response for part in content.parts or () if part.function_response]


def _turn_parts(
    turn: GeminiTurn, candidate_index: int, response_id: str | None
) -> tuple[list[types.Part], str | None, bool]:
    """The turn's parts in order, the response id to derive ids from, and whether whole.

    Not whole: one chunk of a stream, whose part indexes are not places in the turn.
    """
    if isinstance(turn, Chat | AsyncChat):
        return _chat_turn(turn), response_id, True
    if isinstance(turn, Mapping):
        model = types.GenerateContentResponse if "candidates" in turn else types.Content
        turn = model.model_validate(turn)
    if isinstance(turn, types.Content):
        return list(turn.parts or []), response_id, True
    if isinstance(turn, types.GenerateContentResponse):
        parts, whole = _response_parts(turn, candidate_index)
        return parts, response_id if response_id is not None else turn.response_id, whole
    # A stream's chunks, in order: their parts make the turn.
    chunks = [types.GenerateContentResponse.model_validate(chunk) for chunk in turn]
    parts = [part for chunk in chunks for part in _response_parts(chunk, candidate_index)[0]]
    if response_id is None:
        response_id = next((chunk.response_id for chunk in chunks if chunk.response_id), None)
    return parts, response_id, True


def _calls(
    ctx: RunContext,
    turn: GeminiTurn,
    candidate_index: int,
    call_ids: CallIds,
    response_id: str | None,
) -> list[tuple[types.FunctionCall, ToolEnvelope]]:
    parts, response_id, whole = _turn_parts(turn, candidate_index, response_id)
    calls = []
    for part_index, part in enumerate(parts):
        call = part.function_call
        if call is None:
            continue
        if call.id is not None:
            call_id = call.id
        elif not whole:
            raise MissingCallId(
                "a Gemini function call without id in one chunk of a stream: its place in "
                "the turn is unknown, so pass the stream's chunks together (a list)"
            )
        else:
            call_id = call_ids(response_id, candidate_index, part_index)
        envelope = ToolEnvelope(
            run_id=ctx.run_id,
            tool_call_id=call_id,
            tool=call.name or "",
            # The SDK leaves ``args`` unset for a call without parameters.
            arguments=call.args if call.args is not None else {},
        )
        calls.append((call, envelope))
    return calls


def function_calls(
    ctx: RunContext,
    turn: GeminiTurn,
    *,
    candidate_index: int = 0,
    call_ids: CallIds = response_part_ids,
    response_id: str | None = None,
) -> list[ToolEnvelope]:
    """The envelopes of the turn's ``function_call`` parts, in their order.

    Raises:
        MissingCallId: a call has no id and ``call_ids`` refused to derive one.
        AutomaticFunctionCallingRefused: the SDK already ran functions on this turn.

    """
    return [envelope for _, envelope in _calls(ctx, turn, candidate_index, call_ids, response_id)]


def _function_response(call: types.FunctionCall, reply: AgentReply) -> types.Part:
    key = _ERROR if is_error(reply) else _OUTPUT
    return types.Part(
        function_response=types.FunctionResponse(
            id=call.id, name=call.name, response={key: reply_payload(reply)}
        )
    )


def _content(
    calls: Sequence[tuple[types.FunctionCall, ToolEnvelope]], replies: Sequence[AgentReply]
) -> types.Content:
    parts = [
        _function_response(call, reply) for (call, _), reply in zip(calls, replies, strict=True)
    ]
    return types.Content(role="user", parts=parts)


async def function_responses(
    boundary: Boundary,
    ctx: RunContext,
    turn: GeminiTurn,
    *,
    candidate_index: int = 0,
    call_ids: CallIds = response_part_ids,
    response_id: str | None = None,
) -> types.Content:
    """Run the turn's function calls concurrently; return the ``Content`` that answers them.

    It holds one ``function_response`` part per call, in the calls' order; its ``parts``
    are empty when the turn called no function (then the turn is over).

    Args:
        boundary: the boundary that runs the tools, either kind.
        ctx: the run.
        turn: the model's response, one ``Content`` of it (dict forms too), the list of
            a stream's chunks, or the chat whose last model turn to answer.
        candidate_index: which candidate of a response is the model's turn.
        call_ids: names each call that came without an id (Gemini 2.x).
        response_id: the response id for ``call_ids`` (default: the response's own;
            give it with a bare ``Content`` or a chat).

    Raises:
        MissingCallId: a call has no id and ``call_ids`` refused to derive one; no call
            ran.
        AutomaticFunctionCallingRefused: the SDK already ran functions on this turn; no
            call ran through canon.

    """
    calls = _calls(ctx, turn, candidate_index, call_ids, response_id)
    replies = await invoke_all(boundary, ctx, [envelope for _, envelope in calls])
    return _content(calls, replies)


def function_responses_sync(
    boundary: Boundary,
    ctx: RunContext,
    turn: GeminiTurn,
    *,
    candidate_index: int = 0,
    call_ids: CallIds = response_part_ids,
    response_id: str | None = None,
) -> types.Content:
    """:func:`function_responses` for code without an event loop, through a ``SyncBoundary``.

    Raises:
        TypeError: ``boundary`` is an async ``ToolBoundary``; nothing was run or recorded.
        MissingCallId: a call has no id and ``call_ids`` refused to derive one.
        AutomaticFunctionCallingRefused: the SDK already ran functions on this turn.

    """
    calls = _calls(ctx, turn, candidate_index, call_ids, response_id)
    replies = invoke_all_sync(boundary, ctx, [envelope for _, envelope in calls])
    return _content(calls, replies)
