"""canon.integrations.llamaindex: a real ``FunctionAgent`` workflow runs canon tools with a
scripted function-calling LLM (LlamaIndex's own mock LLM, answering ``ToolCallBlock``s
with provider ids): the model's ids kept exactly, parallel calls, errors as LlamaIndex's
error outputs, a re-sent turn replayed, calls without an id refused, both kinds of
boundary, and governed calls waiting in LlamaIndex's human-in-the-loop flow
(``ApprovalRequired`` / ``HumanResponseEvent``) until an operator decides in canon:
approved and run once, denied, paused and resumed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from llama_index.core.agent.workflow import FunctionAgent

from canon.integrations.llamaindex import ApprovalRequired, as_tools
from eventstore import Projection, SyncBoundary, SyncStore, ToolBoundary, ToolSpec
from machine.codes import SAFE_MESSAGES, ErrorCode, Stage, Status
from tests.support.agent_tools import (
    EXECUTED_ONCE,
    EXPECTED,
    SCHEMAS,
    TURN,
    KnowledgeBase,
    Refunds,
)
from tests.support.llamaindex_models import ScriptedLLM

#: LlamaIndex's workflows list an agent's members with inspect.getmembers, which reads
#: every deprecated attribute of the agent's pydantic model (``__fields__``,
#: ``model_computed_fields`` on the instance...): the SDK's warnings, not ours.
pytestmark = [
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20"),
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince211"),
]

RUN = "li-run-1"
REFUND_ID = "toolu_01R3fUnd9Xy7Tn4Bm1Cd6Wq2"
ORDER = {"amount": 125, "to": "acct-9"}
#: Longest wait for one agent run (the workflow's own steps, not an operator).
RUN_TIMEOUT_S = 30


def safe_error(code: ErrorCode) -> dict[str, str]:
    return {"error_code": code.value, "message": SAFE_MESSAGES[code]}


def assert_turn_answered(seen: dict[str, str]) -> None:
    """Every call of the turn answered under its own id: results as JSON, canon's errors
    as the safe error JSON, the name no tool lists as LlamaIndex's own answer."""
    for (call_id, name, _), (status, content) in zip(TURN, EXPECTED, strict=True):
        if name == "no_such_tool":  # LlamaIndex answers it; canon never sees it
            assert "not found" in seen[call_id]
        elif status == "error":
            assert json.loads(seen[call_id]) == safe_error(ErrorCode(content["error_code"]))
        else:
            assert json.loads(seen[call_id]) == content
    assert "sk-secret" not in str(seen) and "raw row" not in str(seen)


async def run_agent(agent: FunctionAgent, prompt: str) -> Any:
    return await asyncio.wait_for(agent.run(user_msg=prompt), RUN_TIMEOUT_S)


@pytest.fixture
def sync_store(redis_url: str, namespace: str) -> Iterator[SyncStore]:
    """A SyncStore with the run open; closed after the test."""
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        yield store


@pytest.mark.parametrize("kind", ["sync-boundary", "tool-boundary"])
async def test_a_turns_parallel_calls_run_under_the_models_ids(
    kind: str, sync_store: SyncStore, make_open_store: Any
) -> None:
    """Six calls in one turn: each recorded under the model's own id, answered as
    LlamaIndex answers tools (errors with ``is_error`` and the safe error JSON); an
    unlisted name never reaches canon. Through a SyncBoundary or a ToolBoundary on the
    test's loop."""
    kb = KnowledgeBase()
    boundary: SyncBoundary | ToolBoundary
    if kind == "sync-boundary":
        boundary = SyncBoundary(sync_store, kb.specs())
    else:
        boundary = ToolBoundary(await make_open_store(), kb.specs())
    model = ScriptedLLM(TURN)
    agent = FunctionAgent(tools=as_tools(boundary, SCHEMAS, run=RUN), llm=model.llm)
    result = await run_agent(agent, "Find our policies.")
    assert str(result) == "6 tool results"
    assert_turn_answered(model.results_seen())
    errors = {c.tool_id for c in result.tool_calls if c.tool_output.is_error}
    assert errors == {TURN[3][0], TURN[4][0], TURN[5][0]}
    assert dict(kb.executed) == EXECUTED_ONCE
    record = sync_store.get(RUN, TURN[0][0])
    assert record is not None and record.state.status is Status.READY
    assert sync_store.get(RUN, TURN[4][0]) is None


