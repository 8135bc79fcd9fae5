"""canon.integrations.langchain: ``as_tools`` gives LangChain tools that run through the
boundary when invoked with a model's ToolCall, sync and async, outside any graph.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

from canon.integrations.langchain import as_tools
from eventstore import SyncBoundary, SyncStore, ToolBoundary
from tests.support.agent_tools import SCHEMAS, KnowledgeBase

RUN = "conv-1"
CONFIG: RunnableConfig = {"configurable": {"thread_id": RUN}}


def call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """A model's ToolCall, as LangChain hands it to a tool."""
    return {"type": "tool_call", "id": call_id, "name": name, "args": args}


@pytest.fixture
def sync_store(redis_url: str, namespace: str) -> Iterator[SyncStore]:
    """A SyncStore with the run open; closed after the test."""
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        yield store


def by_name(tools: list[BaseTool]) -> dict[str, BaseTool]:
    """The tools by name."""
    return {tool.name: tool for tool in tools}


def test_the_model_is_shown_the_callers_schemas(sync_store: SyncStore) -> None:
    """Each tool carries the name, description and arguments schema it was given."""
    tools = as_tools(SyncBoundary(sync_store, KnowledgeBase().specs()), SCHEMAS)
    shown = [convert_to_openai_tool(tool)["function"] for tool in tools]
    assert shown == [
        {"name": name, "description": s["description"], "parameters": s["parameters"]}
        for name, s in SCHEMAS.items()
    ]


def test_a_tool_call_runs_through_the_boundary_and_answers_a_tool_message(
    sync_store: SyncStore,
) -> None:
    """tool.invoke(ToolCall, config): the boundary runs it under the config's thread_id
    and the call's id; the answer is a ToolMessage with JSON content."""
    kb = KnowledgeBase()
    tools = by_name(as_tools(SyncBoundary(sync_store, kb.specs()), SCHEMAS))
    message = tools["search"].invoke(call("call_abc", "search", {"q": "refund"}), CONFIG)
    assert isinstance(message, ToolMessage)
    assert (message.tool_call_id, message.name, message.status) == ("call_abc", "search", "success")
    assert json.loads(message.content) == {"titles": ["refund policy"]}  # type: ignore[arg-type]
    assert kb.executed["call_abc"] == 1
    assert sync_store.get(RUN, "call_abc") is not None
    failed = tools["broken"].invoke(call("call_def", "broken", {"q": "x"}), CONFIG)
    assert failed.status == "error"
    assert json.loads(failed.content)["error_code"] == "EXECUTION_FAILED"
    assert "sk-secret" not in failed.content


async def test_ainvoke_runs_on_an_async_boundary(make_open_store: Any) -> None:
    """tool.ainvoke with a ToolBoundary on this loop; an unauthorized tool is refused."""
    store = await make_open_store()
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    kb = KnowledgeBase()
    tools = by_name(as_tools(ToolBoundary(store, kb.specs()), SCHEMAS))
    message = await tools["search"].ainvoke(call("call_1", "search", {"q": "shipping"}), CONFIG)
    assert json.loads(message.content) == {"titles": ["shipping policy"]}
    refused = await tools["delete_order"].ainvoke(
        call("call_2", "delete_order", {"order": "A-17"}), CONFIG
    )
    assert (refused.status, json.loads(refused.content)["error_code"]) == ("error", "UNAUTHORIZED")
    assert kb.executed == {"call_1": 1}


def test_bare_arguments_are_refused_the_call_id_is_never_invented(sync_store: SyncStore) -> None:
    """Without a ToolCall there is no call id: a clear error, and nothing runs."""
    kb = KnowledgeBase()
    tools = by_name(as_tools(SyncBoundary(sync_store, kb.specs()), SCHEMAS))
    with pytest.raises(ValueError, match="ToolCall"):
        tools["search"].invoke({"q": "refund"}, CONFIG)
    assert not kb.executed


def test_a_call_without_an_id_is_refused(sync_store: SyncStore) -> None:
    """LangChain allows a ToolCall with ``id=None``; canon refuses it and runs nothing."""
    kb = KnowledgeBase()
    tools = by_name(as_tools(SyncBoundary(sync_store, kb.specs()), SCHEMAS))
    with pytest.raises(ValueError, match="ToolCall"):
        tools["search"].invoke(call(None, "search", {"q": "refund"}), CONFIG)  # type: ignore[arg-type]
    assert not kb.executed


def test_a_resent_tool_call_is_replayed_by_default(sync_store: SyncStore) -> None:
    """The same ToolCall again (a graph that resumes or forks): the recorded answer, the
    tool ran once, even on a boundary built to refuse; ``on_duplicate="refuse"`` keeps the
    boundary's DUPLICATE_TOOL_CALL."""
    kb = KnowledgeBase()
    boundary = SyncBoundary(sync_store, kb.specs())
    search = by_name(as_tools(boundary, SCHEMAS))["search"]
    first = search.invoke(call("call_again", "search", {"q": "refund"}), CONFIG)
    again = search.invoke(call("call_again", "search", {"q": "refund"}), CONFIG)
    assert (again.content, again.status) == (first.content, "success")
    assert kb.executed["call_again"] == 1
    refusing = by_name(as_tools(boundary, SCHEMAS, on_duplicate="refuse"))["search"]
    refused = refusing.invoke(call("call_again", "search", {"q": "refund"}), CONFIG)
    assert (refused.status, json.loads(refused.content)["error_code"]) == (
        "error",
        "DUPLICATE_TOOL_CALL",
    )


def test_the_tools_can_be_described_by_their_tool_specs(sync_store: SyncStore) -> None:
    """``as_tools(boundary, specs)``: each ToolSpec's description and input schema (any
    object without one) is what the model is shown, written once."""
    specs = {
        name: msgspec.structs.replace(
            spec,
            description=SCHEMAS[name]["description"],
            input_schema=SCHEMAS[name]["parameters"],
        )
        for name, spec in KnowledgeBase().specs().items()
    }
    specs["bare"] = msgspec.structs.replace(specs["search"], description="", input_schema=None)
    tools = as_tools(SyncBoundary(sync_store, specs), specs)
    shown = [convert_to_openai_tool(tool)["function"] for tool in tools]
    assert shown[:3] == [
        {"name": name, "description": s["description"], "parameters": s["parameters"]}
        for name, s in SCHEMAS.items()
    ]
    assert shown[3]["name"] == "bare" and shown[3]["parameters"] == {"type": "object"}
