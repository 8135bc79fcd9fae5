"""Errors the model can correct, in every stack: the tool's own text in the stack's own
error form, the next model request carrying it; a tool without ``error_result`` beside it
still carries canon's fixed message.

Each stack's real SDK talks to a scripted endpoint or a scripted model (no network); the
calls run through a real store. One turn calls two tools that raise the same exception:
``find_city`` opted in (``error_result=str``), ``broken`` did not. The exception's text
holds a secret-shaped value, which only ever reaches the model scrubbed.
"""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import anthropic
import anyio
import httpx2
import pytest
from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, set_tracing_disabled
from google import genai
from google.genai import types
from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from mcp import ClientSession
from mcp.shared.memory import create_client_server_memory_streams
from mcp_types import TextContent
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models.function import FunctionModel

from canon.integrations.anthropic import tool_params, tool_results
from canon.integrations.gemini import function_declarations, function_responses
from canon.integrations.langchain import as_tools
from canon.integrations.langgraph import tool_node
from canon.integrations.mcp import call_tool, serve_tools
from canon.integrations.openai import (
    ERROR_PREFIX,
    call_outputs_sync,
    chat_tools,
    tool_messages_sync,
)
from canon.integrations.openai_agents import function_tools
from canon.integrations.pydantic_ai import BoundaryToolset
from eventstore import (
    Projection,
    RunContext,
    Store,
    SyncBoundary,
    SyncStore,
    ToolBoundary,
    ToolCall,
    ToolEnvelope,
    ToolError,
    ToolSpec,
)
from machine.codes import SAFE_MESSAGES, ErrorCode, Status
from tests.support.agent_models import ScriptedModel
from tests.support.chat_models import ScriptedChatModel
from tests.support.log_scan import forbid_in_logs
from tests.support.model_script import ModelScript
from tests.support.openai_scripted import (
    FINAL_RESPONSE_ID,
    ScriptedOpenAI,
    chat_completion,
    function_call,
    response,
    response_function_call,
    response_message,
)

DOC = pathlib.Path(__file__).parents[3] / "docs" / "integrations.md"
RUN = "run-corrects"
#: The value the scrubber must hide (after ``session=``); never in a request or a log.
SECRET = "3f9a2c1d77e0"
forbid_in_logs(SECRET)
#: What both tools raise.
RAISED = f"no city named 'Pariss'; did you mean 'Paris'? (session={SECRET})"
#: What the model is shown for ``find_city``: the text, scrubbed.
SHOWN = "no city named 'Pariss'; did you mean 'Paris'? (session=[Filtered])"
#: The safe error JSON of each tool, as every stack but MCP carries it.
CORRECTABLE = {"error_code": "EXECUTION_FAILED", "message": SHOWN}
FIXED = {"error_code": "EXECUTION_FAILED", "message": SAFE_MESSAGES[ErrorCode.EXECUTION_FAILED]}
CITY_CALL, BROKEN_CALL = "call_Pq7Rs9Tu1Vw3Xy5Z", "call_Ab2Cd4Ef6Gh8Ij0K"
ARGUMENTS = {"city": "Pariss"}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


class CityNotFound(Exception):
    """What the tests' tools raise."""


def lookup(arguments: dict[str, Any], call: ToolCall) -> Any:
    """Both tools' executor: the model asked for a city that does not exist."""
    raise CityNotFound(RAISED)


def project(raw: Any, call: ToolCall) -> Projection:
    """Never reached: the executor raises."""
    return Projection(result=raw, evidence_status="EVIDENCE_FOUND")


#: ``find_city`` shows its error text to the model; ``broken`` does not.
TOOLS = {
    "find_city": ToolSpec(
        executor=lookup,
        projector=project,
        description="Find a city.",
        input_schema=SCHEMA,
        error_result=str,
    ),
    "broken": ToolSpec(
        executor=lookup, projector=project, description="Also finds a city.", input_schema=SCHEMA
    ),
}
#: The turn every stack's model sends: (tool call id, tool, arguments).
TURN = [(CITY_CALL, "find_city", ARGUMENTS), (BROKEN_CALL, "broken", ARGUMENTS)]


