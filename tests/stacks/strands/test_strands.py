"""canon.integrations.strands: a real Strands ``Agent`` whose ``OpenAIModel`` talks to a
scripted Chat Completions endpoint (never the network) runs canon tools: the model's call
ids kept exactly, parallel calls, errors as error results, a re-sent turn replayed, a call
without an id refused, sync (``agent(...)``) and async (``invoke_async``), and governed
calls approved, denied and paused by an operator in canon, resumed through Strands'
interrupts.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import httpx2
from openai import AsyncOpenAI
from strands import Agent
from strands.models.openai import OpenAIModel

from canon.integrations.strands import APPROVAL_INTERRUPT, approval_responses, as_tools
from eventstore import Projection, SyncBoundary, SyncStore, ToolBoundary, ToolSpec
from machine.codes import SAFE_MESSAGES, ErrorCode, Stage, Status
from tests.support.agent_tools import SCHEMAS, TURN, KnowledgeBase, Refunds
from tests.support.openai_scripted import ScriptedOpenAI, Tools, chat_completion, function_call
from tests.unit.test_base_install_imports_no_sdk import sdks_loaded_by

RUN = "strands-run-1"
FINAL = chat_completion(None, "done")
REFUND_ID = "call_R3fUnd9Xy7Tn4Bm1Cd6Wq2L"
ORDER = {"amount": 125, "to": "acct-9"}


def turn(calls: list[tuple[str, str, dict[str, Any]]]) -> dict[str, Any]:
    """A Chat Completions response asking for ``calls`` (id, tool, arguments)."""
    return chat_completion([function_call(i, name, json.dumps(args)) for i, name, args in calls])


def agent_of(endpoint: ScriptedOpenAI, tools: list[Any]) -> Agent:
    """A Strands Agent on its OpenAI model, whose client's transport is the scripted endpoint."""
    client = AsyncOpenAI(
        api_key="sk-test",
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(endpoint.handle)),
        max_retries=0,
    )
    model = OpenAIModel(client=client, model_id="gpt-4.1", stream=False)
    return Agent(model=model, tools=tools, callback_handler=None)


def tool_messages(endpoint: ScriptedOpenAI, request: int = -1) -> dict[str, str]:
    """The tool messages the model was sent in a request, by tool call id."""
    return {
        message["tool_call_id"]: message["content"]
        for message in endpoint.requests[request]["messages"]
        if message["role"] == "tool"
    }


def safe_error(code: ErrorCode) -> dict[str, str]:
    """An error as the model reads it: the code and its fixed message."""
    return {"error_code": code.value, "message": SAFE_MESSAGES[code]}


def test_a_turn_runs_under_the_models_ids_with_errors_as_error_results(
    sync_store: SyncStore,
) -> None:
    """One turn of six calls (agent(...), sync): each call canon knows is recorded under
    the model's own id; the model reads every result, and a failed or unauthorized call as
    the safe error (no backend detail); a name no tool lists is Strands' own answer, never
    canon's; the run goes on to its answer."""
    kb = KnowledgeBase()
    endpoint = ScriptedOpenAI(turn(TURN), FINAL)
    agent = agent_of(endpoint, as_tools(SyncBoundary(sync_store, kb.specs()), SCHEMAS, run=RUN))
    assert str(agent("Find our policies.")).strip() == "done"
    seen = tool_messages(endpoint)
    assert list(seen) == [call_id for call_id, _, _ in TURN]
    assert json.loads(seen["call_Kq1vD2bW7cYxZ0aR"]) == {"titles": ["refund policy"]}
    assert json.loads(seen["call_m3Np8QeLt5sJ2uHw"]) == {"titles": ["shipping policy"]}
    assert json.loads(seen["call_Z9yXw8Vu7Ts6Rq5P"]) == {"titles": ["warranty policy"]}
    assert json.loads(seen["call_A1b2C3d4E5f6G7h8"]) == safe_error(ErrorCode.EXECUTION_FAILED)
    assert json.loads(seen["call_P0o9I8u7Y6t5R4e3"]) == safe_error(ErrorCode.UNAUTHORIZED)
    assert "no_such_tool" in seen["call_u7Yt6Rr5Ee4Ww3Qq"]  # Strands' "Unknown tool"
    assert sync_store.get(RUN, "call_u7Yt6Rr5Ee4Ww3Qq") is None
    assert "sk-secret" not in str(endpoint.requests) and "raw row" not in str(endpoint.requests)
    assert dict(kb.executed) == {i: 1 for i, name, _ in TURN[:4]}
    record = sync_store.get(RUN, "call_A1b2C3d4E5f6G7h8")
    assert record is not None and record.state.status is Status.ERROR
    assert record.state.tool_call_id == "call_A1b2C3d4E5f6G7h8"
    [result] = [
        block["toolResult"]
        for message in agent.messages
        for block in message["content"]
        if "toolResult" in block and block["toolResult"]["toolUseId"] == "call_A1b2C3d4E5f6G7h8"
    ]
    assert result["status"] == "error"


