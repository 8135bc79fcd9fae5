"""canon.integrations.langgraph: a ToolNode whose calls go through the boundary, in a real
graph with a checkpointer, driven by a scripted chat model, sync and async.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command, interrupt

from canon.integrations.langchain import as_tools
from canon.integrations.langgraph import tool_node
from eventstore import SyncBoundary, SyncStore, ToolBoundary
from machine.codes import SAFE_MESSAGES, ErrorCode, Status
from machine.errors import InvalidArgument
from tests.support.agent_tools import EXECUTED_ONCE, EXPECTED, SCHEMAS, TURN, KnowledgeBase
from tests.support.chat_models import ScriptedChatModel

THREAD = "thread-7f3a"
CONFIG: RunnableConfig = {"configurable": {"thread_id": THREAD}}
QUESTION = {"messages": [("user", "What are the policies?")]}
#: What the node lists: every tool of the turn, ``no_such_tool`` included, which the
#: boundary does not know (so canon answers it UNKNOWN_TOOL).
NODE_SCHEMAS: dict[str, Any] = {
    **SCHEMAS,
    "no_such_tool": {"description": "A tool canon was never given.", "parameters": {}},
}


def build_graph(
    model: ScriptedChatModel,
    boundary: ToolBoundary | SyncBoundary,
    *,
    interrupt_before: list[str] | None = None,
    review_after_tools: bool = False,
    schemas: dict[str, Any] = NODE_SCHEMAS,
    **node_options: Any,
) -> Any:
    """model -> tools -> model, checkpointed; optionally a review interrupt inside the tools
    node, after its calls ran (so a resume re-runs the node from its start)."""
    tools = as_tools(boundary, schemas)
    agent = model.bind_tools(tools)
    node = tool_node(boundary, tools, **node_options)

    def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [agent.invoke(state["messages"])]}

    async def acall_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await agent.ainvoke(state["messages"])]}

    def tools_then_review(state: MessagesState, config: RunnableConfig) -> Any:
        update = node.invoke(state, config)
        interrupt("review the tool results")
        return update

    async def atools_then_review(state: MessagesState, config: RunnableConfig) -> Any:
        update = await node.ainvoke(state, config)
        interrupt("review the tool results")
        return update

    builder = StateGraph(MessagesState)
    builder.add_node("model", RunnableLambda(call_model, afunc=acall_model))
    if review_after_tools:
        builder.add_node("tools", RunnableLambda(tools_then_review, afunc=atools_then_review))
    else:
        builder.add_node("tools", node)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=InMemorySaver(), interrupt_before=interrupt_before)


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    """The graph state's tool messages, in order."""
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def assert_turn_answered(messages: list[ToolMessage]) -> None:
    """One ToolMessage per call, in the calls' order, ids echoed, JSON content, errors as
    ``status="error"`` with the safe error JSON only."""
    assert [(m.tool_call_id, m.name) for m in messages] == [(i, n) for i, n, _ in TURN]
    for message, (status, content) in zip(messages, EXPECTED, strict=True):
        assert message.status == status
        shown = json.loads(message.content)  # type: ignore[arg-type]
        if status == "error":
            code = ErrorCode(content["error_code"])
            assert shown == {"error_code": code.value, "message": SAFE_MESSAGES[code]}
        else:
            assert shown == content
        assert "raw row" not in message.content and "sk-secret" not in message.content


@pytest.fixture
def sync_store(redis_url: str, namespace: str) -> Iterator[SyncStore]:
    """A SyncStore with the test's thread open as a run; closed after the test."""
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(THREAD, deadline=timedelta(minutes=5))
        yield store


def test_sync_invoke_runs_every_call_of_the_turn_through_the_boundary(
    sync_store: SyncStore,
) -> None:
    """graph.invoke: six parallel calls (one failing, one unknown, one unauthorized) are
    answered in order; the next model turn sees exactly those ToolMessages."""
    kb, model = KnowledgeBase(), ScriptedChatModel()
    graph = build_graph(model, SyncBoundary(sync_store, kb.specs()))
    state = graph.invoke(QUESTION, CONFIG)
    assert_turn_answered(tool_messages(state))
    assert model.tool_results_seen() == tool_messages(state)
    assert state["messages"][-1].content == "6 tool results"
    assert dict(kb.executed) == EXECUTED_ONCE
    assert [tool["function"]["name"] for tool in model.bound] == list(NODE_SCHEMAS)
    record = sync_store.get(THREAD, TURN[0][0])
    assert record is not None and record.state.status is Status.READY
    failed = sync_store.get(THREAD, TURN[3][0])
    assert failed is not None and failed.state.status is Status.ERROR
    assert sync_store.get(THREAD, TURN[4][0]) is None
    assert sync_store.get(THREAD, TURN[5][0]) is None