def assert_recorded(records: list[Any]) -> None:
    """find_city's record keeps the scrubbed text as its agent result; broken's keeps none."""
    city, broken = records
    assert city is not None and city.state.status is Status.ERROR
    assert city.state.error_code is ErrorCode.EXECUTION_FAILED
    assert city.result is not None and json.loads(city.result) == SHOWN
    assert broken is not None and broken.state.status is Status.ERROR
    assert broken.result is None


async def open_store(make_store: Any) -> Store:
    """A store with the tests' run open."""
    store: Store = make_store()
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    return store


async def async_records(store: Store) -> list[Any]:
    """The records of the turn's two calls."""
    return [await store.get(RUN, call_id) for call_id in (CITY_CALL, BROKEN_CALL)]


@pytest.fixture
def sync_store(redis_url: str, namespace: str) -> Iterator[SyncStore]:
    """A SyncStore with the tests' run open; closed after the test."""
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        yield store


def sync_records(store: SyncStore) -> list[Any]:
    """The records of the turn's two calls."""
    return [store.get(RUN, call_id) for call_id in (CITY_CALL, BROKEN_CALL)]


def flagged(text: str) -> Any:
    """An OpenAI tool output flagged as an error: the JSON after ``Error: ``."""
    assert text.startswith(ERROR_PREFIX), text
    return json.loads(text.removeprefix(ERROR_PREFIX))


def test_openai_chat_completions(sync_store: SyncStore) -> None:
    """Chat Completions: the ``role: "tool"`` message is ``Error: `` and the error JSON,
    whose message is the tool's scrubbed text."""
    calls = [function_call(i, name, json.dumps(args)) for i, name, args in TURN]
    endpoint = ScriptedOpenAI(chat_completion(calls), chat_completion(None, "Paris, then."))
    boundary = SyncBoundary(sync_store, TOOLS)
    with endpoint.client() as client:
        messages: list[Any] = [{"role": "user", "content": "Weather in Pariss?"}]
        tools = chat_tools(TOOLS)
        message = client.chat.completions.create(model="gpt-4.1", messages=messages, tools=tools)
        messages += [message.choices[0].message]
        messages += tool_messages_sync(boundary, RunContext(RUN), message.choices[0].message)
        client.chat.completions.create(model="gpt-4.1", messages=messages, tools=tools)

    sent = endpoint.requests[1]["messages"][2:]
    assert [(m["tool_call_id"], flagged(m["content"])) for m in sent] == [
        (CITY_CALL, CORRECTABLE),
        (BROKEN_CALL, FIXED),
    ]
    assert SECRET not in json.dumps(endpoint.requests)
    assert_recorded(sync_records(sync_store))


def test_openai_responses(sync_store: SyncStore) -> None:
    """Responses API: the ``function_call_output`` items, flagged the same way."""
    items = [response_function_call(f"fc_{i}", i, name, json.dumps(a)) for i, name, a in TURN]
    final = response([response_message("msg_final", "Paris, then.")], FINAL_RESPONSE_ID)
    endpoint = ScriptedOpenAI(response(items), final)
    boundary = SyncBoundary(sync_store, TOOLS)
    with endpoint.client() as client:
        first = client.responses.create(model="gpt-4.1", input="Weather in Pariss?")
        outputs = call_outputs_sync(boundary, RunContext(RUN), first)
        client.responses.create(model="gpt-4.1", previous_response_id=first.id, input=outputs)

    sent = endpoint.requests[1]["input"]
    assert [(item["call_id"], flagged(item["output"])) for item in sent] == [
        (CITY_CALL, CORRECTABLE),
        (BROKEN_CALL, FIXED),
    ]
    assert_recorded(sync_records(sync_store))


@pytest.fixture
def no_tracing() -> Iterator[None]:
    """No Agents SDK trace leaves the process."""
    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)


