"""``canon.integrations.anthropic``: Claude's ``tool_use`` blocks answered through canon,
with the SDK's own client over a scripted Messages API (no network)."""

from __future__ import annotations

import copy
import json
import pathlib
import re
import subprocess
import sys
from datetime import timedelta
from typing import Any

import anthropic
import httpx2
import msgspec
import pytest
from redis.asyncio import Redis

from canon.integrations.anthropic import tool_params, tool_results, tool_results_sync, tool_uses
from eventstore import RunContext, SyncBoundary, SyncStore, ToolBoundary, ToolSpec
from machine.codes import SAFE_MESSAGES, ErrorCode, Status
from tests.support.model_script import KbTools, ModelScript, serve
from tests.support.tools import namespace_keys

RUN = "run-claude"
MODEL = "claude-sonnet-4-6"
QUESTION = {"role": "user", "content": "What do our policies say about refunds and returns?"}
TOOLS = [
    {
        "name": "search",
        "description": "Search the policy knowledge base.",
        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
]
#: Ids as each platform emits them: the first-party API, Vertex AI and Bedrock.
IDS = [
    "toolu_01A09q90qw90lq917835lq9",
    "toolu_vrtx_01Kq2YUPZBXjzD8dT1jHDa8w",
    "tooluse_kZJMlvQmRJ6eAyJE5GIl7Q",
    "toolu_bdrk_01T1x1fJ34qAmk2tNTrN7Up6",
    "toolu_01FjXTRdvrSYDbyLJxUBAPpD",
]


def message(content: list[dict[str, Any]], stop_reason: str = "tool_use") -> dict[str, Any]:
    """A Messages API response body, as the API publishes it."""
    return {
        "id": "msg_01Aq9w938a90dw8q",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 472, "output_tokens": 165},
    }


