"""``canon.integrations.gemini``: Gemini's ``function_call`` parts answered through canon,
with google-genai's own client over a scripted generateContent endpoint (no network)."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from typing import Any

import httpx2
import msgspec
import pytest
from google import genai
from google.genai import types
from google.genai.client import AsyncClient
from redis.asyncio import Redis

from canon.integrations.gemini import (
    AutomaticFunctionCallingRefused,
    MissingCallId,
    function_calls,
    function_declarations,
    function_responses,
    function_responses_sync,
    response_part_ids,
)
from eventstore import RunContext, SyncBoundary, SyncStore, ToolBoundary, ToolSpec
from machine.codes import SAFE_MESSAGES, ErrorCode, Status
from tests.support.model_script import KbTools, ModelScript, serve
from tests.support.tools import namespace_keys

RUN = "run-gemini"
MODEL = "gemini-2.5-flash"
PATH = f"/v1/models/{MODEL}:generateContent"
RESPONSE_ID = "Yx3aZ7b0Ocs2-O4Pm8WKoAg"
QUESTION = {"role": "user", "parts": [{"text": "What do our policies say about refunds?"}]}
SEARCH = types.FunctionDeclaration(
    name="search",
    description="Search the policy knowledge base.",
    parameters_json_schema={"type": "object", "properties": {"q": {"type": "string"}}},
)
CONFIG = types.GenerateContentConfig(tools=[types.Tool(function_declarations=[SEARCH])])


def response(parts: list[dict[str, Any]], response_id: str | None = RESPONSE_ID) -> dict[str, Any]:
    """A generateContent response body as the Gemini API publishes it."""
    body: dict[str, Any] = {
        "candidates": [
            {"content": {"parts": parts, "role": "model"}, "finishReason": "STOP", "index": 0}
        ],
        "usageMetadata": {"promptTokenCount": 96, "candidatesTokenCount": 41},
        "modelVersion": MODEL,
    }
    if response_id is not None:
        body["responseId"] = response_id
    return body


def call(name: str, args: dict[str, Any] | None, call_id: str | None = None) -> dict[str, Any]:
    """One ``functionCall`` part; Gemini 2.x sends no id, Gemini 3 an 8-character one."""
    function_call: dict[str, Any] = {"name": name}
    if args is not None:
        function_call["args"] = args
    if call_id is not None:
        function_call["id"] = call_id
    return {"functionCall": function_call}


#: Server-side parts of the same turn (code execution, a built-in search): not ours.
SERVER_PARTS = [
    {"executableCode": {"language": "PYTHON", "code": "print(30 * 24)"}},
    {"codeExecutionResult": {"outcome": "OUTCOME_OK", "output": "720\n"}},
    {"toolCall": {"id": "srv8c2f1", "toolType": "GOOGLE_SEARCH_WEB", "args": {"q": "refund law"}}},
]
#: A Gemini 2.x turn: four searches and a failing tool in parallel, no ids, a signature.
PARALLEL_PARTS = [
    {"text": "Let me look those up.", "thought": True, "thoughtSignature": "CiQBjz1rX3Zw"},
    call("search", {"q": "refunds"}) | {"thoughtSignature": "EiYKJGU3YjZh"},
    call("search", {"q": "returns"}),
    *SERVER_PARTS,
    call("fail", {"q": "ledger"}),
    call("search", {"q": "exchanges"}),
    call("search", None),
]
PARALLEL_TURN = response(PARALLEL_PARTS)
#: The same turn from a Gemini 3 model: every call has its own id.
GEMINI3_IDS = ["46ww9pp1", "kq2yupzb", "x7d0mhrt", "0b9mfa2e", "p1r4sl8c"]


def with_ids(parts: list[dict[str, Any]], ids: list[str]) -> list[dict[str, Any]]:
    """``parts`` with each functionCall given the next of ``ids``."""
    given = iter(ids)
    return [
        {**part, "functionCall": {**part["functionCall"], "id": next(given)}}
        if "functionCall" in part
        else part
        for part in parts
    ]


GEMINI3_TURN = response(with_ids(PARALLEL_PARTS, GEMINI3_IDS))
FINAL = response([{"text": "Refunds within 30 days."}])
#: Where the calls sit in PARALLEL_PARTS: the default ids derive from these indexes.
CALL_PARTS = [1, 2, 6, 7, 8]


def titles(query: str) -> dict[str, Any]:
    return {"titles": [f"About {query}"]}


def output(name: str, value: Any, call_id: str | None = None) -> dict[str, Any]:
    """The ``functionResponse`` part the SDK must send for a READY call."""
    response = {"name": name, "response": {"output": value}}
    return {"functionResponse": response | ({"id": call_id} if call_id else {})}


def error(name: str, code: ErrorCode, call_id: str | None = None) -> dict[str, Any]:
    """The ``functionResponse`` part for a failed call: the safe error only."""
    failure = {"error_code": code.value, "message": SAFE_MESSAGES[code]}
    response = {"name": name, "response": {"error": failure}}
    return {"functionResponse": response | ({"id": call_id} if call_id else {})}


def expected(ids: list[str | None]) -> dict[str, Any]:
    return {
        "role": "user",
        "parts": [
            output("search", titles("refunds"), ids[0]),
            output("search", titles("returns"), ids[1]),
            error("fail", ErrorCode.EXECUTION_FAILED, ids[2]),
            output("search", titles("exchanges"), ids[3]),
            output("search", titles("everything"), ids[4]),
        ],
    }


def assert_next_request(script: ModelScript, turn: dict[str, Any], answer: Any) -> None:
    """The second request carries the question, the model's content exactly as it came
    (thought signatures included), and exactly ``answer``."""
    assert [path for path, _ in script.requests] == [PATH, PATH]
    sent = script.bodies[1]
    model_turn = json.loads(
        # google-genai re-sends a server toolCall's "toolType" as "tool_type": the SDK's
        # own serialization of the model's content, which the adapter does not touch.
        json.dumps(turn["candidates"][0]["content"]).replace('"toolType"', '"tool_type"')
    )
    assert sent["contents"] == [QUESTION, model_turn, answer]


@contextmanager
def sync_client(script: ModelScript) -> Iterator[genai.Client]:
    """A genai.Client whose own httpx2 client talks to ``script``."""
    with httpx2.Client(transport=script.transport()) as http:
        options = types.HttpOptions(httpx_client=http)
        with genai.Client(api_key="test", http_options=options) as client:
            yield client


@asynccontextmanager
async def async_client(script: ModelScript) -> AsyncIterator[AsyncClient]:
    """``genai.Client(...).aio`` whose own httpx2 async client talks to ``script``."""
    async with httpx2.AsyncClient(transport=script.transport()) as http:
        options = types.HttpOptions(httpx_async_client=http)
        async with genai.Client(api_key="test", http_options=options).aio as client:
            yield client


async def run_turn_async(boundary: ToolBoundary, script: ModelScript, **options: Any) -> Any:
    """One loop with the async client: model turn, tools through canon, next turn."""
    async with async_client(script) as client:
        contents: list[Any] = [QUESTION]
        reply = await client.models.generate_content(model=MODEL, contents=contents, config=CONFIG)
        assert reply.function_calls
        answer = await function_responses(boundary, RunContext(RUN), reply, **options)
        assert reply.candidates and reply.candidates[0].content
        contents += [reply.candidates[0].content, answer]
        final = await client.models.generate_content(model=MODEL, contents=contents, config=CONFIG)
        assert final.text == "Refunds within 30 days."
        return answer.model_dump(mode="json", by_alias=True, exclude_none=True)


def run_turn_sync(boundary: SyncBoundary, script: ModelScript) -> Any:
    """The same loop with the sync client and a SyncBoundary."""
    with sync_client(script) as client:
        contents: list[Any] = [QUESTION]
        reply = client.models.generate_content(model=MODEL, contents=contents, config=CONFIG)
        answer = function_responses_sync(boundary, RunContext(RUN), reply)
        assert reply.candidates and reply.candidates[0].content
        contents += [reply.candidates[0].content, answer]
        client.models.generate_content(model=MODEL, contents=contents, config=CONFIG)
        return answer.model_dump(mode="json", by_alias=True, exclude_none=True)


async def open_boundary(make_store: Any, kb: KbTools, **options: Any) -> tuple[Any, ToolBoundary]:
    store = make_store()
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    return store, ToolBoundary(store, kb.specs(), max_tool_threads=8, **options)


async def test_gemini2_calls_get_ids_from_the_response_and_answers_in_order(
    make_store: Any,
) -> None:
    """A Gemini 2.x turn without ids: four searches at once (a barrier holds them) and a
    failing tool; the next request carries five function_responses in the calls' order,
    without ids (none came), the failure as {"error": ...}; each record is named
    "<responseId>.<candidate>.<part>"; the server-side parts get no answer."""
    kb = KbTools(parties=4)
    store, boundary = await open_boundary(make_store, kb)
    script = ModelScript(PARALLEL_TURN, FINAL)

    answer = await run_turn_async(boundary, script)

    assert answer == expected([None] * 5)
    assert_next_request(script, PARALLEL_TURN, expected([None] * 5))
    assert "hunter2" not in json.dumps(script.bodies)
    assert sorted(a.get("q", "") for a in kb.searched) == ["", "exchanges", "refunds", "returns"]
    for part in CALL_PARTS:
        assert await store.get(RUN, f"{RESPONSE_ID}.0.{part}") is not None


async def test_gemini3_ids_are_used_and_echoed_as_they_came(make_store: Any) -> None:
    """Each Gemini 3 call's own id names its record and comes back in its response."""
    kb = KbTools(parties=4)
    store, boundary = await open_boundary(make_store, kb)
    script = ModelScript(GEMINI3_TURN, FINAL)

    answer = await run_turn_async(boundary, script)

    assert answer == expected(list(GEMINI3_IDS))
    assert_next_request(script, GEMINI3_TURN, expected(list(GEMINI3_IDS)))
    for call_id in GEMINI3_IDS:
        assert await store.get(RUN, call_id) is not None
    assert await store.get(RUN, f"{RESPONSE_ID}.0.1") is None