async def test_openai_agents_sdk(make_store: Any, no_tracing: None) -> None:
    """``Runner.run``: the output the SDK sends back for each call, flagged as the
    adapter flags every error (the SDK's tool outputs are plain strings)."""
    store = await open_store(make_store)
    items = [response_function_call(f"fc_{i}", i, name, json.dumps(a)) for i, name, a in TURN]
    final = response([response_message("msg_final", "Paris, then.")], FINAL_RESPONSE_ID)
    endpoint = ScriptedOpenAI(response(items), final)
    model = OpenAIResponsesModel(model="gpt-4.1", openai_client=endpoint.async_client())
    tools = function_tools(ToolBoundary(store, TOOLS), TOOLS)
    agent = Agent(name="weather", instructions="Find cities.", model=model, tools=tools)
    try:
        result = await Runner.run(
            agent,
            "Weather in Pariss?",
            context=RunContext(RUN),
            run_config=RunConfig(tracing_disabled=True),
        )
    finally:
        await endpoint.aclose()

    assert result.final_output == "Paris, then."
    sent = [i for i in endpoint.requests[1]["input"] if i.get("type") == "function_call_output"]
    assert [(item["call_id"], flagged(item["output"])) for item in sent] == [
        (CITY_CALL, CORRECTABLE),
        (BROKEN_CALL, FIXED),
    ]
    assert_recorded(await async_records(store))


def claude_message(content: list[dict[str, Any]], stop_reason: str) -> dict[str, Any]:
    """A Messages API response body."""
    return {
        "id": "msg_01Aq9w938a90dw8q",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-6",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 34},
    }


async def test_anthropic(make_store: Any) -> None:
    """Claude: ``tool_result`` blocks with ``is_error: true`` and the error JSON."""
    store = await open_store(make_store)
    uses = [{"type": "tool_use", "id": i, "name": name, "input": a} for i, name, a in TURN]
    done = claude_message([{"type": "text", "text": "Paris, then."}], "end_turn")
    script = ModelScript(claude_message(uses, "tool_use"), done)
    boundary = ToolBoundary(store, TOOLS)
    http = httpx2.AsyncClient(transport=script.transport())
    async with anthropic.AsyncAnthropic(api_key="test", http_client=http, max_retries=0) as client:
        options: dict[str, Any] = {
            "model": "claude-sonnet-4-6",
            "max_tokens": 256,
            "tools": tool_params(TOOLS),
        }
        messages: list[Any] = [{"role": "user", "content": "Weather in Pariss?"}]
        turn = await client.messages.create(messages=messages, **options)
        messages += [
            {"role": "assistant", "content": turn.content},
            await tool_results(boundary, RunContext(RUN), turn),
        ]
        await client.messages.create(messages=messages, **options)

    blocks = script.bodies[1]["messages"][2]["content"]
    assert [(b["tool_use_id"], b["is_error"], json.loads(b["content"])) for b in blocks] == [
        (CITY_CALL, True, CORRECTABLE),
        (BROKEN_CALL, True, FIXED),
    ]
    assert_recorded(await async_records(store))


def gemini_response(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """A generateContent response body."""
    return {
        "candidates": [
            {"content": {"parts": parts, "role": "model"}, "finishReason": "STOP", "index": 0}
        ],
        "responseId": "Yx3aZ7b0Ocs2-O4Pm8WKoAg",
        "modelVersion": "gemini-3-flash",
    }


async def test_gemini(make_store: Any) -> None:
    """Gemini: ``functionResponse`` parts whose response is ``{"error": ...}``, the key
    Gemini documents for a function's error."""
    store = await open_store(make_store)
    calls = [{"functionCall": {"id": i, "name": name, "args": a}} for i, name, a in TURN]
    script = ModelScript(gemini_response(calls), gemini_response([{"text": "Paris, then."}]))
    boundary = ToolBoundary(store, TOOLS)
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=function_declarations(TOOLS))]
    )
    async with httpx2.AsyncClient(transport=script.transport()) as http:
        options = types.HttpOptions(httpx_async_client=http)
        async with genai.Client(api_key="test", http_options=options).aio as client:
            contents: list[Any] = [types.Content(role="user", parts=[types.Part(text="Pariss?")])]
            turn = await client.models.generate_content(
                model="gemini-3-flash", contents=contents, config=config
            )
            answers = await function_responses(boundary, RunContext(RUN), turn)
            assert turn.candidates and turn.candidates[0].content
            contents += [turn.candidates[0].content, answers]
            await client.models.generate_content(
                model="gemini-3-flash", contents=contents, config=config
            )

    parts = script.bodies[1]["contents"][2]["parts"]
    assert [part["functionResponse"] for part in parts] == [
        {"id": CITY_CALL, "name": "find_city", "response": {"error": CORRECTABLE}},
        {"id": BROKEN_CALL, "name": "broken", "response": {"error": FIXED}},
    ]
    assert_recorded(await async_records(store))