async def test_the_model_sees_each_tool_as_its_tool_spec_describes_it(
    sync_store: SyncStore,
) -> None:
    """The LLM is given each ToolSpec's input_schema as written and its description."""
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    specs = {
        "search": ToolSpec(
            executor=KnowledgeBase().search,
            projector=lambda raw, call: Projection(result=raw, evidence_status="NO_EVIDENCE"),
            description="Search the knowledge base.",
            input_schema=schema,
        )
    }
    model = ScriptedLLM([])
    tools = as_tools(SyncBoundary(sync_store, specs), specs, run=RUN)
    await run_agent(FunctionAgent(tools=tools, llm=model.llm), "Hello.")
    assert model.tools == {"search": schema}
    assert tools[0].metadata.description == "Search the knowledge base."


async def test_a_re_sent_turn_replays_the_recorded_replies(sync_store: SyncStore) -> None:
    """The same turn (same ids) in a new agent run: every call answers its record and
    nothing runs twice."""
    kb = KnowledgeBase()
    boundary = SyncBoundary(sync_store, kb.specs(), on_duplicate="replay")
    first, again = ScriptedLLM(TURN), ScriptedLLM(TURN)
    await run_agent(FunctionAgent(tools=as_tools(boundary, SCHEMAS, run=RUN), llm=first.llm), "Q")
    await run_agent(FunctionAgent(tools=as_tools(boundary, SCHEMAS, run=RUN), llm=again.llm), "Q")
    assert again.results_seen() == first.results_seen()
    assert dict(kb.executed) == EXECUTED_ONCE


async def test_two_identical_calls_of_one_turn_take_one_id_each(sync_store: SyncStore) -> None:
    """Two calls with the same tool and arguments in one turn run once each, each under
    its own id."""
    kb = KnowledgeBase()
    same = [("toolu_01TwinA", "search", {"q": "x"}), ("toolu_01TwinB", "search", {"q": "x"})]
    tools = as_tools(SyncBoundary(sync_store, kb.specs()), SCHEMAS, run=RUN)
    await run_agent(FunctionAgent(tools=tools, llm=ScriptedLLM(same).llm), "Twice.")
    assert dict(kb.executed) == {"toolu_01TwinA": 1, "toolu_01TwinB": 1}


async def test_a_call_without_the_models_id_is_refused_and_never_recorded(
    sync_store: SyncStore,
) -> None:
    """A call whose response carries no id (and a tool called outside a workflow) is
    refused with INVALID_TOOL_CALL_ID, logged on the run, never recorded."""
    kb = KnowledgeBase()
    tools = as_tools(SyncBoundary(sync_store, kb.specs()), SCHEMAS, run=RUN)
    model = ScriptedLLM([("", "search", {"q": "refund"})])
    await run_agent(FunctionAgent(tools=tools, llm=model.llm), "Find it.")
    [seen] = model.results_seen().values()
    assert json.loads(seen) == safe_error(ErrorCode.INVALID_TOOL_CALL_ID)
    outside = await tools[0].acall(q="refund")
    assert outside.is_error and json.loads(outside.content) == safe_error(
        ErrorCode.INVALID_TOOL_CALL_ID
    )
    with pytest.raises(TypeError, match="agent workflow"):
        tools[0].call(q="refund")
    assert kb.executed == {}
    codes = [refusal.code for refusal in sync_store.refusals(RUN)]
    assert codes == [ErrorCode.INVALID_TOOL_CALL_ID, ErrorCode.INVALID_TOOL_CALL_ID]


#: What the harness does on each ApprovalRequired it sees (the n-th, from 0), before it
#: sends the HumanResponseEvent that asks canon again.
OnWait = Callable[[int, ApprovalRequired], Awaitable[None]]


