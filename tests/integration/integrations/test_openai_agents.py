"""canon.integrations.openai_agents: a real Runner, a scripted Responses endpoint, real Redis.

The Agents SDK's own ``OpenAIResponsesModel`` talks to the scripted endpoint through an
``AsyncOpenAI`` client, so the tests check exactly the ``function_call_output`` items the
SDK sends back to the model after canon ran the calls.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import pytest
from agents import (
    Agent,
    FunctionTool,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    UserError,
    set_tracing_disabled,
)

from canon.integrations.openai import ERROR_PREFIX
from canon.integrations.openai_agents import function_tool, function_tools
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
from machine.codes import ErrorCode, Status
from tests.support.calls import RUN, open_run
from tests.support.openai_scripted import (
    FINAL_RESPONSE_ID,
    ScriptedOpenAI,
    Tools,
    chat_completion,
    error_content,
    in_thread,
    response,
    response_function_call,
    response_message,
)
from tests.support.openai_scripted import (
    function_call as chat_function_call,
)
from tests.support.waiting import wait_for

T = TypeVar("T")
MODEL = "gpt-4.1"
QUESTION = "Refunds and shipping, please."
#: No trace leaves the process (the SDK would export to the network by default).
RUN_CONFIG = RunConfig(tracing_disabled=True)
SEARCH_SCHEMA = {
    "type": "object",
    "properties": {"q": {"type": "string"}},
    "required": ["q"],
}
EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}

#: One turn of six parallel calls: three searches that must run at the same time, a
#: failing tool, a tool the boundary does not know and one it may not run.
CALLS = [
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
    ),
    response_function_call(
        "fc_67ccd2c3b5dc8190a0f2b3c4d5e6f7a80bb6a6b452d3795b",
        "call_Q7mN2xV8bK4pL9sT1wY6zR3c",
        "search_kb",
        '{"q": "returns"}',
    ),
    response_function_call(
        "fc_67ccd2c3b5e88190b1a2c3d4e5f6a7b80bb6a6b452d3795b",
        "call_Wd6Xe1Rf8Tg3Yh5Uj2Ik9Ol4P",
        "fail",
        "{}",
    ),
    response_function_call(
        "fc_67ccd2c3b5f48190a9b8c7d6e5f4a3b20bb6a6b452d3795b",
        "call_Un1kn0wnT00lCa11Xy7Tn4Bm",
        "delete_everything",
        "{}",
    ),
    response_function_call(
        "fc_67ccd2c3b6008190b2c3d4e5f6a7b8c90bb6a6b452d3795b",
        "call_AdM1nCa11Wq9Xy7Tn4Bm1Cd6",
        "admin",
        "{}",
    ),
]


def failed(code: str) -> tuple[str, dict[str, Any]]:
    """What :func:`shown` reads for a canon error: the flag, then the safe error."""
    return ("error", error_content(code))


OUTPUTS = [
    ["refund policy"],
    ["shipping policy"],
    ["returns policy"],
    failed("EXECUTION_FAILED"),
    failed("UNKNOWN_TOOL"),
    failed("UNAUTHORIZED"),
]


def shown(text: str) -> Any:
    """What the model reads in a tool output: a result's JSON value, or for text flagged
    ``Error: `` the pair ("error", the safe error JSON after the flag)."""
    if text.startswith(ERROR_PREFIX):
        return ("error", json.loads(text.removeprefix(ERROR_PREFIX)))
    return json.loads(text)


def expected_outputs(calls: list[dict[str, Any]], outputs: list[Any]) -> list[dict[str, Any]]:
    """The function_call_output items the next request must carry."""
    return [
        {"type": "function_call_output", "call_id": call["call_id"], "output": output}
        for call, output in zip(calls, outputs, strict=True)
    ]


def sent_outputs(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The function_call_output items of a request, their output read (see :func:`shown`)."""
    return [
        {**item, "output": shown(item["output"])}
        for item in request["input"]
        if item.get("type") == "function_call_output"
    ]


def agent_tools(boundary: ToolBoundary | SyncBoundary, **options: Any) -> list[FunctionTool]:
    """FunctionTools for every name the model may call (one the boundary does not know)."""
    return [
        function_tool(
            boundary,
            "search_kb",
            description="Search the knowledge base.",
            params_json_schema=SEARCH_SCHEMA,
            **options,
        ),
        *(
            function_tool(
                boundary, name, description=f"The {name} tool.", params_json_schema=EMPTY_SCHEMA
            )
            for name in ("fail", "delete_everything", "admin")
        ),
    ]