def test_langgraph(sync_store: SyncStore) -> None:
    """LangGraph: ``ToolMessage``s with ``status="error"`` and the error JSON, which the
    model's next turn sees."""
    boundary = SyncBoundary(sync_store, TOOLS)
    model = ScriptedChatModel(calls=TURN)
    tools = as_tools(boundary, TOOLS)
    agent = model.bind_tools(tools)

    def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [agent.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", tool_node(boundary, tools))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    config: RunnableConfig = {"configurable": {"thread_id": RUN}}
    graph.compile(checkpointer=InMemorySaver()).invoke(
        {"messages": [("user", "Weather in Pariss?")]}, config
    )

    seen: list[ToolMessage] = model.tool_results_seen()
    assert [(m.tool_call_id, m.status, json.loads(str(m.content))) for m in seen] == [
        (CITY_CALL, "error", CORRECTABLE),
        (BROKEN_CALL, "error", FIXED),
    ]
    assert_recorded(sync_records(sync_store))


async def test_pydantic_ai(make_store: Any) -> None:
    """Pydantic AI: failed tool returns (``outcome="failed"``) carrying the error JSON,
    the provider's native error result."""
    store = await open_store(make_store)
    script = ScriptedModel(TURN)
    toolset = BoundaryToolset(ToolBoundary(store, TOOLS), TOOLS, run_id=RUN)
    agent = PydanticAgent(FunctionModel(script), toolsets=[toolset])

    result = await agent.run("Weather in Pariss?")

    assert result.output == "answered"
    returns = script.returns_seen()
    assert [(p.tool_call_id, p.outcome, json.loads(str(p.content))) for p in returns] == [
        (CITY_CALL, "failed", CORRECTABLE),
        (BROKEN_CALL, "failed", FIXED),
    ]
    assert_recorded(await async_records(store))


@asynccontextmanager
async def mcp_session(boundary: ToolBoundary) -> AsyncIterator[ClientSession]:
    """The SDK's client on ``serve_tools`` over in-memory streams."""
    async with (
        create_client_server_memory_streams() as (client_streams, server_streams),
        anyio.create_task_group() as group,
    ):
        group.start_soon(lambda: serve_tools(boundary, TOOLS, streams=server_streams, run_id=RUN))
        async with ClientSession(*client_streams) as session:
            await session.initialize()
            yield session
        await client_streams[1].aclose()


async def test_mcp_serve_tools(make_store: Any) -> None:
    """MCP: an ``isError: true`` result whose text is the tool's scrubbed text as it is,
    as MCP servers answer their tools' errors; canon's own errors stay the safe JSON."""
    store = await open_store(make_store)
    boundary = ToolBoundary(store, TOOLS)
    async with mcp_session(boundary) as session:
        results = [await call_tool(session, name, a, tool_call_id=i) for i, name, a in TURN]

    city, broken = results
    assert city.is_error and broken.is_error
    assert all(isinstance(result.content[0], TextContent) for result in results)
    assert [result.content[0].text for result in results] == [  # type: ignore[union-attr]
        SHOWN,
        json.dumps(FIXED, separators=(",", ":")),
    ]
    assert_recorded(await async_records(store))


def test_the_docs_tool_runs_as_written(sync_store: SyncStore) -> None:
    """The first block of the docs' section defines a tool whose error the model reads."""
    section = re.search(
        r"^## Errors the model can correct\n(.*?)```python\n(.*?)```", DOC.read_text(), re.S | re.M
    )
    assert section is not None
    names: dict[str, Any] = {}
    exec(section.group(2), names)  # our own documentation's example
    boundary = SyncBoundary(sync_store, names["TOOLS"])
    envelope = ToolEnvelope(
        run_id=RUN, tool_call_id=CITY_CALL, tool="find_city", arguments={"name": "Pariss"}
    )

    reply = boundary.invoke(RunContext(RUN), envelope)

    assert isinstance(reply, ToolError) and reply.from_tool
    assert (reply.error_code, reply.message) == (
        ErrorCode.EXECUTION_FAILED,
        "no city named 'Pariss'; did you mean 'Paris'?",
    )
