"""canon.integrations.openai: the real SDK, a scripted endpoint, a real Redis.

Each test lets the SDK parse a recorded reply, routes its tool calls through the
boundary, sends the next request and checks exactly what the SDK sent.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from canon.integrations.openai import (
    ERROR_PREFIX,
    call_outputs,
    call_outputs_sync,
    chat_tools,
    response_tools,
    tool_messages,
    tool_messages_sync,
)
from eventstore import (
    Projection,
    RunContext,
    Store,
    SyncBoundary,
    SyncStore,
    ToolBoundary,
    ToolCall,
    ToolSpec,
)
from machine.codes import Status
from tests.support.calls import RUN, open_run
from tests.support.openai_scripted import (
    FINAL_RESPONSE_ID,
    RESPONSE_ID,
    ScriptedOpenAI,
    Tools,
    chat_completion,
    custom_call,
    error_content,
    function_call,
    response,
    response_custom_call,
    response_function_call,
    response_message,
)
from tests.support.tools import namespace_keys

MODEL = "gpt-4.1"
USER = {"role": "user", "content": "Refunds and shipping, please."}

#: One turn of six parallel calls: three searches (which must run at the same time), a
#: tool without parameters sent "", a failing tool, truncated JSON and a custom tool.
PARALLEL_CALLS = [
    function_call("call_FthC9qRpsL5kBpwwyw6c7j4k", "search_kb", '{"q": "refund"}'),
    function_call("call_3Rk8ZpL2vWq9Xy7Tn4Bm1Cd6", "search_kb", '{"q": "shipping"}'),
    function_call("call_Q7mN2xV8bK4pL9sT1wY6zR3c", "search_kb", '{"q": "returns"}'),
    function_call("call_Hq2Lm8Zx4Nc7Vb1Ks9Pw3Ty5", "ping", ""),
    function_call("call_Wd6Xe1Rf8Tg3Yh5Uj2Ik9Ol4P", "fail", "{}"),
    function_call("call_Za1Sx2Dc3Fv4Gb5Hn6Jm7Kl8", "search_kb", '{"q": "ref'),
    custom_call("call_Cu5Tm9Gr2Am4Ma7Rx1Yz3Pq8", "grammar", "SELECT 1"),
]


def failed(code: str) -> tuple[str, dict[str, Any]]:
    """What :func:`shown` reads for a canon error: the flag, then the safe error."""
    return ("error", error_content(code))


PARALLEL_CONTENTS = [
    ["refund policy"],
    ["shipping policy"],
    ["returns policy"],
    {"arguments": {}},
    failed("EXECUTION_FAILED"),
    failed("INVALID_INPUT"),
    {"parsed": "SELECT 1"},
]


def shown(text: str) -> Any:
    """What the model reads in a tool output: a result's JSON value, or for text flagged
    ``Error: `` the pair ("error", the safe error JSON after the flag)."""
    if text.startswith(ERROR_PREFIX):
        return ("error", json.loads(text.removeprefix(ERROR_PREFIX)))
    return json.loads(text)


def rendered(content: Any) -> str:
    """The output text of an expected content (:func:`shown` read backwards)."""
    if isinstance(content, tuple):
        return ERROR_PREFIX + json.dumps(content[1])
    return json.dumps(content)


def expected_tool_messages(calls: list[dict[str, Any]], contents: list[Any]) -> list[Any]:
    """The tool messages the next request must carry, in the calls' order."""
    return [
        {"role": "tool", "tool_call_id": call["id"], "content": rendered(content)}
        for call, content in zip(calls, contents, strict=True)
    ]


def decoded(messages: list[Any]) -> list[Any]:
    """Tool messages with their content read (compact JSON or not, the same value)."""
    return [{**message, "content": shown(message["content"])} for message in messages]


@pytest.fixture
def sync_store(redis_url: str, namespace: str) -> Any:
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        yield store


