"""canon.integrations.agent_framework: a real Agent Framework ``Agent`` whose
``OpenAIChatCompletionClient`` talks to a scripted Chat Completions endpoint (never the
network) runs canon tools: the model's call ids kept exactly, parallel calls, errors as
``Error: `` results, a re-sent turn replayed, calls without the model's id refused, a
SyncBoundary from any loop and a ToolBoundary on its store's loop, and governed calls
approved, denied and paused by an operator in canon, resumed through the framework's
approval requests.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import httpx2
import pytest
from agent_framework import Agent, AgentSession, Message
from agent_framework.openai import OpenAIChatCompletionClient
from openai import AsyncOpenAI

from canon.integrations.agent_framework import APPROVAL_KEY, approval_responses, as_tools
from eventstore import Projection, SyncBoundary, SyncStore, ToolBoundary, ToolSpec
from machine.codes import SAFE_MESSAGES, ErrorCode, Stage, Status
from tests.support.agent_tools import SCHEMAS, TURN, KnowledgeBase, Refunds
from tests.support.openai_scripted import ScriptedOpenAI, Tools, chat_completion, function_call
from tests.unit.test_base_install_imports_no_sdk import sdks_loaded_by

RUN = "af-run-1"
FINAL = chat_completion(None, "done")
REFUND_ID = "call_R3fUnd9Xy7Tn4Bm1Cd6Wq2L"
SEARCH_ID = "call_S3arCh0bEf0rEr3fUnd1"
ORDER = {"amount": 125, "to": "acct-9"}


def turn(calls: list[tuple[str, str, dict[str, Any]]]) -> dict[str, Any]:
    """A Chat Completions response asking for ``calls`` (id, tool, arguments)."""
    return chat_completion([function_call(i, name, json.dumps(args)) for i, name, args in calls])


def agent_of(endpoint: ScriptedOpenAI, tools: list[Any]) -> Agent:
    """An Agent on the framework's OpenAI chat client, over the scripted endpoint."""
    http = httpx2.AsyncClient(transport=httpx2.MockTransport(endpoint.handle))
    client = OpenAIChatCompletionClient(
        model="gpt-4.1",
        async_client=AsyncOpenAI(api_key="sk-test", http_client=http, max_retries=0),
    )
    return Agent(client=client, tools=tools)


def run(agent: Agent, prompt: Any, session: AgentSession | None = None) -> Any:
    """``agent.run`` under ``asyncio.run`` in this thread, as a sync harness runs it."""
    return asyncio.run(agent.run(prompt, session=session))


def tool_messages(endpoint: ScriptedOpenAI, request: int = -1) -> dict[str, str]:
    """The tool messages the model was sent in a request, by tool call id."""
    return {
        message["tool_call_id"]: message["content"]
        for message in endpoint.requests[request]["messages"]
        if message["role"] == "tool"
    }


def safe_error(code: ErrorCode) -> str:
    """An error as the model reads it: ``Error: `` and the safe error JSON."""
    body = {"error_code": code.value, "message": SAFE_MESSAGES[code]}
    return "Error: " + json.dumps(body, separators=(",", ":"))


def test_a_turn_runs_under_the_models_ids_with_errors_as_error_results(
    sync_store: SyncStore,
) -> None:
    """One turn of six calls (a SyncBoundary, the agent under asyncio.run): each call canon
    knows is recorded under the model's own id; the model reads every result, and a failed
    or unauthorized call as ``Error: `` and the safe error (no backend detail); a name no
    tool lists is the framework's own answer, never canon's."""
    kb = KnowledgeBase()
    endpoint = ScriptedOpenAI(turn(TURN), FINAL)
    agent = agent_of(endpoint, as_tools(SyncBoundary(sync_store, kb.specs()), SCHEMAS, run=RUN))
    assert run(agent, "Find our policies.").text == "done"
    seen = tool_messages(endpoint)
    assert list(seen) == [call_id for call_id, _, _ in TURN]
    assert json.loads(seen["call_Kq1vD2bW7cYxZ0aR"]) == {"titles": ["refund policy"]}
    assert json.loads(seen["call_m3Np8QeLt5sJ2uHw"]) == {"titles": ["shipping policy"]}
    assert json.loads(seen["call_Z9yXw8Vu7Ts6Rq5P"]) == {"titles": ["warranty policy"]}
    assert seen["call_A1b2C3d4E5f6G7h8"] == safe_error(ErrorCode.EXECUTION_FAILED)
    assert seen["call_P0o9I8u7Y6t5R4e3"] == safe_error(ErrorCode.UNAUTHORIZED)
    assert "no_such_tool" in seen["call_u7Yt6Rr5Ee4Ww3Qq"]  # the framework's "not found"
    assert sync_store.get(RUN, "call_u7Yt6Rr5Ee4Ww3Qq") is None
    assert "sk-secret" not in str(endpoint.requests) and "raw row" not in str(endpoint.requests)
    assert dict(kb.executed) == {i: 1 for i, name, _ in TURN[:4]}
    record = sync_store.get(RUN, "call_A1b2C3d4E5f6G7h8")
    assert record is not None and record.state.status is Status.ERROR
    assert record.state.tool_call_id == "call_A1b2C3d4E5f6G7h8"