async def test_unknown_and_unauthorized_tools_are_errors_the_model_sees(make_store: Any) -> None:
    """A tool the boundary does not know and one it may not run: each answers with its
    code under "error"; nothing runs."""
    kb = KbTools()
    _, boundary = await open_boundary(make_store, kb)
    turn = response([call("delete_everything", {"really": True}), call("admin", {"q": "users"})])
    script = ModelScript(turn, FINAL)

    await run_turn_async(boundary, script)

    assert_next_request(
        script,
        turn,
        {
            "role": "user",
            "parts": [
                error("delete_everything", ErrorCode.UNKNOWN_TOOL),
                error("admin", ErrorCode.UNAUTHORIZED),
            ],
        },
    )
    assert kb.searched == []


async def test_a_resent_turn_is_replayed_under_the_same_derived_ids(make_store: Any) -> None:
    """With on_duplicate="replay" a re-sent Gemini 2.x turn derives the same ids, so it
    gets the same answers, failure included, and every tool ran once."""
    kb = KbTools(parties=4)
    _, boundary = await open_boundary(make_store, kb, on_duplicate="replay")
    first = await run_turn_async(boundary, ModelScript(PARALLEL_TURN, FINAL))
    script = ModelScript(PARALLEL_TURN, FINAL)

    assert await run_turn_async(boundary, script) == first
    assert_next_request(script, PARALLEL_TURN, expected([None] * 5))
    assert len(kb.searched) == 4