def chat_turn_sync(
    boundary: SyncBoundary, tool_calls: list[dict[str, Any]]
) -> tuple[list[Any], dict[str, Any]]:
    """One model turn asking for ``tool_calls``, canon, then the next request's body."""
    endpoint = ScriptedOpenAI(chat_completion(tool_calls), chat_completion(None, "Done."))
    with endpoint.client() as client:
        messages: list[Any] = [USER]
        completion = client.chat.completions.create(model=MODEL, messages=messages)
        message = completion.choices[0].message
        messages.append(message)
        replies = tool_messages_sync(boundary, RunContext(RUN), message)
        messages.extend(replies)
        final = client.chat.completions.create(model=MODEL, messages=messages)
    assert final.choices[0].message.content == "Done."
    return replies, endpoint.requests[1]


def test_chat_parallel_calls_sync(sync_store: SyncStore) -> None:
    """Seven calls in one turn run together; the next request answers each in order, ids
    echoed exactly, errors as their safe JSON, nothing of the raw response."""
    tools = Tools(together=3)
    boundary = SyncBoundary(sync_store, tools.specs())
    replies, sent = chat_turn_sync(boundary, PARALLEL_CALLS)
    expected = expected_tool_messages(PARALLEL_CALLS, PARALLEL_CONTENTS)
    assert decoded(replies) == decoded(expected)
    # The assistant's turn as the model sent it, then exactly our tool messages.
    assert sent["messages"][0] == USER
    assert sent["messages"][1]["tool_calls"] == PARALLEL_CALLS
    assert sent["messages"][2:] == replies
    assert "raw only" not in json.dumps(sent) and "hunter2" not in json.dumps(sent)
    assert tools.runs == {"search_kb": 3, "ping": 1, "fail": 1, "grammar": 1}


async def test_chat_parallel_calls_async(store: Store) -> None:
    """The async variant: the same turn through a ToolBoundary and AsyncOpenAI."""
    await open_run(store)
    tools = Tools(together=3)
    boundary = ToolBoundary(store, tools.specs())
    endpoint = ScriptedOpenAI(chat_completion(PARALLEL_CALLS), chat_completion(None, "Done."))
    client = endpoint.async_client()
    try:
        messages: list[Any] = [USER]
        completion = await client.chat.completions.create(model=MODEL, messages=messages)
        message = completion.choices[0].message
        messages.append(message)
        messages.extend(await tool_messages(boundary, RunContext(RUN), message))
        await client.chat.completions.create(model=MODEL, messages=messages)
    finally:
        await endpoint.aclose()
    sent = endpoint.requests[1]["messages"][2:]
    assert decoded(sent) == decoded(expected_tool_messages(PARALLEL_CALLS, PARALLEL_CONTENTS))
    assert tools.runs == {"search_kb": 3, "ping": 1, "fail": 1, "grammar": 1}


def test_chat_unknown_and_unauthorized_tools(sync_store: SyncStore) -> None:
    """A tool the boundary does not know and one it may not run: their safe errors, and
    the unauthorized executor never runs."""
    tools = Tools()
    calls = [
        function_call("call_Un1kn0wnT00lCa11Xy7Tn4Bm", "delete_everything", "{}"),
        function_call("call_AdM1nCa11Wq9Xy7Tn4Bm1Cd6", "admin", '{"user": "root"}'),
    ]
    _, sent = chat_turn_sync(SyncBoundary(sync_store, tools.specs()), calls)
    expected = expected_tool_messages(calls, [failed("UNKNOWN_TOOL"), failed("UNAUTHORIZED")])
    assert decoded(sent["messages"][2:]) == decoded(expected)
    assert tools.runs == {}


def test_chat_dict_message_and_no_tool_calls(sync_store: SyncStore) -> None:
    """The dict form of a message is accepted (arguments null or missing mean {}); a
    message without tool calls gives []."""
    boundary = SyncBoundary(sync_store, Tools().specs())
    message = {"role": "assistant", "content": None, "tool_calls": [PARALLEL_CALLS[3]]}
    [reply] = tool_messages_sync(boundary, RunContext(RUN), message)
    assert reply["tool_call_id"] == "call_Hq2Lm8Zx4Nc7Vb1Ks9Pw3Ty5"
    assert json.loads(reply["content"]) == {"arguments": {}}
    assert tool_messages_sync(boundary, RunContext(RUN), {"role": "assistant"}) == []
    no_arguments = {"id": "call_N0Args", "type": "function", "function": {"name": "ping"}}
    null_arguments = function_call("call_NullArgs", "ping", None)
    replies = tool_messages_sync(
        boundary, RunContext(RUN), {"tool_calls": [no_arguments, null_arguments]}
    )
    assert [json.loads(reply["content"]) for reply in replies] == [{"arguments": {}}] * 2