async def governed_run(
    sync_store: SyncStore, refunds: Refunds, on_wait: OnWait, *, waits: int
) -> tuple[Any, ScriptedLLM, list[ApprovalRequired]]:
    """One agent run whose refund waits in LlamaIndex's human-in-the-loop flow: the
    harness reacts to each ApprovalRequired (``on_wait``) and answers it with a
    HumanResponseEvent for the call; returns the run's result, the model, the events."""
    specs = refunds.specs()
    model = ScriptedLLM([(REFUND_ID, "refund", ORDER)])
    boundary = SyncBoundary(sync_store, specs, on_duplicate="replay")
    agent = FunctionAgent(tools=as_tools(boundary, specs, run=RUN), llm=model.llm)
    handler = agent.run(user_msg="Refund order 9.")
    seen: list[ApprovalRequired] = []

    async def drive() -> Any:
        async for event in handler.stream_events():
            if isinstance(event, ApprovalRequired):
                await on_wait(len(seen), event)
                seen.append(event)
                handler.ctx.send_event(event.response("decided"))
        return await handler

    result = await asyncio.wait_for(drive(), RUN_TIMEOUT_S)
    assert len(seen) == waits
    return result, model, seen


async def test_a_governed_call_waits_for_the_operator_and_runs_once(
    sync_store: SyncStore,
) -> None:
    """The refund waits (ApprovalRequired names the run, the call and the approval;
    nothing ran); a response before any decision only asks canon again, which still
    waits; approved by an operator, the next response runs it once and the model reads
    its result."""
    refunds = Refunds()

    async def on_wait(n: int, event: ApprovalRequired) -> None:
        record = sync_store.get(RUN, REFUND_ID)
        assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL
        assert (event.run_id, event.tool_call_id, event.tool) == (RUN, REFUND_ID, "refund")
        assert event.approval_id == record.state.approval_id and event.arguments == ORDER
        assert refunds.done == []
        if n == 1:  # the first response came before any decision
            sync_store.decide(RUN, REFUND_ID, approve=True, by="ops@example", reason="ok")

    result, model, _ = await governed_run(sync_store, refunds, on_wait, waits=2)
    assert json.loads(model.results_seen()[REFUND_ID]) == {"refunded": 125}
    assert str(result) == "1 tool results" and refunds.done == [ORDER]
    record = sync_store.get(RUN, REFUND_ID)
    assert record is not None and record.state.status is Status.READY
    assert record.state.decided_by == "ops@example"


async def test_a_denied_call_is_the_models_error_and_never_runs(sync_store: SyncStore) -> None:
    """Denied in canon: the response ends the wait with APPROVAL_DENIED as an error
    output; nothing ran."""
    refunds = Refunds()

    async def on_wait(n: int, event: ApprovalRequired) -> None:
        sync_store.decide(RUN, REFUND_ID, approve=False, by="ops@example", reason="no")

    result, model, _ = await governed_run(sync_store, refunds, on_wait, waits=1)
    assert json.loads(model.results_seen()[REFUND_ID]) == safe_error(ErrorCode.APPROVAL_DENIED)
    [call] = result.tool_calls
    assert call.tool_output.is_error and refunds.done == []


async def test_a_pause_holds_an_approved_call_until_the_unpause(sync_store: SyncStore) -> None:
    """Approved, then the run paused: the response asks canon, the call waits again (a new
    ApprovalRequired, no error output) and nothing runs; unpaused, the next response runs
    it once."""
    refunds = Refunds()

    async def on_wait(n: int, event: ApprovalRequired) -> None:
        if n == 0:
            sync_store.decide(RUN, REFUND_ID, approve=True, by="ops@example", reason="ok")
            sync_store.pause_run(RUN, by="ops@example", reason="incident")
        else:
            record = sync_store.get(RUN, REFUND_ID)
            assert record is not None and record.state.stage is Stage.APPROVED
            assert refunds.done == []
            sync_store.unpause_run(RUN, by="ops@example", reason="resolved")

    _, model, _ = await governed_run(sync_store, refunds, on_wait, waits=2)
    assert json.loads(model.results_seen()[REFUND_ID]) == {"refunded": 125}
    assert refunds.done == [ORDER]