async def test_a_call_without_id_in_a_response_without_id_is_refused(
    make_store: Any, redis: Redis, namespace: str
) -> None:
    """No function_call.id and no responseId: MissingCallId before anything runs or is
    stored; an id source of the harness's own names the calls instead."""
    kb = KbTools()
    _, boundary = await open_boundary(make_store, kb)
    turn = types.GenerateContentResponse.model_validate(
        response([call("search", {"q": "refunds"})], response_id=None)
    )
    before = await namespace_keys(redis, namespace)
    with pytest.raises(MissingCallId, match="response_id"):
        await function_responses(boundary, RunContext(RUN), turn)
    assert kb.searched == [] and await namespace_keys(redis, namespace) == before

    def harness_ids(response_id: str | None, candidate: int, part: int) -> str:
        return f"turn-7.{candidate}.{part}"

    answer = await function_responses(boundary, RunContext(RUN), turn, call_ids=harness_ids)
    assert answer.parts and answer.parts[0].function_response
    assert answer.parts[0].function_response.response == {"output": titles("refunds")}
    named = function_calls(RunContext(RUN), turn, call_ids=harness_ids)
    assert [envelope.tool_call_id for envelope in named] == ["turn-7.0.0"]


async def test_a_bare_content_and_dict_forms_are_read_the_same(make_store: Any) -> None:
    """A Content (with the response id given), and the dict forms of a response and of a
    Content, name the same calls; ``args`` missing is ``{}``."""
    _, boundary = await open_boundary(make_store, KbTools())
    ctx = RunContext(RUN)
    turn = response([{"text": "ok"}, call("search", None)])
    parsed = types.GenerateContentResponse.model_validate(turn)
    assert parsed.candidates and parsed.candidates[0].content
    content = parsed.candidates[0].content
    ids = [f"{RESPONSE_ID}.0.1"]
    assert [e.tool_call_id for e in function_calls(ctx, turn)] == ids
    assert [e.tool_call_id for e in function_calls(ctx, content, response_id=RESPONSE_ID)] == ids
    assert function_calls(ctx, content.model_dump(), response_id=RESPONSE_ID)[0].arguments == {}
    with pytest.raises(MissingCallId):
        function_calls(ctx, content)
    gemini3 = types.Content.model_validate(
        {"role": "model", "parts": [call("search", {"q": "x"}, "46ww9pp1")]}
    )
    assert [e.tool_call_id for e in function_calls(ctx, gemini3)] == ["46ww9pp1"]
    answer = await function_responses(boundary, ctx, content, response_id=RESPONSE_ID)
    assert answer.role == "user"
    assert answer.model_dump(mode="json", by_alias=True, exclude_none=True)["parts"] == [
        output("search", titles("everything"))
    ]
    assert response_part_ids(RESPONSE_ID, 1, 4) == f"{RESPONSE_ID}.1.4"