def test_chat_refused_id_is_still_answered_under_it(sync_store: SyncStore) -> None:
    """An id the boundary refuses (whitespace) gets INVALID_TOOL_CALL_ID, answered under
    the id the model sent, so the next request pairs every call with its answer."""
    call = function_call("call with space", "ping", "{}")
    tools = Tools()
    boundary = SyncBoundary(sync_store, tools.specs())
    [reply] = tool_messages_sync(boundary, RunContext(RUN), {"tool_calls": [call]})
    assert reply["tool_call_id"] == "call with space"
    assert shown(reply["content"]) == failed("INVALID_TOOL_CALL_ID")
    assert tools.runs == {}


@pytest.mark.parametrize("arguments", ["null", "[1, 2]", '"text"'])
def test_chat_non_object_arguments_are_invalid_input(sync_store: SyncStore, arguments: str) -> None:
    """Only "" and null-as-nothing mean {}: JSON that is not an object stays INVALID_INPUT."""
    call = function_call("call_N0nObj3ctArgs9Xy7Tn4Bm1", "ping", arguments)
    boundary = SyncBoundary(sync_store, Tools().specs())
    [reply] = tool_messages_sync(boundary, RunContext(RUN), {"tool_calls": [call]})
    assert shown(reply["content"]) == failed("INVALID_INPUT")


def test_chat_resent_turn_is_replayed(sync_store: SyncStore) -> None:
    """A harness that sends the same turn twice gets the same tool messages, and the
    tools ran once; with the default boundary it would get DUPLICATE_TOOL_CALL."""
    tools = Tools(together=3)
    boundary = SyncBoundary(sync_store, tools.specs(), on_duplicate="replay")
    first, first_sent = chat_turn_sync(boundary, PARALLEL_CALLS)
    again, again_sent = chat_turn_sync(boundary, PARALLEL_CALLS)
    assert again == first
    assert again_sent == first_sent
    assert tools.runs == {"search_kb": 3, "ping": 1, "fail": 1, "grammar": 1}
    refusing = SyncBoundary(sync_store, tools.specs())
    refused = tool_messages_sync(refusing, RunContext(RUN), {"tool_calls": PARALLEL_CALLS[:1]})
    assert shown(refused[0]["content"]) == failed("DUPLICATE_TOOL_CALL")