_endpoints: list[ScriptedOpenAI] = []


def scripted(calls: list[dict[str, Any]]) -> ScriptedOpenAI:
    """A model that asks for ``calls``, then answers (its clients closed after the test)."""
    endpoint = ScriptedOpenAI(
        response(calls), response([response_message("msg_final", "Done.")], FINAL_RESPONSE_ID)
    )
    _endpoints.append(endpoint)
    return endpoint


@pytest.fixture(autouse=True)
async def close_endpoints() -> Any:
    yield
    while _endpoints:
        await _endpoints.pop().aclose()


def agent_on(endpoint: ScriptedOpenAI, tools: list[FunctionTool]) -> Agent[Any]:
    """An agent whose model is the SDK's Responses model over the scripted endpoint."""
    model = OpenAIResponsesModel(model=MODEL, openai_client=endpoint.async_client())
    return Agent(name="support", instructions="Answer from the kb.", model=model, tools=tools)


@pytest.fixture(autouse=True, scope="module")
def no_tracing() -> Iterator[None]:
    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)


@pytest.fixture
def sync_store(redis_url: str, namespace: str) -> Iterator[SyncStore]:
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        yield store


async def test_runner_run_parallel_calls(store: Store) -> None:
    """``await Runner.run`` with a ToolBoundary: six calls of one turn run through canon
    at once, and the next request answers each call_id with the bounded result or the
    safe error."""
    await open_run(store)
    tools = Tools(together=3)
    endpoint = scripted(CALLS)
    agent = agent_on(endpoint, agent_tools(ToolBoundary(store, tools.specs())))
    result = await Runner.run(agent, QUESTION, context=RunContext(RUN), run_config=RUN_CONFIG)
    assert result.final_output == "Done."
    assert sent_outputs(endpoint.requests[1]) == expected_outputs(CALLS, OUTPUTS)
    assert "raw only" not in json.dumps(endpoint.requests[1])
    assert "hunter2" not in json.dumps(endpoint.requests[1])
    assert tools.runs == {"search_kb": 3, "fail": 1}
    record = await store.get(RUN, "call_FthC9qRpsL5kBpwwyw6c7j4k")
    assert record is not None and record.state.tool_call_id == "call_FthC9qRpsL5kBpwwyw6c7j4k"


def test_runner_run_sync_parallel_calls(sync_store: SyncStore) -> None:
    """``Runner.run_sync`` (its own event loop) with a SyncBoundary: the same turn works."""
    tools = Tools(together=3)
    endpoint = scripted(CALLS)
    agent = agent_on(endpoint, agent_tools(SyncBoundary(sync_store, tools.specs())))
    result = in_thread(
        lambda: Runner.run_sync(agent, QUESTION, context=RunContext(RUN), run_config=RUN_CONFIG)
    )
    assert result.final_output == "Done."
    assert sent_outputs(endpoint.requests[1]) == expected_outputs(CALLS, OUTPUTS)
    assert tools.runs == {"search_kb": 3, "fail": 1}


async def test_sync_boundary_under_runner_run(sync_store: SyncStore) -> None:
    """A SyncBoundary serves ``await Runner.run`` too, from the caller's loop."""
    tools = Tools()
    endpoint = scripted(CALLS[:1])
    agent = agent_on(endpoint, agent_tools(SyncBoundary(sync_store, tools.specs())))
    await Runner.run(agent, QUESTION, context=RunContext(RUN), run_config=RUN_CONFIG)
    assert sent_outputs(endpoint.requests[1]) == expected_outputs(CALLS[:1], OUTPUTS[:1])


async def test_run_sync_with_an_async_boundary_is_a_clear_error(store: Store) -> None:
    """An async store used from Runner.run_sync's own loop ends the run with the SDK's
    UserError that says what to use, not with a STORE_UNAVAILABLE told to the model."""
    await open_run(store)
    tools = Tools()
    endpoint = scripted(CALLS[:1])
    agent = agent_on(endpoint, agent_tools(ToolBoundary(store, tools.specs())))
    with pytest.raises(UserError, match="SyncBoundary"):
        await asyncio.to_thread(
            in_thread,
            lambda: Runner.run_sync(
                agent, QUESTION, context=RunContext(RUN), run_config=RUN_CONFIG
            ),
        )
    assert len(endpoint.requests) == 1 and tools.runs == {}