async def test_automatic_function_calling_is_refused(make_store: Any) -> None:
    """Python functions as tools: the SDK runs them itself, with no call id; the adapter
    refuses the response it returns rather than answer outside the record."""
    _, boundary = await open_boundary(make_store, KbTools())
    ran: list[str] = []

    def search(q: str) -> dict[str, Any]:
        """Search the policy knowledge base."""
        ran.append(q)
        return {"titles": [q]}

    script = ModelScript(response([call("search", {"q": "refunds"})]), FINAL)
    async with async_client(script) as client:
        reply = await client.models.generate_content(
            model=MODEL, contents=[QUESTION], config=types.GenerateContentConfig(tools=[search])
        )
    assert ran == ["refunds"]
    with pytest.raises(AutomaticFunctionCallingRefused, match="FunctionDeclaration"):
        await function_responses(boundary, RunContext(RUN), reply)


class StreamScript(ModelScript):
    """A ModelScript whose list answers are streams: one server-sent event per chunk, as
    ``streamGenerateContent?alt=sse`` sends them."""

    def transport(self, http: Any = httpx2) -> Any:
        def handle(request: Any) -> Any:
            status, body = self.answer(request.url.path, request.read())
            if not isinstance(body, list):
                return http.Response(status, json=body)
            events = "".join(f"data: {json.dumps(chunk)}\r\n\r\n" for chunk in body)
            headers = {"content-type": "text/event-stream"}
            return http.Response(status, content=events.encode(), headers=headers)

        return http.MockTransport(handle)


def chunk(parts: list[dict[str, Any]], finish: str | None = None) -> dict[str, Any]:
    """One chunk of a streamed response: only the last one has a finishReason."""
    candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    return {"candidates": [candidate], "responseId": RESPONSE_ID, "modelVersion": MODEL}


#: A Gemini 2.x turn streamed: text, then one call per chunk, no ids.
STREAMED_TURN = [
    chunk([{"text": "Let me look."}]),
    chunk([call("search", {"q": "refunds"})]),
    chunk([call("search", {"q": "returns"})], "STOP"),
]
STREAMED_FINAL = [chunk([{"text": "Refunds within 30 days."}], "STOP")]


def search_function(ran: list[str]) -> Any:
    """A Python function as a tool: the SDK calls such a function itself (AFC)."""

    def search(q: str) -> dict[str, Any]:
        """Search the policy knowledge base."""
        ran.append(q)
        return {"titles": [q]}

    return search