def tool_use(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One client ``tool_use`` block."""
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


#: The web search Anthropic's servers ran in the same turn: not ours to answer.
SERVER_BLOCKS = [
    {
        "type": "server_tool_use",
        "id": "srvtoolu_01WYG3ziw53XMcoyKL4XcZmE",
        "name": "web_search",
        "input": {"query": "consumer refund law 2026"},
    },
    {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_01WYG3ziw53XMcoyKL4XcZmE",
        "content": [
            {
                "type": "web_search_result",
                "title": "Refund rules",
                "url": "https://example.org/refunds",
                "encrypted_content": "EqgfCioIARgBIiQ3YTAwMjY1Mi1mZjM5LTQ1NGUtODgx",
                "page_age": "April 30, 2025",
            }
        ],
    },
]

PARALLEL_TURN = message(
    [
        {"type": "text", "text": "I'll look these up in parallel."},
        tool_use(IDS[0], "search", {"q": "refunds"}),
        tool_use(IDS[1], "search", {"q": "returns"}),
        *SERVER_BLOCKS,
        tool_use(IDS[2], "fail", {"q": "ledger"}),
        tool_use(IDS[3], "search", {"q": "exchanges"}),
        tool_use(IDS[4], "search", {}),
    ]
)
FINAL = message([{"type": "text", "text": "Refunds within 30 days."}], "end_turn")


def result_block(call_id: str, content: Any) -> dict[str, Any]:
    """The ``tool_result`` block the SDK must send for a READY call."""
    return {"type": "tool_result", "tool_use_id": call_id, "content": json.dumps(content)}


def error_block(call_id: str, code: ErrorCode) -> dict[str, Any]:
    """The ``tool_result`` block the SDK must send for a failed call: the safe error only."""
    error = {"error_code": code.value, "message": SAFE_MESSAGES[code]}
    return {
        "type": "tool_result",
        "tool_use_id": call_id,
        "content": json.dumps(error, separators=(",", ":")),
        "is_error": True,
    }


def titles(query: str) -> dict[str, Any]:
    return {"titles": [f"About {query}"]}


EXPECTED_RESULTS = {
    "role": "user",
    "content": [
        result_block(IDS[0], titles("refunds")),
        result_block(IDS[1], titles("returns")),
        error_block(IDS[2], ErrorCode.EXECUTION_FAILED),
        result_block(IDS[3], titles("exchanges")),
        result_block(IDS[4], titles("everything")),
    ],
}


def compact(sent: dict[str, Any]) -> dict[str, Any]:
    """A sent message with every result's JSON text decoded (its spacing is ours)."""
    sent = copy.deepcopy(sent)
    for block in sent["content"]:
        block["content"] = json.loads(block["content"])
    return sent


def assert_next_request(script: ModelScript, turn: dict[str, Any], results: Any) -> None:
    """The second request carries the question, the assistant turn as the API sent it,
    and exactly ``results`` as the user turn."""
    assert [path for path, _ in script.requests] == ["/v1/messages", "/v1/messages"]
    sent = script.bodies[1]
    assert sent["model"] == MODEL and sent["tools"] == TOOLS
    assert sent["messages"][:2] == [QUESTION, {"role": "assistant", "content": turn["content"]}]
    assert compact(sent["messages"][2]) == compact(results)
    assert len(sent["messages"]) == 3


async def run_turn_async(boundary: ToolBoundary, script: ModelScript) -> dict[str, Any]:
    """One loop of the harness with the async client: model turn, tools, next turn."""
    http = httpx2.AsyncClient(transport=script.transport())
    async with anthropic.AsyncAnthropic(api_key="test", http_client=http, max_retries=0) as client:
        messages: list[Any] = [QUESTION]
        reply = await client.messages.create(
            model=MODEL, max_tokens=1024, tools=TOOLS, messages=messages
        )
        assert reply.stop_reason == "tool_use"
        results = await tool_results(boundary, RunContext(RUN), reply)
        messages += [{"role": "assistant", "content": reply.content}, results]
        final = await client.messages.create(
            model=MODEL, max_tokens=1024, tools=TOOLS, messages=messages
        )
        assert final.stop_reason == "end_turn"
        return dict(results)


def run_turn_sync(boundary: SyncBoundary, script: ModelScript) -> dict[str, Any]:
    """The same loop with the sync client and a SyncBoundary."""
    http = httpx2.Client(transport=script.transport())
    with anthropic.Anthropic(api_key="test", http_client=http, max_retries=0) as client:
        messages: list[Any] = [QUESTION]
        reply = client.messages.create(model=MODEL, max_tokens=1024, tools=TOOLS, messages=messages)
        results = tool_results_sync(boundary, RunContext(RUN), reply)
        messages += [{"role": "assistant", "content": reply.content}, results]
        client.messages.create(model=MODEL, max_tokens=1024, tools=TOOLS, messages=messages)
        return dict(results)


async def test_parallel_tool_uses_are_answered_in_order_with_the_failure_flagged(
    make_store: Any,
) -> None:
    """Four searches run at once (a barrier holds them), one tool fails: the next request
    carries five tool_results in the calls' order, ids echoed exactly (Vertex, Bedrock),
    the failure as the safe error with is_error; the server-side blocks get no answer."""
    store = make_store()
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    kb = KbTools(parties=4)
    boundary = ToolBoundary(store, kb.specs(), max_tool_threads=8)
    script = ModelScript(PARALLEL_TURN, FINAL)

    results = await run_turn_async(boundary, script)

    assert compact(results) == compact(EXPECTED_RESULTS)
    assert_next_request(script, PARALLEL_TURN, EXPECTED_RESULTS)
    assert "hunter2" not in json.dumps(script.bodies)
    assert sorted(a.get("q", "") for a in kb.searched) == ["", "exchanges", "refunds", "returns"]
    for call_id in IDS:
        assert await store.get(RUN, call_id) is not None


async def test_unknown_and_unauthorized_tools_are_errors_the_model_sees(make_store: Any) -> None:
    """A tool the boundary does not know and one it may not run: each is a tool_result
    with is_error and its code; nothing runs."""
    store = make_store()
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    kb = KbTools()
    boundary = ToolBoundary(store, kb.specs())
    turn = message(
        [
            tool_use("toolu_01UnknownTool9q90qw90lq", "delete_everything", {"really": True}),
            tool_use("toolu_vrtx_01AdminTool8dT1jHDa8w", "admin", {"q": "users"}),
        ]
    )
    script = ModelScript(turn, FINAL)

    await run_turn_async(boundary, script)

    assert_next_request(
        script,
        turn,
        {
            "role": "user",
            "content": [
                error_block("toolu_01UnknownTool9q90qw90lq", ErrorCode.UNKNOWN_TOOL),
                error_block("toolu_vrtx_01AdminTool8dT1jHDa8w", ErrorCode.UNAUTHORIZED),
            ],
        },
    )
    assert kb.searched == []


async def test_a_resent_turn_is_replayed_without_running_the_tools_again(
    make_store: Any,
) -> None:
    """With on_duplicate="replay" the harness re-sends the same turn: the same
    tool_results, failure included, and every tool ran once."""
    store = make_store()
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    kb = KbTools(parties=4)
    boundary = ToolBoundary(store, kb.specs(), on_duplicate="replay", max_tool_threads=8)
    first = await run_turn_async(boundary, ModelScript(PARALLEL_TURN, FINAL))
    script = ModelScript(PARALLEL_TURN, FINAL)

    again = await run_turn_async(boundary, script)

    assert again == first
    assert_next_request(script, PARALLEL_TURN, EXPECTED_RESULTS)
    assert len(kb.searched) == 4


def test_the_sync_client_and_boundary_send_the_same_results(redis_url: str, namespace: str) -> None:
    """From plain threads: Anthropic() and a SyncBoundary, the calls still concurrent."""
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        kb = KbTools(parties=4)
        boundary = SyncBoundary(store, kb.specs(), max_tool_threads=8)
        script = ModelScript(PARALLEL_TURN, FINAL)

        results = run_turn_sync(boundary, script)

        assert compact(results) == compact(EXPECTED_RESULTS)
        assert_next_request(script, PARALLEL_TURN, EXPECTED_RESULTS)
        assert len(kb.searched) == 4


def test_the_sync_replay_of_a_resent_turn(redis_url: str, namespace: str) -> None:
    """The replayed retry from threads: same results, tools run once."""
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        kb = KbTools(parties=4)
        boundary = SyncBoundary(store, kb.specs(), on_duplicate="replay", max_tool_threads=8)
        first = run_turn_sync(boundary, ModelScript(PARALLEL_TURN, FINAL))
        assert run_turn_sync(boundary, ModelScript(PARALLEL_TURN, FINAL)) == first
        assert len(kb.searched) == 4


async def test_the_dict_form_of_a_message_is_read_the_same(make_store: Any) -> None:
    """A stored or hand-built dict of the Message gives the same results; a block without
    ``input`` is a call without parameters."""
    store = make_store()
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    boundary = ToolBoundary(store, KbTools().specs())
    turn = message([{"type": "tool_use", "id": "toolu_01NoInput", "name": "search"}])
    assert tool_uses(RunContext(RUN), turn)[0].arguments == "{}"
    assert compact(await tool_results(boundary, RunContext(RUN), turn)) == compact(
        {"role": "user", "content": [result_block("toolu_01NoInput", titles("everything"))]}
    )


async def test_a_message_without_client_tools_answers_nothing(make_store: Any) -> None:
    """Only server-side blocks and text: no tool_result, nothing run or stored."""
    store = make_store()
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    kb = KbTools()
    boundary = ToolBoundary(store, kb.specs())
    turn = anthropic.types.Message.model_validate(message(SERVER_BLOCKS, "end_turn"))
    assert await tool_results(boundary, RunContext(RUN), turn) == {"role": "user", "content": []}
    assert kb.searched == []


def described(specs: dict[str, ToolSpec]) -> dict[str, ToolSpec]:
    """``specs`` with ``search`` described once, in its ToolSpec, as TOOLS describes it."""
    search = msgspec.structs.replace(
        specs["search"],
        description=TOOLS[0]["description"],
        input_schema=TOOLS[0]["input_schema"],
    )
    return {**specs, "search": search}


async def test_tool_results_takes_a_sync_boundary_inside_asyncio(
    redis_url: str, namespace: str
) -> None:
    """``await tool_results`` with a SyncBoundary: its calls run on the boundary's own loop
    while this one waits; the results and the READY records are those of any boundary."""
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        kb = KbTools(parties=4)
        boundary = SyncBoundary(store, kb.specs(), max_tool_threads=8)
        results = await tool_results(boundary, RunContext(RUN), PARALLEL_TURN)
        assert compact(dict(results)) == compact(EXPECTED_RESULTS)
        record = store.get(RUN, IDS[0])
        assert record is not None and record.state.status is Status.READY


async def test_tool_results_sync_refuses_an_async_boundary_before_any_record(
    make_store: Any, redis: Redis, namespace: str
) -> None:
    """``tool_results_sync`` given an async ToolBoundary: one TypeError naming
    SyncBoundary, before any call is checked, run or recorded."""
    store = make_store()
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    kb = KbTools()
    before = await namespace_keys(redis, namespace)
    with pytest.raises(TypeError, match="SyncBoundary"):
        tool_results_sync(ToolBoundary(store, kb.specs()), RunContext(RUN), PARALLEL_TURN)
    assert kb.searched == []
    assert await namespace_keys(redis, namespace) == before


def test_tool_params_derive_from_the_tool_specs() -> None:
    """``tool_params``: each ToolSpec's description and input schema (any object without
    one, no description when it has none) as the client tools the SDK sends."""
    script = ModelScript(FINAL)
    specs = described(KbTools().specs())
    http = httpx2.Client(transport=script.transport())
    with anthropic.Anthropic(api_key="test", http_client=http, max_retries=0) as client:
        client.messages.create(
            model=MODEL, max_tokens=64, tools=tool_params(specs), messages=[QUESTION]
        )
    any_object = {"type": "object"}
    assert script.bodies[0]["tools"] == [
        *TOOLS,
        {"name": "fail", "input_schema": any_object},
        {"name": "admin", "input_schema": any_object},
    ]


def test_the_docs_loop_runs_as_written(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/integrations.md's Anthropic loop, against a local scripted Messages API."""
    text = (pathlib.Path(__file__).parents[3] / "docs" / "integrations.md").read_text()
    block = re.search(r"## Anthropic\n.*?```python\n(.*?)```", text, re.S)
    assert block is not None
    canon_lines = [line for line in block.group(1).splitlines() if re.search(r"canon|ctx", line)]
    assert len(canon_lines) <= 3, canon_lines
    docs_turn = message([tool_use(IDS[1], "search", {"q": "refunds"})])
    script = ModelScript(docs_turn, FINAL)
    with SyncStore.from_url(redis_url, namespace=namespace) as store, serve(script) as url:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        tools = described(KbTools().specs())
        boundary = SyncBoundary(store, tools, on_duplicate="replay")
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", url)
        exec(block.group(1), {"boundary": boundary, "ctx": RunContext(RUN), "TOOLS": tools})
    assert script.bodies[0]["tools"][0] == TOOLS[0]
    sent = script.bodies[1]["messages"]
    assert sent[1] == {"role": "assistant", "content": docs_turn["content"]}
    assert compact(sent[2]) == compact(
        {"role": "user", "content": [result_block(IDS[1], titles("refunds"))]}
    )


def test_without_the_sdk_the_import_names_the_extra() -> None:
    """No anthropic package: one ImportError naming canon-store[anthropic]."""
    code = (
        "import sys; sys.modules['anthropic'] = None\n"
        "try:\n    import canon.integrations.anthropic\n"
        "except ImportError as error:\n    print(error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "pip install 'canon-store[anthropic]'" in result.stdout