def test_resent_turn_is_replayed(sync_store: SyncStore) -> None:
    """The same model turn in two runs of one canon run (a harness retry): the SDK sends
    the same outputs both times and every tool ran once."""
    tools = Tools(together=3)
    boundary = SyncBoundary(sync_store, tools.specs(), on_duplicate="replay")
    sent = []
    for _ in range(2):
        endpoint = scripted(CALLS)
        agent = agent_on(endpoint, agent_tools(boundary))
        in_thread(
            lambda agent=agent: Runner.run_sync(
                agent, QUESTION, context=RunContext(RUN), run_config=RUN_CONFIG
            )
        )
        sent.append(sent_outputs(endpoint.requests[1]))
    assert sent[0] == sent[1] == expected_outputs(CALLS, OUTPUTS)
    assert tools.runs == {"search_kb": 3, "fail": 1}


@dataclass
class AppContext:
    """A harness's own context class that carries the canon run id."""

    user: str
    run_id: str


async def test_run_id_sources(store: Store) -> None:
    """The run comes from ``run=``, else from the Runner's context (a RunContext or any
    object with a run_id); without one the run ends with a UserError."""
    await open_run(store)
    await open_run(store, "run-b")
    boundary = ToolBoundary(store, Tools().specs())
    for context, run, run_id in [
        (AppContext("ann", "run-b"), None, "run-b"),
        (None, RunContext(RUN), RUN),
    ]:
        endpoint = scripted([{**CALLS[0], "call_id": f"call_{run_id}_src"}])
        agent = agent_on(endpoint, [agent_tools(boundary, run=run)[0]])
        await Runner.run(agent, QUESTION, context=context, run_config=RUN_CONFIG)
        assert await store.get(run_id, f"call_{run_id}_src") is not None
    agent = agent_on(scripted(CALLS[:1]), agent_tools(boundary)[:1])
    with pytest.raises(UserError, match="no run id"):
        await Runner.run(agent, QUESTION, context={"user": "ann"}, run_config=RUN_CONFIG)


async def test_strict_schema_as_the_sdk_makes_it(store: Store) -> None:
    """The model is shown the caller's schema, made strict by the SDK itself; arguments
    "" (no parameters) reach the tool as {}."""
    await open_run(store)
    endpoint = scripted(
        [response_function_call("fc_p", "call_Hq2Lm8Zx4Nc7Vb1Ks9Pw3Ty5", "ping", "")]
    )
    ping = function_tool(
        ToolBoundary(store, Tools().specs()),
        "ping",
        description="Is the service up?",
        params_json_schema=EMPTY_SCHEMA,
    )
    agent = agent_on(endpoint, [ping])
    await Runner.run(agent, QUESTION, context=RunContext(RUN), run_config=RUN_CONFIG)
    [shown] = endpoint.requests[0]["tools"]
    assert shown["name"] == "ping" and shown["strict"] is True
    assert shown["parameters"] == {**EMPTY_SCHEMA, "additionalProperties": False, "required": []}
    assert sent_outputs(endpoint.requests[1])[0]["output"] == {"arguments": {}}


async def test_approvals_pass_through(store: Store) -> None:
    """``needs_approval`` is the SDK's: the run stops before canon sees the call (no
    record); once approved, the call runs through canon; a rejected one never does."""
    await open_run(store)
    tools = Tools()
    boundary = ToolBoundary(store, tools.specs())
    calls = [
        CALLS[0],
        response_function_call("fc_2", "call_Rej3ctedCa11Xy7Tn4Bm1Cd", "search_kb", '{"q": "x"}'),
    ]
    endpoint = scripted(calls)
    agent = agent_on(endpoint, agent_tools(boundary, needs_approval=True)[:1])
    first = await Runner.run(agent, QUESTION, context=RunContext(RUN), run_config=RUN_CONFIG)
    assert [item.raw_item.call_id for item in first.interruptions] == [
        "call_FthC9qRpsL5kBpwwyw6c7j4k",
        "call_Rej3ctedCa11Xy7Tn4Bm1Cd",
    ]
    assert await store.get(RUN, "call_FthC9qRpsL5kBpwwyw6c7j4k") is None
    state = first.to_state()
    approve, reject = first.interruptions
    state.approve(approve)
    state.reject(reject)
    result = await Runner.run(agent, state, run_config=RUN_CONFIG)
    assert result.final_output == "Done."
    approved, rejected = [
        item for item in endpoint.requests[1]["input"] if item.get("type") == "function_call_output"
    ]
    assert {**approved, "output": shown(approved["output"])} == expected_outputs(
        CALLS[:1], OUTPUTS[:1]
    )[0]
    # The SDK answers a rejected call itself, with its own message.
    assert rejected["call_id"] == "call_Rej3ctedCa11Xy7Tn4Bm1Cd"
    assert rejected["output"] == "Tool execution was not approved."
    assert tools.runs == {"search_kb": 1}
    assert await store.get(RUN, "call_Rej3ctedCa11Xy7Tn4Bm1Cd") is None