async def afc_turn(entry_point: str, script: ModelScript, config: Any) -> Any:
    """What the harness holds after ``entry_point`` ran (the response, the stream's chunks
    or the chat), the SDK's automatic function calling on."""
    question = "What do our policies say about refunds?"
    if entry_point.startswith("sync "):
        with sync_client(script) as client:
            if entry_point == "sync models.generate_content":
                return client.models.generate_content(model=MODEL, contents=question, config=config)
            if entry_point == "sync models.generate_content_stream":
                stream = client.models.generate_content_stream(
                    model=MODEL, contents=question, config=config
                )
                return list(stream)
            chat = client.chats.create(model=MODEL, config=config)
            if entry_point == "sync chats.send_message":
                chat.send_message(question)
            else:
                list(chat.send_message_stream(question))
            return chat
    async with async_client(script) as aio:
        if entry_point == "async models.generate_content":
            return await aio.models.generate_content(model=MODEL, contents=question, config=config)
        if entry_point == "async models.generate_content_stream":
            chunks = await aio.models.generate_content_stream(
                model=MODEL, contents=question, config=config
            )
            return [piece async for piece in chunks]
        achat = aio.chats.create(model=MODEL, config=config)
        if entry_point == "async chats.send_message":
            await achat.send_message(question)
        else:
            [piece async for piece in await achat.send_message_stream(question)]
        return achat


AFC_ENTRY_POINTS = [
    f"{mode} {method}"
    for mode in ("sync", "async")
    for method in (
        "models.generate_content",
        "models.generate_content_stream",
        "chats.send_message",
        "chats.send_message_stream",
    )
]


@pytest.mark.parametrize("entry_point", AFC_ENTRY_POINTS)
@pytest.mark.parametrize("call_id", [None, "46ww9pp1"], ids=["gemini2", "gemini3"])
async def test_automatic_function_calling_is_refused_at_every_entry_point(
    make_store: Any, redis: Redis, namespace: str, entry_point: str, call_id: str | None
) -> None:
    """Python functions as tools, whichever way the SDK was called (a response, a stream,
    a chat, sync or async): the SDK ran the function itself; the adapter refuses what the
    harness holds instead of answering an empty turn, and canon records nothing."""
    _, boundary = await open_boundary(make_store, KbTools())
    ran: list[str] = []
    stream = "stream" in entry_point
    turn = [call("search", {"q": "refunds"}, call_id)]
    script = StreamScript(
        [chunk(turn, "STOP")] if stream else response(turn),
        STREAMED_FINAL if stream else FINAL,
    )
    config = types.GenerateContentConfig(tools=[search_function(ran)])
    held = await afc_turn(entry_point, script, config)
    assert ran == ["refunds"]
    before = await namespace_keys(redis, namespace)
    with pytest.raises(AutomaticFunctionCallingRefused, match="FunctionDeclaration"):
        await function_responses(boundary, RunContext(RUN), held, response_id=RESPONSE_ID)
    assert await namespace_keys(redis, namespace) == before


async def test_a_chat_turn_is_answered_and_its_answers_reach_the_model(make_store: Any) -> None:
    """``chats.create`` with declared tools: the chat's last model turn is answered (ids
    derived from the response id, as for a response), ``send_message(answers.parts)`` sends
    them; the chat's final turn answers nothing and is not taken for automatic calling."""
    kb = KbTools(parties=4)
    store, boundary = await open_boundary(make_store, kb)
    script = ModelScript(PARALLEL_TURN, FINAL)
    ctx = RunContext(RUN)
    async with async_client(script) as aio:
        chat = aio.chats.create(model=MODEL, config=CONFIG)
        reply = await chat.send_message("What do our policies say about refunds?")
        answers = await function_responses(boundary, ctx, chat, response_id=reply.response_id)
        assert answers.parts
        final = await chat.send_message(answers.parts)
        assert final.text == "Refunds within 30 days."
        done = await function_responses(boundary, ctx, chat, response_id=final.response_id)
    assert done.parts == []
    assert_next_request(script, PARALLEL_TURN, expected([None] * 5))
    for part in CALL_PARTS:
        assert await store.get(RUN, f"{RESPONSE_ID}.0.{part}") is not None