def test_a_turns_calls_run_at_once(sync_store: SyncStore) -> None:
    """Three calls of one turn run concurrently: each waits at a barrier for the other
    two, so a one-at-a-time executor would fail the turn."""
    tools = Tools(together=3)
    calls = [(f"call_Par{n}lLeLxYz0123", "search_kb", {"q": f"q{n}"}) for n in range(3)]
    endpoint = ScriptedOpenAI(turn(calls), FINAL)
    specs = tools.specs()
    agent = agent_of(
        endpoint,
        as_tools(SyncBoundary(sync_store, specs), {"search_kb": SCHEMAS["search"]}, run=RUN),
    )
    agent("Search thrice.")
    assert tools.runs == {"search_kb": 3}
    seen = tool_messages(endpoint)
    assert {i: json.loads(seen[i]) for i, _, _ in calls} == {
        i: [f"{args['q']} policy"] for i, _, args in calls
    }


def test_the_model_sees_each_tool_as_its_tool_spec_describes_it(sync_store: SyncStore) -> None:
    """The request's tools come from the ToolSpecs: description, properties and required
    as written."""
    schema = {
        "type": "object",
        "properties": {"q": {"type": "string", "description": "The query."}},
        "required": ["q"],
    }
    specs = {
        "search": ToolSpec(
            executor=KnowledgeBase().search,
            projector=lambda raw, call: Projection(result=raw, evidence_status="NO_EVIDENCE"),
            description="Search the knowledge base.",
            input_schema=schema,
        )
    }
    endpoint = ScriptedOpenAI(FINAL)
    agent_of(endpoint, as_tools(SyncBoundary(sync_store, specs), specs, run=RUN))("Hello.")
    [shown] = endpoint.requests[0]["tools"]
    assert shown["function"]["name"] == "search"
    assert shown["function"]["description"] == "Search the knowledge base."
    assert shown["function"]["parameters"]["required"] == ["q"]
    assert shown["function"]["parameters"]["properties"]["q"] == {
        "type": "string",
        "description": "The query.",
    }


def test_a_re_sent_turn_replays_the_recorded_replies(sync_store: SyncStore) -> None:
    """The same model turn (same ids) in a new agent: every call answers its record,
    nothing runs twice, the model reads the same results."""
    kb = KnowledgeBase()
    boundary = SyncBoundary(sync_store, kb.specs(), on_duplicate="replay")
    first = ScriptedOpenAI(turn(TURN), FINAL)
    agent_of(first, as_tools(boundary, SCHEMAS, run=RUN))("Find our policies.")
    again = ScriptedOpenAI(turn(TURN), FINAL)
    agent_of(again, as_tools(boundary, SCHEMAS, run=RUN))("Find our policies.")
    assert tool_messages(again) == tool_messages(first)
    assert dict(kb.executed) == {i: 1 for i, name, _ in TURN[:4]}


def test_a_call_the_model_never_made_is_refused_and_never_recorded(
    sync_store: SyncStore,
) -> None:
    """A direct call (``agent.tool.search(...)``) gets an id Strands invents: refused with
    INVALID_TOOL_CALL_ID (logged on the run), never recorded under it; the tool does not
    run. (A model's call without an id never reaches a tool: Strands drops it.)"""
    kb = KnowledgeBase()
    endpoint = ScriptedOpenAI(turn([("", "search", {"q": "refund"})]), FINAL)
    agent = agent_of(endpoint, as_tools(SyncBoundary(sync_store, kb.specs()), SCHEMAS, run=RUN))
    agent("Find it.")
    assert tool_messages(endpoint) == {}
    result = agent.tool.search(q="refund")
    assert result["status"] == "error"
    assert json.loads(result["content"][0]["text"]) == safe_error(ErrorCode.INVALID_TOOL_CALL_ID)
    assert result["toolUseId"].startswith("tooluse_search_")
    assert sync_store.get(RUN, result["toolUseId"]) is None and kb.executed == {}
    assert [refusal.code for refusal in sync_store.refusals(RUN)] == [
        ErrorCode.INVALID_TOOL_CALL_ID
    ]


async def test_invoke_async_runs_on_the_stores_loop(make_open_store: Any) -> None:
    """``await agent.invoke_async(...)`` with an async ToolBoundary on the store's loop:
    the calls are recorded under the model's ids, as with a SyncBoundary."""
    store = await make_open_store()
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    kb = KnowledgeBase()
    endpoint = ScriptedOpenAI(turn(TURN), FINAL)
    agent = agent_of(endpoint, as_tools(ToolBoundary(store, kb.specs()), SCHEMAS, run=RUN))
    result = await agent.invoke_async("Find our policies.")
    assert str(result).strip() == "done"
    seen = tool_messages(endpoint)
    assert json.loads(seen["call_Kq1vD2bW7cYxZ0aR"]) == {"titles": ["refund policy"]}
    assert json.loads(seen["call_A1b2C3d4E5f6G7h8"]) == safe_error(ErrorCode.EXECUTION_FAILED)
    assert dict(kb.executed) == {i: 1 for i, name, _ in TURN[:4]}
    record = await store.get(RUN, "call_Kq1vD2bW7cYxZ0aR")
    assert record is not None and record.state.status is Status.READY


