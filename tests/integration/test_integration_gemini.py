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
import pytest
from google import genai
from google.genai import types
from google.genai.client import AsyncClient
from redis.asyncio import Redis

from canon.integrations.gemini import (
    AutomaticFunctionCallingRefused,
    MissingCallId,
    function_calls,
    function_responses,
    function_responses_sync,
    response_part_ids,
)
from eventstore import RunContext, SyncBoundary, SyncStore, ToolBoundary
from machine.codes import SAFE_MESSAGES, ErrorCode
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
    text = (pathlib.Path(__file__).parents[2] / "docs" / "integrations.md").read_text()
    block = re.search(r"## Gemini \(google-genai\)\n.*?```python\n(.*?)```", text, re.S)
    assert block is not None
    canon_lines = [line for line in block.group(1).splitlines() if re.search(r"canon|ctx", line)]
    assert len(canon_lines) <= 3, canon_lines
    docs_turn = response([call("search", {"q": "refunds"}, "46ww9pp1")])
    script = ModelScript(docs_turn, FINAL)
    with SyncStore.from_url(redis_url, namespace=namespace) as store, serve(script) as url:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        boundary = SyncBoundary(store, KbTools().specs(), on_duplicate="replay")
        monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
        monkeypatch.setenv("GEMINI_API_KEY", "test")
        monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", url)
        exec(block.group(1), {"boundary": boundary, "ctx": RunContext(RUN)})
    sent = script.bodies[1]["contents"]
    assert sent[1:] == [
        docs_turn["candidates"][0]["content"],
        {"role": "user", "parts": [output("search", titles("refunds"), "46ww9pp1")]},
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