@pytest.mark.parametrize("mode", ["generate_content_stream", "chats.send_message_stream"])
async def test_a_streamed_turn_names_each_call_by_its_place_in_the_turn(
    make_store: Any, redis: Redis, namespace: str, mode: str
) -> None:
    """Streamed Gemini 2.x calls, one per chunk: given the chunks together (or the chat),
    each call is named by its place in the whole turn, so no two share an id, and a re-sent
    stream replays under the same ids; one chunk alone is refused before anything runs."""
    kb = KbTools(parties=2)
    store, boundary = await open_boundary(make_store, kb, on_duplicate="replay")
    ctx = RunContext(RUN)
    script = StreamScript(STREAMED_TURN, STREAMED_FINAL)
    async with async_client(script) as aio:
        if mode == "generate_content_stream":
            stream = await aio.models.generate_content_stream(
                model=MODEL, contents=[QUESTION], config=CONFIG
            )
            held: Any = [piece async for piece in stream]
            before = await namespace_keys(redis, namespace)
            with pytest.raises(MissingCallId, match="chunks"):
                await function_responses(boundary, ctx, held[1])
            assert await namespace_keys(redis, namespace) == before
        else:
            held = aio.chats.create(model=MODEL, config=CONFIG)
            [piece async for piece in await held.send_message_stream(QUESTION["parts"][0]["text"])]
        answers = await function_responses(boundary, ctx, held, response_id=RESPONSE_ID)
        again = await function_responses(boundary, ctx, held, response_id=RESPONSE_ID)
    assert [e.tool_call_id for e in function_calls(ctx, held, response_id=RESPONSE_ID)] == [
        f"{RESPONSE_ID}.0.1",
        f"{RESPONSE_ID}.0.2",
    ]
    assert again == answers
    assert answers.model_dump(mode="json", by_alias=True, exclude_none=True)["parts"] == [
        output("search", titles("refunds")),
        output("search", titles("returns")),
    ]
    assert len(kb.searched) == 2
    for part in (1, 2):
        record = await store.get(RUN, f"{RESPONSE_ID}.0.{part}")
        assert record is not None and record.state.status is Status.READY


async def test_function_responses_takes_a_sync_boundary_inside_asyncio(
    redis_url: str, namespace: str
) -> None:
    """``await function_responses`` with a SyncBoundary runs the calls on the boundary's own
    loop: the answers and the READY records are those of any boundary."""
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        boundary = SyncBoundary(store, KbTools(parties=4).specs(), max_tool_threads=8)
        answer = await function_responses(boundary, RunContext(RUN), PARALLEL_TURN)
        dumped = answer.model_dump(mode="json", by_alias=True, exclude_none=True)
        assert dumped == expected([None] * 5)
        record = store.get(RUN, f"{RESPONSE_ID}.0.1")
        assert record is not None and record.state.status is Status.READY


async def test_function_responses_sync_refuses_an_async_boundary_before_any_record(
    make_store: Any, redis: Redis, namespace: str
) -> None:
    """``function_responses_sync`` given an async ToolBoundary: one TypeError naming
    SyncBoundary, before any call is checked, run or recorded."""
    kb = KbTools()
    _, boundary = await open_boundary(make_store, kb)
    before = await namespace_keys(redis, namespace)
    with pytest.raises(TypeError, match="SyncBoundary"):
        function_responses_sync(boundary, RunContext(RUN), PARALLEL_TURN)
    assert kb.searched == []
    assert await namespace_keys(redis, namespace) == before


def described(specs: dict[str, ToolSpec]) -> dict[str, ToolSpec]:
    """``specs`` with ``search`` described once, in its ToolSpec, as SEARCH declares it."""
    search = msgspec.structs.replace(
        specs["search"],
        description=SEARCH.description or "",
        input_schema=SEARCH.parameters_json_schema,
    )
    return {**specs, "search": search}


def test_function_declarations_derive_from_the_tool_specs() -> None:
    """``function_declarations``: each ToolSpec's description and input schema (any
    object without one) as declarations; the SDK sends the derived ``search`` exactly as
    the hand-written SEARCH."""
    declarations = function_declarations(described(KbTools().specs()))
    assert declarations == [
        SEARCH,
        types.FunctionDeclaration(name="fail", parameters_json_schema={"type": "object"}),
        types.FunctionDeclaration(name="admin", parameters_json_schema={"type": "object"}),
    ]
    script = ModelScript(FINAL, FINAL)
    config = types.GenerateContentConfig(tools=[types.Tool(function_declarations=declarations)])
    with sync_client(script) as client:
        client.models.generate_content(model=MODEL, contents=[QUESTION], config=config)
        client.models.generate_content(model=MODEL, contents=[QUESTION], config=CONFIG)
    derived, written = (body["tools"][0]["functionDeclarations"] for body in script.bodies)
    assert derived[0] == written[0]
    assert len(derived) == 3