def test_a_turns_calls_run_at_once(sync_store: SyncStore) -> None:
    """Three calls of one turn run concurrently: each waits at a barrier for the other
    two, so one at a time would fail the turn."""
    tools = Tools(together=3)
    calls = [(f"call_Par{n}lLeLxYz0123", "search_kb", {"q": f"q{n}"}) for n in range(3)]
    endpoint = ScriptedOpenAI(turn(calls), FINAL)
    boundary = SyncBoundary(sync_store, tools.specs())
    run(agent_of(endpoint, as_tools(boundary, {"search_kb": SCHEMAS["search"]}, run=RUN)), "Go.")
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
    run(agent_of(endpoint, as_tools(SyncBoundary(sync_store, specs), specs, run=RUN)), "Hello.")
    [shown] = endpoint.requests[0]["tools"]
    assert shown["function"]["name"] == "search"
    assert shown["function"]["description"] == "Search the knowledge base."
    assert shown["function"]["parameters"] == schema


def test_a_re_sent_turn_replays_the_recorded_replies(sync_store: SyncStore) -> None:
    """The same model turn (same ids) in a new agent: every call answers its record,
    nothing runs twice, the model reads the same results."""
    kb = KnowledgeBase()
    boundary = SyncBoundary(sync_store, kb.specs(), on_duplicate="replay")
    first = ScriptedOpenAI(turn(TURN), FINAL)
    run(agent_of(first, as_tools(boundary, SCHEMAS, run=RUN)), "Find our policies.")
    again = ScriptedOpenAI(turn(TURN), FINAL)
    run(agent_of(again, as_tools(boundary, SCHEMAS, run=RUN)), "Find our policies.")
    assert tool_messages(again) == tool_messages(first)
    assert dict(kb.executed) == {i: 1 for i, name, _ in TURN[:4]}


@pytest.mark.filterwarnings("ignore:An actionable function_call had an empty call_id")
def test_calls_without_the_models_id_are_refused_and_never_recorded(
    sync_store: SyncStore,
) -> None:
    """A model's call without an id gets one the framework makes up (``af-call-...``),
    and a call by hand (``tool.invoke``) has none: each is refused with
    INVALID_TOOL_CALL_ID (logged on the run), never recorded; the tool does not run."""
    kb = KnowledgeBase()
    endpoint = ScriptedOpenAI(turn([("", "search", {"q": "refund"})]), FINAL)
    tools = as_tools(SyncBoundary(sync_store, kb.specs()), SCHEMAS, run=RUN)
    run(agent_of(endpoint, tools), "Find it.")
    [(made_up, seen)] = tool_messages(endpoint).items()
    assert made_up.startswith("af-call-")
    assert seen == safe_error(ErrorCode.INVALID_TOOL_CALL_ID)
    by_hand = asyncio.run(tools[0].invoke(arguments={"q": "refund"}))
    assert by_hand == safe_error(ErrorCode.INVALID_TOOL_CALL_ID)
    assert kb.executed == {} and sync_store.get(RUN, made_up) is None
    codes = [refusal.code for refusal in sync_store.refusals(RUN)]
    assert codes == [ErrorCode.INVALID_TOOL_CALL_ID, ErrorCode.INVALID_TOOL_CALL_ID]


async def test_an_async_boundary_serves_the_agent_on_its_stores_loop(
    make_open_store: Any,
) -> None:
    """``await agent.run(...)`` with a ToolBoundary on the store's loop: the calls are
    recorded under the model's ids, as with a SyncBoundary."""
    store = await make_open_store()
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    kb = KnowledgeBase()
    endpoint = ScriptedOpenAI(turn(TURN), FINAL)
    agent = agent_of(endpoint, as_tools(ToolBoundary(store, kb.specs()), SCHEMAS, run=RUN))
    assert (await agent.run("Find our policies.")).text == "done"
    seen = tool_messages(endpoint)
    assert json.loads(seen["call_Kq1vD2bW7cYxZ0aR"]) == {"titles": ["refund policy"]}
    assert seen["call_A1b2C3d4E5f6G7h8"] == safe_error(ErrorCode.EXECUTION_FAILED)
    assert dict(kb.executed) == {i: 1 for i, name, _ in TURN[:4]}
    record = await store.get(RUN, "call_Kq1vD2bW7cYxZ0aR")
    assert record is not None and record.state.status is Status.READY


