"""canon.integrations.pydantic_ai: an agent with a scripted FunctionModel calls canon tools
through ``BoundaryToolset``: parallel calls, errors as native failed tool results, an
unknown and an unauthorized tool, a replayed turn, ``run`` and ``run_sync``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelResponse,
    TextPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import FunctionModel

from canon.integrations.pydantic_ai import BoundaryToolset
from eventstore import SyncBoundary, SyncStore, ToolBoundary, WrongEventLoop
from machine.codes import SAFE_MESSAGES, ErrorCode, Status
from tests.support.agent_models import ScriptedModel
from tests.support.agent_tools import EXECUTED_ONCE, EXPECTED, SCHEMAS, TURN, KnowledgeBase

RUN = "agent-run-1"
#: Listed to the model, unknown to the boundary: the boundary answers UNKNOWN_TOOL.
LISTED = {**SCHEMAS, "no_such_tool": {"description": "Gone.", "parameters": {"type": "object"}}}


def assert_turn_answered(parts: list[ToolReturnPart]) -> None:
    """One return per call, in order, ids echoed; errors are failed returns (the native
    is_error result) carrying the safe error JSON only."""
    assert [(p.tool_call_id, p.tool_name) for p in parts] == [(i, n) for i, n, _ in TURN]
    for part, (status, content) in zip(parts, EXPECTED, strict=True):
        if status == "error":
            code = ErrorCode(content["error_code"])
            assert part.outcome == "failed"
            assert json.loads(part.content) == {  # type: ignore[arg-type]
                "error_code": code.value,
                "message": SAFE_MESSAGES[code],
            }
        else:
            assert (part.outcome, part.content) == ("success", content)
        assert "sk-secret" not in str(part.content) and "raw row" not in str(part.content)


def run_sync(agent: Agent[Any, Any], prompt: str) -> Any:
    """``agent.run_sync(prompt)`` from a plain thread, as a sync application calls it.

    run_sync runs on the thread's current loop, creating one it leaves open: the thread
    closes it, so no loop outlives the test (and pytest-asyncio's own loop is untouched).
    """

    def call() -> Any:
        try:
            return agent.run_sync(prompt)
        finally:
            asyncio.get_event_loop_policy().get_event_loop().close()
            asyncio.set_event_loop(None)

    with ThreadPoolExecutor(1) as thread:
        return thread.submit(call).result(timeout=60)


@pytest.fixture
def sync_store(redis_url: str, namespace: str) -> Iterator[SyncStore]:
    """A SyncStore with the run open; closed after the test."""
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        yield store


def test_run_sync_answers_every_call_of_the_turn(sync_store: SyncStore) -> None:
    """agent.run_sync (its own event loop) through a SyncBoundary: four parallel calls, one
    failing, plus an unknown and an unauthorized tool; the run finishes normally."""
    kb, script = KnowledgeBase(), ScriptedModel()
    toolset = BoundaryToolset(SyncBoundary(sync_store, kb.specs()), LISTED, run_id=RUN)
    agent = Agent(FunctionModel(script), toolsets=[toolset])
    result = run_sync(agent, "What are the policies?")
    assert result.output == "answered"
    assert script.tools == list(LISTED)
    assert_turn_answered(script.returns_seen())
    assert dict(kb.executed) == EXECUTED_ONCE
    record = sync_store.get(RUN, TURN[0][0])
    assert record is not None and record.state.status is Status.READY
    assert sync_store.get(RUN, TURN[4][0]) is None


async def test_run_on_an_async_boundary_takes_the_run_id_from_deps(make_open_store: Any) -> None:
    """await agent.run with a ToolBoundary on this loop; the run id comes from deps."""

    @dataclass
    class Deps:
        run_id: str

    store = await make_open_store()
    await store.open_run("deps-run", deadline=timedelta(minutes=5))
    kb, script = KnowledgeBase(), ScriptedModel()
    toolset = BoundaryToolset(
        ToolBoundary(store, kb.specs()), LISTED, run_id=lambda ctx: ctx.deps.run_id
    )
    agent = Agent(FunctionModel(script), toolsets=[toolset], deps_type=Deps)
    result = await agent.run("What are the policies?", deps=Deps("deps-run"))
    assert result.output == "answered"
    assert_turn_answered(script.returns_seen())
    assert dict(kb.executed) == EXECUTED_ONCE
    record = await store.get("deps-run", TURN[2][0])
    assert record is not None and record.state.status is Status.READY


async def test_run_through_a_sync_boundary(sync_store: SyncStore) -> None:
    """await agent.run also works through a SyncBoundary (its own loop does the calls)."""
    kb, script = KnowledgeBase(), ScriptedModel()
    toolset = BoundaryToolset(SyncBoundary(sync_store, kb.specs()), LISTED, run_id=RUN)
    await Agent(FunctionModel(script), toolsets=[toolset]).run("What are the policies?")
    assert_turn_answered(script.returns_seen())


@pytest.mark.parametrize("on_duplicate", ["replay", "refuse"])
def test_a_re_sent_turn_replays_the_recorded_results(
    sync_store: SyncStore, on_duplicate: str
) -> None:
    """A harness that re-runs the same turn (same call ids, same arguments): with replay the
    tools run once and the model sees the same returns; refused, DUPLICATE_TOOL_CALL."""
    kb = KnowledgeBase()
    boundary = SyncBoundary(sync_store, kb.specs(), on_duplicate=on_duplicate)
    toolset = BoundaryToolset(boundary, LISTED, run_id=RUN)
    first, second = ScriptedModel(), ScriptedModel()
    run_sync(Agent(FunctionModel(first), toolsets=[toolset]), "What are the policies?")
    run_sync(Agent(FunctionModel(second), toolsets=[toolset]), "What are the policies?")
    assert dict(kb.executed) == EXECUTED_ONCE
    if on_duplicate == "replay":
        assert_turn_answered(second.returns_seen())
        assert [(p.content, p.outcome) for p in second.returns_seen()] == [
            (p.content, p.outcome) for p in first.returns_seen()
        ]
    else:
        codes = [json.loads(p.content)["error_code"] for p in second.returns_seen()[:4]]  # type: ignore[arg-type]
        assert codes == ["DUPLICATE_TOOL_CALL"] * 4


def test_arguments_that_are_not_an_object_are_refused_by_the_boundary(
    sync_store: SyncStore,
) -> None:
    """The toolset does not validate: a JSON array reaches the boundary, which refuses it
    (INVALID_INPUT) as a failed return; nothing runs."""
    kb = KnowledgeBase()
    script = ScriptedModel([("call_array_args", "search", [1, 2])])  # type: ignore[list-item]
    toolset = BoundaryToolset(SyncBoundary(sync_store, kb.specs()), SCHEMAS, run_id=RUN)
    run_sync(Agent(FunctionModel(script), toolsets=[toolset]), "hi")
    [part] = script.returns_seen()
    assert part.outcome == "failed"
    assert json.loads(part.content)["error_code"] == "INVALID_INPUT"  # type: ignore[arg-type]
    assert not kb.executed


def test_a_tool_the_toolset_does_not_list_never_reaches_canon(sync_store: SyncStore) -> None:
    """Pydantic AI answers an unlisted name with its own retry prompt; nothing is stored."""
    kb = KnowledgeBase()
    script = ScriptedModel([("call_unlisted_1", "not_listed", {})])
    toolset = BoundaryToolset(SyncBoundary(sync_store, kb.specs()), SCHEMAS, run_id=RUN)
    assert run_sync(Agent(FunctionModel(script), toolsets=[toolset]), "hi").output == "answered"
    assert sync_store.get(RUN, "call_unlisted_1") is None and not kb.executed


async def test_run_sync_with_an_async_boundary_is_a_clear_error(make_open_store: Any) -> None:
    """run_sync drives a loop of its own: an async store that belongs to the application's
    loop refuses it with WrongEventLoop (never a silent STORE_UNAVAILABLE)."""
    store = await make_open_store()
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    kb = KnowledgeBase()
    toolset = BoundaryToolset(ToolBoundary(store, kb.specs()), LISTED, run_id=RUN)
    agent = Agent(FunctionModel(ScriptedModel()), toolsets=[toolset])

    with pytest.raises(WrongEventLoop):
        await asyncio.to_thread(run_sync, agent, "What are the policies?")
    assert not kb.executed


def test_the_toolset_can_be_described_by_the_tool_specs(sync_store: SyncStore) -> None:
    """``BoundaryToolset(boundary, specs)``: each ToolSpec's description and input schema
    (any object without one) are the tool definitions the model gets, written once."""
    specs = {
        name: msgspec.structs.replace(
            spec,
            description=SCHEMAS[name]["description"],
            input_schema=SCHEMAS[name]["parameters"],
        )
        for name, spec in KnowledgeBase().specs().items()
    }
    specs["bare"] = msgspec.structs.replace(specs["search"], description="", input_schema=None)
    seen: list[Any] = []

    def model(messages: list[Any], info: Any) -> Any:
        seen.extend(info.function_tools)
        return ModelResponse(parts=[TextPart("answered")])

    toolset = BoundaryToolset(SyncBoundary(sync_store, specs), specs, run_id=RUN)
    run_sync(Agent(FunctionModel(model), toolsets=[toolset]), "hi")
    shown = {tool.name: tool for tool in seen}
    assert list(shown) == [*SCHEMAS, "bare"]
    for name, schema in SCHEMAS.items():
        assert shown[name].description == schema["description"]
        assert shown[name].parameters_json_schema == schema["parameters"]
    assert shown["bare"].parameters_json_schema == {"type": "object"}