async def test_chat_completions_model(store: Store) -> None:
    """Under the SDK's Chat Completions model the chat ``tool_call_id``s go to canon and
    come back as the ``role: "tool"`` messages of the next request."""
    await open_run(store)
    tools = Tools(together=2)
    calls = [
        chat_function_call("call_FthC9qRpsL5kBpwwyw6c7j4k", "search_kb", '{"q": "refund"}'),
        chat_function_call("call_3Rk8ZpL2vWq9Xy7Tn4Bm1Cd6", "search_kb", '{"q": "shipping"}'),
        chat_function_call("call_Wd6Xe1Rf8Tg3Yh5Uj2Ik9Ol4P", "fail", "{}"),
        chat_function_call("call_AdM1nCa11Wq9Xy7Tn4Bm1Cd6", "admin", ""),
    ]
    endpoint = ScriptedOpenAI(chat_completion(calls), chat_completion(None, "Done."))
    _endpoints.append(endpoint)
    model = OpenAIChatCompletionsModel(model=MODEL, openai_client=endpoint.async_client())
    tool_list = agent_tools(ToolBoundary(store, tools.specs()))
    agent = Agent(name="support", model=model, tools=tool_list)
    result = await Runner.run(agent, QUESTION, context=RunContext(RUN), run_config=RUN_CONFIG)
    assert result.final_output == "Done."
    assert endpoint.paths == ["/v1/chat/completions"] * 2
    sent = [m for m in endpoint.requests[1]["messages"] if m["role"] == "tool"]
    assert [(m["tool_call_id"], shown(m["content"])) for m in sent] == [
        ("call_FthC9qRpsL5kBpwwyw6c7j4k", ["refund policy"]),
        ("call_3Rk8ZpL2vWq9Xy7Tn4Bm1Cd6", ["shipping policy"]),
        ("call_Wd6Xe1Rf8Tg3Yh5Uj2Ik9Ol4P", failed("EXECUTION_FAILED")),
        ("call_AdM1nCa11Wq9Xy7Tn4Bm1Cd6", failed("UNAUTHORIZED")),
    ]
    assert tools.runs == {"search_kb": 2, "fail": 1}


def hanging_spec(release: threading.Event) -> dict[str, ToolSpec]:
    """A search_kb whose (threaded) executor waits for ``release``."""

    def hang(arguments: dict[str, Any], call: ToolCall) -> Any:
        assert release.wait(timeout=30), "never released"
        return {"titles": ["late"]}

    def project(raw: Any, call: ToolCall) -> Projection:
        return Projection(result=raw["titles"], evidence_status="EVIDENCE_FOUND", scope="kb")

    return {"search_kb": ToolSpec(executor=hang, projector=project)}


async def test_sdk_timeout_on_a_tool_boundary_closes_the_record(store: Store) -> None:
    """A call the SDK stops waiting for (timeout_seconds) is cancelled through the
    ToolBoundary: the model gets the SDK's timeout text, the record CALLER_CANCELLED."""
    await open_run(store)
    release = threading.Event()
    endpoint = scripted(CALLS[:1])
    tools = agent_tools(ToolBoundary(store, hanging_spec(release)), timeout_seconds=0.2)[:1]
    try:
        await Runner.run(
            agent_on(endpoint, tools), QUESTION, context=RunContext(RUN), run_config=RUN_CONFIG
        )
    finally:
        release.set()
    [output] = [i for i in endpoint.requests[1]["input"] if i.get("type") == "function_call_output"]
    assert "timed out" in output["output"]
    record = await store.get(RUN, CALLS[0]["call_id"])
    assert record is not None
    assert (record.state.status, record.state.error_code) == (
        Status.ERROR,
        ErrorCode.CALLER_CANCELLED,
    )