class Waiting:
    """An agent run whose turn asks for a search and a refund: the search runs, the refund
    waits for an operator, and the run ends with the framework's approval request."""

    def __init__(self, sync_store: SyncStore, refunds: Refunds) -> None:
        specs = refunds.specs()
        boundary = SyncBoundary(sync_store, specs, on_duplicate="replay")
        calls = [(SEARCH_ID, "search", {"q": "refund"}), (REFUND_ID, "refund", ORDER)]
        self.endpoint = ScriptedOpenAI(turn(calls), FINAL)
        self.agent = agent_of(self.endpoint, as_tools(boundary, specs, run=RUN))
        self.session = self.agent.create_session()
        self.response = run(self.agent, "Refund order 9.", self.session)
        [request] = self.response.user_input_requests
        record = sync_store.get(RUN, REFUND_ID)
        assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL
        assert request.type == "function_approval_request"
        assert request.function_call.call_id == REFUND_ID
        assert request.function_call.name == "refund"
        assert request.function_call.parse_arguments() == ORDER
        told = request.additional_properties[APPROVAL_KEY]
        assert told["status"] == "awaiting_approval" and told["run_id"] == RUN
        assert told["approval_id"] == record.state.approval_id
        assert refunds.done == [] and len(self.endpoint.requests) == 1

    def resume(self, answers: list[Any] | None = None) -> Any:
        """Run the agent again with approval responses (canon's, unless given)."""
        answers = approval_responses(self.response) if answers is None else answers
        self.response = run(self.agent, Message("user", answers), self.session)
        return self.response


def test_an_approved_call_runs_once_and_the_model_reads_its_result(
    sync_store: SyncStore,
) -> None:
    """Resumed before any decision: a new approval request (nothing runs). Approved by an
    operator in canon, the resume runs the refund once; the model reads both results of
    the turn (the search ran once, before the request)."""
    refunds = Refunds()
    waiting = Waiting(sync_store, refunds)
    assert waiting.resume().user_input_requests and refunds.done == []
    sync_store.decide(RUN, REFUND_ID, approve=True, by="ops@example", reason="checked")
    response = waiting.resume()
    assert response.text == "done" and not response.user_input_requests
    assert refunds.done == [ORDER]
    seen = tool_messages(waiting.endpoint)
    assert json.loads(seen[REFUND_ID]) == {"refunded": 125}
    assert json.loads(seen[SEARCH_ID]) == {"titles": ["refund policy"]}
    for call_id in (SEARCH_ID, REFUND_ID):
        record = sync_store.get(RUN, call_id)
        assert record is not None and record.state.status is Status.READY


def test_a_denied_call_is_its_error_and_never_runs(sync_store: SyncStore) -> None:
    """Denied by an operator in canon: the resume tells the model APPROVAL_DENIED; the
    refund never ran."""
    refunds = Refunds()
    waiting = Waiting(sync_store, refunds)
    sync_store.decide(RUN, REFUND_ID, approve=False, by="ops@example", reason="no")
    assert waiting.resume().text == "done"
    assert tool_messages(waiting.endpoint)[REFUND_ID] == safe_error(ErrorCode.APPROVAL_DENIED)
    assert refunds.done == []


def test_the_frameworks_own_rejection_never_decides_in_canon(sync_store: SyncStore) -> None:
    """The framework's ``approved=False``: the framework tells the model it was rejected,
    and in canon the call still waits for its operator, never run."""
    refunds = Refunds()
    waiting = Waiting(sync_store, refunds)
    [request] = waiting.response.user_input_requests
    assert waiting.resume([request.to_function_approval_response(approved=False)]).text == "done"
    assert refunds.done == []
    record = sync_store.get(RUN, REFUND_ID)
    assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL


def test_a_pause_holds_an_approved_call_until_the_unpause(sync_store: SyncStore) -> None:
    """Approved, then the run paused: the resume ends with a new approval request (not
    RUN_PAUSED), nothing runs; unpaused, the next resume runs the refund once."""
    refunds = Refunds()
    waiting = Waiting(sync_store, refunds)
    sync_store.decide(RUN, REFUND_ID, approve=True, by="ops@example", reason="ok")
    sync_store.pause_run(RUN, by="ops@example", reason="incident")
    [request] = waiting.resume().user_input_requests
    assert request.function_call.call_id == REFUND_ID and refunds.done == []
    sync_store.unpause_run(RUN, by="ops@example", reason="resolved")
    assert waiting.resume().text == "done" and refunds.done == [ORDER]
    assert json.loads(tool_messages(waiting.endpoint)[REFUND_ID]) == {"refunded": 125}


def test_the_adapter_loads_the_framework_and_the_base_install_does_not() -> None:
    """With the framework installed, the packages and the CLI still leave it unloaded; the
    adapter loads it."""
    assert sdks_loaded_by("eventstore", "canon.cli", "canon.integrations._shared") == []
    assert "agent_framework" in sdks_loaded_by("canon.integrations.agent_framework")