SEARCH_ID = "call_S3arCh0bEf0rEr3fUnd1"


def waiting_run(sync_store: SyncStore, refunds: Refunds) -> tuple[Agent, Any, ScriptedOpenAI]:
    """An agent whose turn asks for a search and a refund: the search runs, the refund
    waits for an operator, and the agent stops with Strands' interrupt naming the call."""
    specs = refunds.specs()
    boundary = SyncBoundary(sync_store, specs, on_duplicate="replay")
    calls = [(SEARCH_ID, "search", {"q": "refund"}), (REFUND_ID, "refund", ORDER)]
    endpoint = ScriptedOpenAI(turn(calls), FINAL)
    agent = agent_of(endpoint, as_tools(boundary, specs, run=RUN))
    result = agent("Refund order 9.")
    assert result.stop_reason == "interrupt"
    [interrupt] = result.interrupts
    record = sync_store.get(RUN, REFUND_ID)
    assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL
    assert interrupt.name == APPROVAL_INTERRUPT
    assert interrupt.reason["status"] == "awaiting_approval"
    assert interrupt.reason["approval_id"] == record.state.approval_id
    assert interrupt.reason["tool_call_id"] == REFUND_ID
    assert (interrupt.reason["tool"], interrupt.reason["arguments"]) == ("refund", ORDER)
    assert refunds.done == [] and len(endpoint.requests) == 1
    return agent, result, endpoint


def test_an_approved_call_runs_once_and_the_model_reads_its_result(sync_store: SyncStore) -> None:
    """Resumed before any decision: the agent stops again (nothing runs). Approved by an
    operator in canon, the resume runs the refund once; the model reads both results of
    the turn (the search, which ran before the interrupt, ran once)."""
    refunds = Refunds()
    agent, result, endpoint = waiting_run(sync_store, refunds)
    result = agent(approval_responses(result))
    assert result.stop_reason == "interrupt" and refunds.done == []
    sync_store.decide(RUN, REFUND_ID, approve=True, by="ops@example", reason="checked")
    result = agent(approval_responses(result))
    assert result.stop_reason == "end_turn" and refunds.done == [ORDER]
    seen = tool_messages(endpoint)
    assert json.loads(seen[REFUND_ID]) == {"refunded": 125}
    assert json.loads(seen[SEARCH_ID]) == {"titles": ["refund policy"]}
    record = sync_store.get(RUN, SEARCH_ID)
    assert record is not None and record.state.status is Status.READY
    record = sync_store.get(RUN, REFUND_ID)
    assert record is not None and record.state.status is Status.READY


def test_the_frameworks_own_response_never_decides(sync_store: SyncStore) -> None:
    """A response that says "approved" to Strands decides nothing: the call still waits
    until an operator denies it in canon; then the model reads APPROVAL_DENIED and the
    refund never ran."""
    refunds = Refunds()
    agent, result, endpoint = waiting_run(sync_store, refunds)
    [interrupt] = result.interrupts
    result = agent([{"interruptResponse": {"interruptId": interrupt.id, "response": "approved"}}])
    assert result.stop_reason == "interrupt" and refunds.done == []
    sync_store.decide(RUN, REFUND_ID, approve=False, by="ops@example", reason="no")
    result = agent(approval_responses(result))
    assert result.stop_reason == "end_turn"
    assert json.loads(tool_messages(endpoint)[REFUND_ID]) == safe_error(ErrorCode.APPROVAL_DENIED)
    assert refunds.done == []


def test_a_pause_holds_an_approved_call_until_the_unpause(sync_store: SyncStore) -> None:
    """Approved, then the run paused: the resume stops again with an interrupt (not
    RUN_PAUSED), nothing runs; unpaused, the next resume runs the refund once."""
    refunds = Refunds()
    agent, result, endpoint = waiting_run(sync_store, refunds)
    sync_store.decide(RUN, REFUND_ID, approve=True, by="ops@example", reason="ok")
    sync_store.pause_run(RUN, by="ops@example", reason="incident")
    result = agent(approval_responses(result))
    assert result.stop_reason == "interrupt" and refunds.done == []
    [interrupt] = result.interrupts
    assert interrupt.reason["tool_call_id"] == REFUND_ID
    sync_store.unpause_run(RUN, by="ops@example", reason="resolved")
    result = agent(approval_responses(result))
    assert result.stop_reason == "end_turn" and refunds.done == [ORDER]
    assert json.loads(tool_messages(endpoint)[REFUND_ID]) == {"refunded": 125}


def test_the_adapter_loads_strands_and_the_base_install_does_not() -> None:
    """With Strands installed, the packages and the CLI still leave it unloaded; the
    adapter loads it, and no other SDK."""
    assert sdks_loaded_by("eventstore", "canon.cli", "canon.integrations._shared") == []
    assert sdks_loaded_by("canon.integrations.strands") == ["strands"]