async def test_async_ainvoke_runs_every_call_through_an_async_boundary(
    make_open_store: Any,
) -> None:
    """graph.ainvoke with a ToolBoundary on the test's loop: the same answers."""
    store = await make_open_store()
    await store.open_run(THREAD, deadline=timedelta(minutes=5))
    kb, model = KnowledgeBase(), ScriptedChatModel()
    graph = build_graph(model, ToolBoundary(store, kb.specs()))
    state = await graph.ainvoke(QUESTION, CONFIG)
    assert_turn_answered(tool_messages(state))
    assert model.tool_results_seen() == tool_messages(state)
    assert dict(kb.executed) == EXECUTED_ONCE
    record = await store.get(THREAD, TURN[1][0])
    assert record is not None and record.state.status is Status.READY


async def test_async_ainvoke_through_a_sync_boundary(sync_store: SyncStore) -> None:
    """A SyncBoundary serves graph.ainvoke too: the calls run on its own loop."""
    kb, model = KnowledgeBase(), ScriptedChatModel()
    graph = build_graph(model, SyncBoundary(sync_store, kb.specs()))
    state = await graph.ainvoke(QUESTION, CONFIG)
    assert_turn_answered(tool_messages(state))
    assert dict(kb.executed) == EXECUTED_ONCE


def test_sync_invoke_with_an_async_boundary_is_a_clear_error(make_store: Any) -> None:
    """graph.invoke runs calls in threads, where an async ToolBoundary cannot go."""
    graph = build_graph(ScriptedChatModel(), ToolBoundary(make_store(), KnowledgeBase().specs()))
    with pytest.raises(TypeError, match="SyncBoundary"):
        graph.invoke(QUESTION, CONFIG)


def test_a_config_without_the_run_key_is_a_clear_error(sync_store: SyncStore) -> None:
    """The run id comes from the config; canon never invents one."""
    boundary = SyncBoundary(sync_store, KnowledgeBase().specs())
    graph = build_graph(ScriptedChatModel(), boundary)
    config: RunnableConfig = {"configurable": {"thread_id": THREAD, "user": "u1"}}
    tools = as_tools(boundary, SCHEMAS, run_id_key="conversation")
    with pytest.raises(ValueError, match="conversation"):
        tools[0].invoke({"type": "tool_call", "id": "call_x", "name": "search", "args": {}}, config)
    assert graph.invoke(QUESTION, config)["messages"][-1].content == "6 tool results"


@pytest.mark.parametrize(
    ("boundary_duplicates", "node_duplicates", "replayed"),
    [
        ("refuse", "default", True),
        ("replay", "default", True),
        ("refuse", "refuse", False),
        ("replay", None, True),
        ("refuse", None, False),
    ],
)
def test_a_resume_after_an_interrupt_in_the_tools_node_replays(
    sync_store: SyncStore, boundary_duplicates: str, node_duplicates: str | None, replayed: bool
) -> None:
    """An interrupt() after the calls re-runs the whole tools node on resume. The node
    replays by default, whatever the boundary was built with: the tools run once and the
    model sees the same results. Only a node told to refuse (``on_duplicate="refuse"``, or
    None over a refusing boundary) answers the resumed calls DUPLICATE_TOOL_CALL."""
    kb, model = KnowledgeBase(), ScriptedChatModel()
    boundary = SyncBoundary(sync_store, kb.specs(), on_duplicate=boundary_duplicates)
    options = {} if node_duplicates == "default" else {"on_duplicate": node_duplicates}
    graph = build_graph(model, boundary, review_after_tools=True, **options)
    paused = graph.invoke(QUESTION, CONFIG)
    assert "__interrupt__" in paused and graph.get_state(CONFIG).next == ("tools",)
    assert dict(kb.executed) == EXECUTED_ONCE
    state = graph.invoke(Command(resume="approved"), CONFIG)
    assert dict(kb.executed) == EXECUTED_ONCE
    if replayed:
        assert_turn_answered(tool_messages(state))
        assert model.tool_results_seen() == tool_messages(state)
    else:
        codes = [json.loads(m.content)["error_code"] for m in tool_messages(state)[:4]]  # type: ignore[arg-type]
        assert codes == ["DUPLICATE_TOOL_CALL"] * 4