#: A Responses API turn: reasoning, a hosted web search and a message are not ours to
#: answer; five function calls (one failing, one unknown, one unauthorized, one made by a
#: hosted program) and a custom tool call are.
RESPONSE_OUTPUT = [
    {
        "type": "reasoning",
        "id": "rs_67ccd2bf17f0819081ff3bb2cf6508e60bb6a6b452d3795b",
        "summary": [],
    },
    {
        "type": "web_search_call",
        "id": "ws_67ccd2bf3c2c8190a3f8e3b2e47da0460bb6a6b452d3795b",
        "status": "completed",
        "action": {"type": "search", "query": "refund policy"},
    },
    response_message("msg_67ccd2bf8d4c8190b0e2ab2b0a1f7b2a0bb6a6b452d3795b", "Let me check."),
    response_function_call(
        "fc_67ccd2c3b5c48190a1c6b6e1a7f43c1f0bb6a6b452d3795b",
        "call_FthC9qRpsL5kBpwwyw6c7j4k",
        "search_kb",
        '{"q": "refund"}',
    ),
    response_function_call(
        "fc_67ccd2c3b5d08190b4c1f8b0e5a1c3d20bb6a6b452d3795b",
        "call_3Rk8ZpL2vWq9Xy7Tn4Bm1Cd6",
        "search_kb",
        '{"q": "shipping"}',
        caller={"type": "program", "caller_id": "call_Pr0gRamCa11er9Xy7Tn4Bm1"},
    ),
    response_function_call(
        "fc_67ccd2c3b5dc8190a0f2b3c4d5e6f7a80bb6a6b452d3795b",
        "call_Wd6Xe1Rf8Tg3Yh5Uj2Ik9Ol4P",
        "fail",
        "",
    ),
    response_function_call(
        "fc_67ccd2c3b5e88190b1a2c3d4e5f6a7b80bb6a6b452d3795b",
        "call_Un1kn0wnT00lCa11Xy7Tn4Bm",
        "delete_everything",
        "{}",
    ),
    response_function_call(
        "fc_67ccd2c3b5f48190a9b8c7d6e5f4a3b20bb6a6b452d3795b",
        "call_AdM1nCa11Wq9Xy7Tn4Bm1Cd6",
        "admin",
        "{}",
    ),
    response_custom_call(
        "ctc_67ccd2c3b6008190b2c3d4e5f6a7b8c90bb6a6b452d3795b",
        "call_Cu5Tm9Gr2Am4Ma7Rx1Yz3Pq8",
        "grammar",
        "SELECT 1",
    ),
]
RESPONSE_OUTPUTS = [
    {
        "type": "function_call_output",
        "call_id": "call_FthC9qRpsL5kBpwwyw6c7j4k",
        "output": ["refund policy"],
    },
    {
        "type": "function_call_output",
        "call_id": "call_3Rk8ZpL2vWq9Xy7Tn4Bm1Cd6",
        "output": ["shipping policy"],
        "caller": {"type": "program", "caller_id": "call_Pr0gRamCa11er9Xy7Tn4Bm1"},
    },
    {
        "type": "function_call_output",
        "call_id": "call_Wd6Xe1Rf8Tg3Yh5Uj2Ik9Ol4P",
        "output": failed("EXECUTION_FAILED"),
    },
    {
        "type": "function_call_output",
        "call_id": "call_Un1kn0wnT00lCa11Xy7Tn4Bm",
        "output": failed("UNKNOWN_TOOL"),
    },
    {
        "type": "function_call_output",
        "call_id": "call_AdM1nCa11Wq9Xy7Tn4Bm1Cd6",
        "output": failed("UNAUTHORIZED"),
    },
    {
        "type": "custom_tool_call_output",
        "call_id": "call_Cu5Tm9Gr2Am4Ma7Rx1Yz3Pq8",
        "output": {"parsed": "SELECT 1"},
    },
]


def decoded_outputs(items: list[Any]) -> list[Any]:
    """Output items with their output read (see :func:`shown`)."""
    return [{**item, "output": shown(item["output"])} for item in items]


def responses_turn_sync(boundary: SyncBoundary) -> tuple[list[Any], dict[str, Any]]:
    """One Responses turn, canon, then the next request (chained by previous_response_id)."""
    final = response([response_message("msg_final", "Done.")], FINAL_RESPONSE_ID)
    endpoint = ScriptedOpenAI(response(RESPONSE_OUTPUT), final)
    with endpoint.client() as client:
        first = client.responses.create(model=MODEL, input="Refunds and shipping, please.")
        outputs = call_outputs_sync(boundary, RunContext(RUN), first)
        last = client.responses.create(model=MODEL, previous_response_id=first.id, input=outputs)
    assert last.output_text == "Done."
    assert endpoint.paths == ["/v1/responses", "/v1/responses"]
    return outputs, endpoint.requests[1]


def test_responses_calls_sync(sync_store: SyncStore) -> None:
    """Function and custom tool calls become their output items keyed by call_id, in
    order, a program caller answered to; other items skipped; the next request carries
    exactly those items."""
    tools = Tools(together=2)
    outputs, sent = responses_turn_sync(SyncBoundary(sync_store, tools.specs()))
    assert sent["previous_response_id"] == RESPONSE_ID
    assert sent["input"] == outputs
    assert decoded_outputs(sent["input"]) == RESPONSE_OUTPUTS
    assert tools.runs == {"search_kb": 2, "fail": 1, "grammar": 1}