async def test_sdk_timeout_on_a_sync_boundary_lets_the_call_finish(
    sync_store: SyncStore,
) -> None:
    """On a SyncBoundary the call the SDK stopped waiting for finishes on the boundary's
    loop: its record ends READY, and a replayed retry gets that result."""
    release = threading.Event()
    boundary = SyncBoundary(sync_store, hanging_spec(release), on_duplicate="replay")
    endpoint = scripted(CALLS[:1])
    tools = agent_tools(boundary, timeout_seconds=0.2)[:1]
    try:
        await Runner.run(
            agent_on(endpoint, tools), QUESTION, context=RunContext(RUN), run_config=RUN_CONFIG
        )
    finally:
        release.set()
    [gave_up] = [
        i for i in endpoint.requests[1]["input"] if i.get("type") == "function_call_output"
    ]
    assert "timed out" in gave_up["output"]

    def finished() -> bool:
        record = sync_store.get(RUN, CALLS[0]["call_id"])
        return record is not None and record.state.status is Status.READY

    await wait_for(finished)
    retry = scripted(CALLS[:1])
    await Runner.run(
        agent_on(retry, agent_tools(boundary)[:1]),
        QUESTION,
        context=RunContext(RUN),
        run_config=RUN_CONFIG,
    )
    assert sent_outputs(retry.requests[1])[0]["output"] == ["late"]


async def test_a_result_shaped_like_an_error_is_not_flagged(store: Store) -> None:
    """A tool whose own result is {error_code, message} succeeded: the SDK sends that JSON;
    canon's error for a failing tool is flagged "Error: " and never parses as JSON."""
    await open_run(store)

    def lookalike(arguments: dict[str, Any], call: ToolCall) -> Any:
        return error_content("EXECUTION_FAILED")

    def project(raw: Any, call: ToolCall) -> Projection:
        return Projection(result=raw, evidence_status="EVIDENCE_FOUND", scope="kb")

    specs = {**Tools().specs(), "lookalike": ToolSpec(executor=lookalike, projector=project)}
    boundary = ToolBoundary(store, specs)
    calls = [
        response_function_call("fc_l", "call_L00kAl1keAgent5Xy7Tn4", "lookalike", "{}"),
        CALLS[3],
    ]
    endpoint = scripted(calls)
    tools = [
        function_tool(boundary, "lookalike", description="x", params_json_schema=EMPTY_SCHEMA),
        agent_tools(boundary)[1],
    ]
    await Runner.run(
        agent_on(endpoint, tools), QUESTION, context=RunContext(RUN), run_config=RUN_CONFIG
    )
    result, error = (
        item["output"]
        for item in endpoint.requests[1]["input"]
        if item.get("type") == "function_call_output"
    )
    assert json.loads(result) == error_content("EXECUTION_FAILED")
    assert error.startswith(ERROR_PREFIX)
    with pytest.raises(json.JSONDecodeError):
        json.loads(error)
    assert shown(error) == failed("EXECUTION_FAILED") != shown(result)


async def test_function_tools_are_described_by_their_tool_specs(store: Store) -> None:
    """``function_tools(boundary, specs)``: one FunctionTool per ToolSpec, its description
    and input schema (made strict by the SDK) what the model is shown; the calls run."""
    await open_run(store)

    def search(arguments: dict[str, Any], call: ToolCall) -> Any:
        return [f"{arguments['q']} policy"]

    def project(raw: Any, call: ToolCall) -> Projection:
        return Projection(result=raw, evidence_status="EVIDENCE_FOUND", scope="kb")

    specs = {
        "search_kb": ToolSpec(
            executor=search,
            projector=project,
            description="Search the knowledge base.",
            input_schema=SEARCH_SCHEMA,
        ),
        "ping": ToolSpec(executor=search, projector=project),
    }
    endpoint = scripted(CALLS[:1])
    agent = agent_on(endpoint, function_tools(ToolBoundary(store, specs), specs))
    await Runner.run(agent, QUESTION, context=RunContext(RUN), run_config=RUN_CONFIG)
    shown_tools = {tool["name"]: tool for tool in endpoint.requests[0]["tools"]}
    assert shown_tools["search_kb"]["description"] == "Search the knowledge base."
    assert shown_tools["search_kb"]["parameters"] == {
        **SEARCH_SCHEMA,
        "additionalProperties": False,
    }
    assert shown_tools["ping"]["parameters"] == {"type": "object", "additionalProperties": False}
    assert sent_outputs(endpoint.requests[1]) == expected_outputs(CALLS[:1], OUTPUTS[:1])