async def test_an_async_resume_replays_on_a_refusing_tool_boundary(make_open_store: Any) -> None:
    """``graph.ainvoke`` with a ToolBoundary built with the default (refuse): the resumed
    tools node replays its calls all the same; the tools ran once."""
    store = await make_open_store()
    await store.open_run(THREAD, deadline=timedelta(minutes=5))
    kb, model = KnowledgeBase(), ScriptedChatModel()
    graph = build_graph(model, ToolBoundary(store, kb.specs()), review_after_tools=True)
    await graph.ainvoke(QUESTION, CONFIG)
    assert dict(kb.executed) == EXECUTED_ONCE
    state = await graph.ainvoke(Command(resume="approved"), CONFIG)
    assert dict(kb.executed) == EXECUTED_ONCE
    assert_turn_answered(tool_messages(state))


def test_a_tool_the_node_does_not_list_never_reaches_canon(sync_store: SyncStore) -> None:
    """Two agents share one boundary; this node lists only ``search``. The model's calls
    of ``broken`` and ``delete_order`` (tools the boundary knows) get LangGraph's own
    invalid-tool answer: nothing runs, nothing is recorded, the refusal is the node's."""
    kb, model = KnowledgeBase(), ScriptedChatModel()
    boundary = SyncBoundary(sync_store, kb.specs())
    graph = build_graph(model, boundary, schemas={"search": SCHEMAS["search"]})
    state = graph.invoke(QUESTION, CONFIG)
    answered = {m.tool_call_id: m for m in tool_messages(state)}
    for call_id, name, _ in TURN:
        if name == "search":
            assert answered[call_id].status == "success"
            continue
        assert answered[call_id].status == "error"
        assert answered[call_id].content == (
            f"Error: {name} is not a valid tool, try one of [search]."
        )
        assert sync_store.get(THREAD, call_id) is None
    assert dict(kb.executed) == {call_id: 1 for call_id, name, _ in TURN if name == "search"}


async def test_an_unlisted_tool_is_refused_by_the_node_in_async_runs(
    make_open_store: Any,
) -> None:
    """The same under ``graph.ainvoke`` with a ToolBoundary: the node's own answer."""
    store = await make_open_store()
    await store.open_run(THREAD, deadline=timedelta(minutes=5))
    kb, model = KnowledgeBase(), ScriptedChatModel()
    graph = build_graph(model, ToolBoundary(store, kb.specs()), schemas=dict(SCHEMAS))
    state = await graph.ainvoke(QUESTION, CONFIG)
    [unlisted] = [m for m in tool_messages(state) if m.name == "no_such_tool"]
    assert unlisted.status == "error" and "is not a valid tool" in str(unlisted.content)
    assert await store.get(THREAD, unlisted.tool_call_id) is None


def test_on_duplicate_must_be_one_of_its_values(sync_store: SyncStore) -> None:
    """A node or tools built with an unknown ``on_duplicate`` fail at once."""
    boundary = SyncBoundary(sync_store, KnowledgeBase().specs())
    with pytest.raises(InvalidArgument, match="on_duplicate"):
        tool_node(boundary, as_tools(boundary, SCHEMAS), on_duplicate="retry")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="on_duplicate"):
        as_tools(boundary, SCHEMAS, on_duplicate="again")  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_interrupt_before_tools_then_resume_then_fork_runs_tools_once(
    sync_store: SyncStore, make_open_store: Any, mode: str
) -> None:
    """interrupt_before=["tools"]: nothing runs until the resume, which runs each tool
    once; re-running the tools node from that checkpoint (a fork, as a harness that
    re-sends the turn does) replays the same results without executing anything."""
    kb, model = KnowledgeBase(), ScriptedChatModel()
    if mode == "sync":
        boundary: ToolBoundary | SyncBoundary = SyncBoundary(
            sync_store, kb.specs(), on_duplicate="replay"
        )
    else:
        # The run is open already: sync_store opened it in this namespace.
        boundary = ToolBoundary(await make_open_store(), kb.specs(), on_duplicate="replay")
    graph = build_graph(model, boundary, interrupt_before=["tools"])

    async def run(value: Any, config: RunnableConfig) -> Any:
        if mode == "sync":
            return graph.invoke(value, config)
        return await graph.ainvoke(value, config)

    async def snapshot(config: RunnableConfig) -> Any:
        if mode == "sync":
            return graph.get_state(config)
        return await graph.aget_state(config)

    await run(QUESTION, CONFIG)
    before_tools = await snapshot(CONFIG)
    assert before_tools.next == ("tools",) and not kb.executed
    first = await run(None, CONFIG)
    assert dict(kb.executed) == EXECUTED_ONCE
    assert_turn_answered(tool_messages(first))
    again = await run(None, before_tools.config)
    assert dict(kb.executed) == EXECUTED_ONCE
    assert [(m.content, m.status) for m in tool_messages(again)] == [
        (m.content, m.status) for m in tool_messages(first)
    ]
    assert model.tool_results_seen() == tool_messages(again)
