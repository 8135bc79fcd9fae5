"""Gemini's function calls through canon (google-genai): ``function_call`` parts answered.

Give :func:`function_responses` (or :func:`function_responses_sync` from plain threads)
the ``GenerateContentResponse`` the SDK returned (or a ``Content``, or the dict form of
either); append the model's content and the ``Content`` it returns, and ask for the next
turn::

    contents += [response.candidates[0].content,
                 await function_responses(boundary, ctx, response)]

Every ``function_call`` part runs through the boundary, all of one turn's concurrently;
the ``function_response`` parts come in the order of the calls, in one ``Content`` of
role ``"user"`` (the role the SDK's own automatic function calling answers with, and the
API's: a content is ``"user"`` or ``"model"``). Each is named like its call and says
``{"output": <result>}`` or ``{"error": {"error_code": ..., "message": ...}}``, the keys
Gemini documents for a function's output and its error. A call without ``args`` is a
call without parameters (``{}``). Server-side parts (``tool_call``, ``tool_response``,
``executable_code``, ``code_execution_result``) and text are not ours and are skipped.
Streaming users pass the assembled ``Content`` and the stream's ``response_id``.

Ids: canon keys each record by the provider's own tool call id and never invents one.
Gemini 3 models give each ``function_call`` an ``id``: it is used as it came, and echoed
in the ``function_response``'s ``id``. Gemini 2.x models send no id, so the harness says
how to name such a call with ``call_ids``, a function of (response id, candidate index,
part index): values fixed by the model's response, so a re-sent turn names its calls the
same and ``on_duplicate="replay"`` finds their records. The default,
:func:`response_part_ids`, refuses a response without ``response_id``
(:class:`MissingCallId`) rather than guess. Such a derived id names the call in canon
only; it is never sent to Gemini, which matches a 2.x response to its call by order and
name.

Automatic function calling is refused: with Python functions in ``tools`` the SDK calls
them itself, with the arguments only (no call id, and none at all from Gemini 2.x), so
no wrapper could record them under the model's call. A response on which the SDK already
ran functions raises :class:`AutomaticFunctionCallingRefused`; declare the tools as
``types.FunctionDeclaration``s instead (the SDK then runs nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from canon.integrations._shared import invoke_all, invoke_all_sync, is_error, reply_payload, require
from eventstore.boundary.contracts import AgentReply, RunContext, ToolEnvelope
from eventstore.boundary.tool_boundary import ToolBoundary
from eventstore.sync import SyncBoundary
from machine.errors import InvalidArgument

require("google.genai", "gemini")

# After require(): without the extra, importing this module raises its one clear error.
from google.genai import types  # noqa: E402

__all__ = [
    "AutomaticFunctionCallingRefused",
    "CallIds",
    "GeminiTurn",
    "MissingCallId",
    "function_calls",
    "function_responses",
    "function_responses_sync",
    "response_part_ids",
]

#: What the adapter reads: a response, one ``Content``, or the dict form of either.
GeminiTurn = types.GenerateContentResponse | types.Content | Mapping[str, Any]
#: Names a call that came without an id: (response id, candidate index, part index) -> id.
CallIds = Callable[[str | None, int, int], str]


class MissingCallId(InvalidArgument):
    """Raised when a function call has no id and ``call_ids`` cannot derive one.

    By default: the call came from a Gemini 2.x model (no ``function_call.id``) in a
    response without ``response_id``, or in a bare ``Content`` given no ``response_id``.
    Nothing was run.
    """


class AutomaticFunctionCallingRefused(InvalidArgument):
    """Raised when the SDK already ran Python functions itself (automatic function calling).

    Those calls ran outside canon and have no record; declare the tools as
    ``types.FunctionDeclaration``s so that every call comes back to the harness.
    """


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


def _content_of(
    turn: GeminiTurn, candidate_index: int, response_id: str | None
) -> tuple[types.Content | None, str | None]:
    """The turn's content and the response id its calls' ids may be derived from."""
    if isinstance(turn, Mapping):
        model = types.GenerateContentResponse if "candidates" in turn else types.Content
        turn = model.model_validate(turn)
    if isinstance(turn, types.Content):
        return turn, response_id
    for earlier in turn.automatic_function_calling_history or ():
        if any(part.function_response is not None for part in earlier.parts or ()):
            raise AutomaticFunctionCallingRefused(
                "the SDK ran Python functions itself (automatic function calling), outside "
                "canon: declare the tools as types.FunctionDeclaration instead"
            )
    candidates = turn.candidates or []
    content = candidates[candidate_index].content if candidate_index < len(candidates) else None
    return content, response_id if response_id is not None else turn.response_id


def _calls(
    ctx: RunContext,
    turn: GeminiTurn,
    candidate_index: int,
    call_ids: CallIds,
    response_id: str | None,
) -> list[tuple[types.FunctionCall, ToolEnvelope]]:
    content, response_id = _content_of(turn, candidate_index, response_id)
    calls = []
    parts = (content.parts if content is not None else None) or []
    for part_index, part in enumerate(parts):
        call = part.function_call
        if call is None:
            continue
        call_id = (
            call.id if call.id is not None else call_ids(response_id, candidate_index, part_index)
        )
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
        AutomaticFunctionCallingRefused: the SDK already ran functions on this response.

    """
    return [envelope for _, envelope in _calls(ctx, turn, candidate_index, call_ids, response_id)]


def _function_response(call: types.FunctionCall, reply: AgentReply) -> types.Part:
    key = "error" if is_error(reply) else "output"
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
    boundary: ToolBoundary,
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
        boundary: the boundary that runs the tools.
        ctx: the run.
        turn: the model's response, or one ``Content`` of it (dict forms too).
        candidate_index: which candidate of a response is the model's turn.
        call_ids: names each call that came without an id (Gemini 2.x).
        response_id: the response id for ``call_ids`` (default: the response's own;
            give it with a bare ``Content``).

    Raises:
        MissingCallId: a call has no id and ``call_ids`` refused to derive one; no call
            ran.
        AutomaticFunctionCallingRefused: the SDK already ran functions on this response.

    """
    calls = _calls(ctx, turn, candidate_index, call_ids, response_id)
    replies = await invoke_all(boundary, ctx, [envelope for _, envelope in calls])
    return _content(calls, replies)


def function_responses_sync(
    boundary: SyncBoundary,
    ctx: RunContext,
    turn: GeminiTurn,
    *,
    candidate_index: int = 0,
    call_ids: CallIds = response_part_ids,
    response_id: str | None = None,
) -> types.Content:
    """:func:`function_responses` for code without an event loop, through a ``SyncBoundary``.

    Raises:
        MissingCallId: a call has no id and ``call_ids`` refused to derive one.
        AutomaticFunctionCallingRefused: the SDK already ran functions on this response.

    """
    calls = _calls(ctx, turn, candidate_index, call_ids, response_id)
    replies = invoke_all_sync(boundary, ctx, [envelope for _, envelope in calls])
    return _content(calls, replies)