async def test_responses_calls_async(store: Store) -> None:
    """The async variant with AsyncOpenAI; a list of output items works like a Response."""
    await open_run(store)
    tools = Tools(together=2)
    boundary = ToolBoundary(store, tools.specs())
    endpoint = ScriptedOpenAI(response(RESPONSE_OUTPUT), response([], FINAL_RESPONSE_ID))
    client = endpoint.async_client()
    try:
        first = await client.responses.create(model=MODEL, input="Refunds, please.")
        outputs = await call_outputs(boundary, RunContext(RUN), first.output)
        await client.responses.create(model=MODEL, previous_response_id=first.id, input=outputs)
    finally:
        await endpoint.aclose()
    assert decoded_outputs(endpoint.requests[1]["input"]) == RESPONSE_OUTPUTS
    assert tools.runs == {"search_kb": 2, "fail": 1, "grammar": 1}


def test_responses_resent_turn_is_replayed(sync_store: SyncStore) -> None:
    """The same response handled twice: the same output items, each tool run once."""
    tools = Tools(together=2)
    boundary = SyncBoundary(sync_store, tools.specs(), on_duplicate="replay")
    first, first_sent = responses_turn_sync(boundary)
    again, again_sent = responses_turn_sync(boundary)
    assert again == first and again_sent == first_sent
    assert tools.runs == {"search_kb": 2, "fail": 1, "grammar": 1}


def test_responses_dict_items(sync_store: SyncStore) -> None:
    """Plain dict output items (a stored transcript) are handled like the SDK's models."""
    boundary = SyncBoundary(sync_store, Tools().specs())
    item = response_function_call("fc_1", "call_Hq2Lm8Zx4Nc7Vb1Ks9Pw3Ty5", "ping", "")
    [output] = call_outputs_sync(boundary, RunContext(RUN), [RESPONSE_OUTPUT[0], item])
    assert decoded_outputs([output]) == [
        {"type": "function_call_output", "call_id": item["call_id"], "output": {"arguments": {}}}
    ]


def lookalike_specs() -> dict[str, ToolSpec]:
    """``lookalike``: a tool whose own successful result is shaped like canon's error;
    ``fail``: a tool that raises (a canon EXECUTION_FAILED)."""

    def lookalike(arguments: dict[str, Any], call: ToolCall) -> Any:
        return error_content("EXECUTION_FAILED")

    def fail(arguments: dict[str, Any], call: ToolCall) -> Any:
        raise RuntimeError("down")

    def project(raw: Any, call: ToolCall) -> Projection:
        return Projection(result=raw, evidence_status="EVIDENCE_FOUND", scope="kb")

    return {
        "lookalike": ToolSpec(executor=lookalike, projector=project),
        "fail": ToolSpec(executor=fail, projector=project),
    }


def test_a_result_shaped_like_an_error_is_not_flagged(sync_store: SyncStore) -> None:
    """A tool that answers {error_code, message} succeeded: its output is that JSON, while
    canon's own error is flagged "Error: " (never JSON), in Chat and Responses alike."""
    boundary = SyncBoundary(sync_store, lookalike_specs())
    calls = [
        function_call("call_L00kAl1keXy7Tn4Bm1Cd6", "lookalike", "{}"),
        function_call("call_Fa1lsXy7Tn4Bm1Cd6Wq9", "fail", "{}"),
    ]
    _, sent = chat_turn_sync(boundary, calls)
    result, error = (message["content"] for message in sent["messages"][2:])
    assert json.loads(result) == error_content("EXECUTION_FAILED")
    assert error == ERROR_PREFIX + json.dumps(
        error_content("EXECUTION_FAILED"), separators=(",", ":")
    )
    assert shown(result) != shown(error) == failed("EXECUTION_FAILED")
    items = [
        response_function_call("fc_1", "call_L00kAl1keRe5p0nse5Xy7", "lookalike", "{}"),
        response_function_call("fc_2", "call_Fa1lsRe5p0nse5Xy7Tn4B", "fail", "{}"),
    ]
    outputs = call_outputs_sync(boundary, RunContext(RUN), items)
    assert [shown(item["output"]) for item in outputs] == [
        error_content("EXECUTION_FAILED"),
        failed("EXECUTION_FAILED"),
    ]