def test_the_sync_client_and_boundary_send_the_same_answers(redis_url: str, namespace: str) -> None:
    """From plain threads: genai.Client's sync calls and a SyncBoundary, calls concurrent."""
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        kb = KbTools(parties=4)
        boundary = SyncBoundary(store, kb.specs(), max_tool_threads=8)
        script = ModelScript(PARALLEL_TURN, FINAL)

        assert run_turn_sync(boundary, script) == expected([None] * 5)
        assert_next_request(script, PARALLEL_TURN, expected([None] * 5))
        assert len(kb.searched) == 4


def test_the_sync_replay_of_a_resent_turn(redis_url: str, namespace: str) -> None:
    """The replayed retry from threads: same answers, tools run once."""
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        kb = KbTools(parties=4)
        boundary = SyncBoundary(store, kb.specs(), on_duplicate="replay", max_tool_threads=8)
        first = run_turn_sync(boundary, ModelScript(PARALLEL_TURN, FINAL))
        assert run_turn_sync(boundary, ModelScript(PARALLEL_TURN, FINAL)) == first
        assert len(kb.searched) == 4


def test_the_docs_loop_runs_as_written(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/integrations.md's Gemini loop, against a local scripted generateContent API."""
    text = (pathlib.Path(__file__).parents[3] / "docs" / "integrations.md").read_text()
    block = re.search(r"## Gemini \(google-genai\)\n.*?```python\n(.*?)```", text, re.S)
    assert block is not None
    canon_lines = [line for line in block.group(1).splitlines() if re.search(r"canon|ctx", line)]
    assert len(canon_lines) <= 3, canon_lines
    docs_turn = response([call("search", {"q": "refunds"}, "46ww9pp1")])
    script = ModelScript(docs_turn, FINAL)
    with SyncStore.from_url(redis_url, namespace=namespace) as store, serve(script) as url:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        tools = described(KbTools().specs())
        boundary = SyncBoundary(store, tools, on_duplicate="replay")
        monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
        monkeypatch.setenv("GEMINI_API_KEY", "test")
        monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", url)
        exec(block.group(1), {"boundary": boundary, "ctx": RunContext(RUN), "TOOLS": tools})
    sent = script.bodies[1]["contents"]
    assert sent[1:] == [
        docs_turn["candidates"][0]["content"],
        {"role": "user", "parts": [output("search", titles("refunds"), "46ww9pp1")]},
    ]


def test_the_docs_chat_loop_runs_as_written(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/integrations.md's Gemini chat loop (after the first block, whose client and
    config it uses), with a Gemini 2.x turn: the chat sends the question, the model's turn
    and the answers, each call named after the response id."""
    text = (pathlib.Path(__file__).parents[3] / "docs" / "integrations.md").read_text()
    section = re.search(r"## Gemini \(google-genai\)\n(.*?)(?=^## )", text, re.S | re.M)
    assert section is not None
    first, chat = re.findall(r"```python\n(.*?)```", section.group(1), re.S)
    canon_lines = [line for line in chat.splitlines() if re.search(r"canon|ctx", line)]
    assert len(canon_lines) <= 2, canon_lines
    docs_turn = response([call("search", {"q": "refunds"}, "46ww9pp1")])
    chat_turn = response([{"text": "Checking."}, call("search", {"q": "returns"})])
    script = ModelScript(docs_turn, FINAL, chat_turn, FINAL)
    with SyncStore.from_url(redis_url, namespace=namespace) as store, serve(script) as url:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        tools = described(KbTools().specs())
        names = {
            "boundary": SyncBoundary(store, tools),
            "ctx": RunContext(RUN),
            "TOOLS": tools,
        }
        monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
        monkeypatch.setenv("GEMINI_API_KEY", "test")
        monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", url)
        exec(first, names)
        exec(chat, names)
        assert store.get(RUN, f"{RESPONSE_ID}.0.1") is not None
    sent = script.bodies[3]["contents"]
    assert sent == [
        {"role": "user", "parts": [{"text": "What is our refund policy?"}]},
        chat_turn["candidates"][0]["content"],
        {"role": "user", "parts": [output("search", titles("returns"))]},
    ]


def test_without_the_sdk_the_import_names_the_extra() -> None:
    """No google-genai package: one ImportError naming canon-store[gemini]."""
    code = (
        "import sys; sys.modules['google.genai'] = None\n"
        "try:\n    import canon.integrations.gemini\n"
        "except ImportError as error:\n    print(error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "pip install 'canon-store[gemini]'" in result.stdout