async def test_the_async_helpers_take_a_sync_boundary(sync_store: SyncStore) -> None:
    """Inside asyncio, ``tool_messages`` and ``call_outputs`` run a SyncBoundary's calls on
    its own loop: the replies come back and the records are READY."""
    tools = Tools(together=2)
    boundary = SyncBoundary(sync_store, tools.specs())
    ctx = RunContext(RUN)
    replies = await tool_messages(boundary, ctx, {"tool_calls": PARALLEL_CALLS[:2]})
    assert decoded(replies) == decoded(
        expected_tool_messages(PARALLEL_CALLS[:2], PARALLEL_CONTENTS[:2])
    )
    item = response_function_call("fc_1", "call_SyncB0undaryAs7nc01", "ping", "")
    [output] = await call_outputs(boundary, ctx, [item])
    assert shown(output["output"]) == {"arguments": {}}
    for call_id in [PARALLEL_CALLS[0]["id"], "call_SyncB0undaryAs7nc01"]:
        record = sync_store.get(RUN, call_id)
        assert record is not None and record.state.status is Status.READY


async def test_the_sync_helpers_refuse_an_async_boundary_before_any_record(
    store: Store, redis: Any, namespace: str
) -> None:
    """``tool_messages_sync`` / ``call_outputs_sync`` given an async ToolBoundary: one
    TypeError naming SyncBoundary, before any call is checked, run or recorded."""
    await open_run(store)
    tools = Tools()
    boundary = ToolBoundary(store, tools.specs())
    before = await namespace_keys(redis, namespace)
    with pytest.raises(TypeError, match="SyncBoundary"):
        tool_messages_sync(boundary, RunContext(RUN), {"tool_calls": PARALLEL_CALLS[3:4]})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="SyncBoundary"):
        call_outputs_sync(boundary, RunContext(RUN), [RESPONSE_OUTPUT[3]])
    assert tools.runs == {}
    assert await namespace_keys(redis, namespace) == before
    assert await store.get(RUN, PARALLEL_CALLS[3]["id"]) is None


#: Tools described once, in their ToolSpecs: the request's ``tools=`` derive from them.
DESCRIBED = {
    "search_kb": ToolSpec(
        executor=lambda arguments, call: {"titles": [arguments["q"]]},
        projector=lambda raw, call: Projection(
            result=raw["titles"], evidence_status="EVIDENCE_FOUND"
        ),
        description="Search the knowledge base.",
        input_schema={"type": "object", "properties": {"q": {"type": "string"}}},
    ),
    "ping": ToolSpec(
        executor=lambda arguments, call: {},
        projector=lambda raw, call: Projection(result=raw, evidence_status="NO_EVIDENCE"),
    ),
}


def test_the_request_tools_derive_from_the_tool_specs() -> None:
    """``chat_tools`` / ``response_tools``: each ToolSpec's description and input schema (any
    object without one) as the function definitions the SDK sends, in the specs' order."""
    endpoint = ScriptedOpenAI(chat_completion(None, "ok"), response([response_message("m", "ok")]))
    with endpoint.client() as client:
        client.chat.completions.create(model=MODEL, messages=[USER], tools=chat_tools(DESCRIBED))
        client.responses.create(model=MODEL, input="hi", tools=response_tools(DESCRIBED))
    search_schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    assert endpoint.requests[0]["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "search_kb",
                "parameters": search_schema,
                "description": "Search the knowledge base.",
            },
        },
        {"type": "function", "function": {"name": "ping", "parameters": {"type": "object"}}},
    ]
    assert endpoint.requests[1]["tools"] == [
        {
            "type": "function",
            "name": "search_kb",
            "parameters": search_schema,
            "strict": None,
            "description": "Search the knowledge base.",
        },
        {"type": "function", "name": "ping", "parameters": {"type": "object"}, "strict": None},
    ]
    assert chat_tools(DESCRIBED, strict=True)[0]["function"]["strict"] is True
