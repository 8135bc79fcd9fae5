"""canon.integrations.smolagents: a real ``ToolCallingAgent`` whose ``OpenAIServerModel``
talks to a scripted Chat Completions endpoint (never the network) runs canon tools: the
model's call ids kept exactly, parallel calls, errors as observations, a re-sent turn
replayed, calls without an id refused, and governed calls approved, denied and paused by
an operator in canon, resumed with ``resume_waiting``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx2
import pytest
from smolagents import OpenAIServerModel, ToolCallingAgent
from smolagents.memory import ActionStep

from canon.integrations.smolagents import as_tools, keep_call_ids, resume_waiting
from eventstore import Projection, SyncBoundary, SyncStore, ToolBoundary, ToolSpec
from machine.codes import SAFE_MESSAGES, ErrorCode, Stage, Status
from tests.support.agent_tools import SCHEMAS, TURN, KnowledgeBase, Refunds
from tests.support.openai_scripted import ScriptedOpenAI, chat_completion, function_call

RUN = "smol-run-1"
#: The turn without the name no tool lists (smolagents itself ends the step for it).
LISTED_TURN = [call for call in TURN if call[1] != "no_such_tool"]
FINAL = chat_completion(
    [function_call("call_F1nAl0aNsWeR9xYz", "final_answer", '{"answer": "ok"}')]
)
REFUND_ID = "call_R3fUnd9Xy7Tn4Bm1Cd6Wq2L"
ORDER = {"amount": 125, "to": "acct-9"}


def turn(calls: list[tuple[str, str, dict[str, Any]]]) -> dict[str, Any]:
    """A Chat Completions response asking for ``calls`` (id, tool, arguments)."""
    return chat_completion([function_call(i, name, json.dumps(args)) for i, name, args in calls])


def agent_of(endpoint: ScriptedOpenAI, tools: list[Any], *, wrap: bool = True) -> ToolCallingAgent:
    """A ToolCallingAgent on the SDK's OpenAI model over the scripted endpoint."""
    http = httpx2.Client(transport=httpx2.MockTransport(endpoint.handle))
    model = OpenAIServerModel(
        model_id="gpt-4.1", api_key="sk-test", client_kwargs={"http_client": http, "max_retries": 0}
    )
    return ToolCallingAgent(
        tools=tools, model=keep_call_ids(model) if wrap else model, verbosity_level=0
    )


def observed(agent: ToolCallingAgent, step: int = 0) -> dict[str, str]:
    """What the model read for each call of the agent's ``step``-th action, by call id.

    smolagents joins a step's observations in the order of the calls' ids.
    """
    action = [s for s in agent.memory.steps if isinstance(s, ActionStep)][step]
    ids = sorted(call.id for call in action.tool_calls or [])
    lines = (action.observations or "").split("\n")
    assert len(lines) == len(ids), action.observations
    return dict(zip(ids, lines, strict=True))


def safe_error(code: ErrorCode) -> str:
    """An error as the adapter shows it: ``Error: `` and the safe error JSON."""
    body = {"error_code": code.value, "message": SAFE_MESSAGES[code]}
    return "Error: " + json.dumps(body, separators=(",", ":"))


@pytest.fixture
def sync_store(redis_url: str, namespace: str) -> Iterator[SyncStore]:
    """A SyncStore with the run open; closed after the test."""
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        yield store


def test_parallel_calls_run_under_the_models_ids_with_errors_as_observations(
    sync_store: SyncStore,
) -> None:
    """One turn of five calls runs concurrently, each recorded under the model's own id;
    the model reads every result, and a failed or unauthorized call as ``Error: `` with
    the safe error JSON (no backend detail); the run goes on to its answer."""
    kb = KnowledgeBase()
    boundary = SyncBoundary(sync_store, kb.specs())
    endpoint = ScriptedOpenAI(turn(LISTED_TURN), FINAL)
    agent = agent_of(endpoint, as_tools(boundary, SCHEMAS, run=RUN))
    assert agent.run("Find our policies.") == "ok"
    seen = observed(agent)
    assert {i: json.loads(seen[i]) for i, name, _ in LISTED_TURN if name == "search"} == {
        "call_Kq1vD2bW7cYxZ0aR": {"titles": ["refund policy"]},
        "call_m3Np8QeLt5sJ2uHw": {"titles": ["shipping policy"]},
        "call_Z9yXw8Vu7Ts6Rq5P": {"titles": ["warranty policy"]},
    }
    assert seen["call_A1b2C3d4E5f6G7h8"] == safe_error(ErrorCode.EXECUTION_FAILED)
    assert seen["call_P0o9I8u7Y6t5R4e3"] == safe_error(ErrorCode.UNAUTHORIZED)
    assert "sk-secret" not in str(endpoint.requests) and "raw row" not in str(endpoint.requests)
    assert dict(kb.executed) == {i: 1 for i, name, _ in LISTED_TURN if name != "delete_order"}
    record = sync_store.get(RUN, "call_Kq1vD2bW7cYxZ0aR")
    assert record is not None and record.state.status is Status.READY
    assert record.state.tool_call_id == "call_Kq1vD2bW7cYxZ0aR"


def test_the_model_sees_each_tool_as_its_tool_spec_describes_it(sync_store: SyncStore) -> None:
    """The request's tools come from the ToolSpecs: description, properties as written,
    required as the schema says."""
    schema = {
        "type": "object",
        "properties": {"q": {"type": "string", "description": "The query."}, "k": {}},
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
    agent = agent_of(endpoint, as_tools(SyncBoundary(sync_store, specs), specs, run=RUN))
    agent.run("Hello.")
    [shown] = [t for t in endpoint.requests[0]["tools"] if t["function"]["name"] == "search"]
    assert shown["function"]["description"] == "Search the knowledge base."
    assert shown["function"]["parameters"]["required"] == ["q"]
    assert shown["function"]["parameters"]["properties"]["q"] == {
        "type": "string",
        "description": "The query.",
    }


def test_a_re_sent_turn_replays_the_recorded_replies(sync_store: SyncStore) -> None:
    """The same model turn (same ids) in a new agent run: every call answers its record,
    nothing runs twice, the model reads the same observations."""
    kb = KnowledgeBase()
    boundary = SyncBoundary(sync_store, kb.specs(), on_duplicate="replay")
    first = agent_of(ScriptedOpenAI(turn(LISTED_TURN), FINAL), as_tools(boundary, SCHEMAS, run=RUN))
    first.run("Find our policies.")
    again = agent_of(ScriptedOpenAI(turn(LISTED_TURN), FINAL), as_tools(boundary, SCHEMAS, run=RUN))
    again.run("Find our policies.")
    assert observed(again) == observed(first)
    assert dict(kb.executed) == {i: 1 for i, name, _ in LISTED_TURN if name != "delete_order"}


def test_two_identical_calls_of_one_turn_take_one_id_each(sync_store: SyncStore) -> None:
    """Two calls with the same tool and arguments in one turn: each is recorded under its
    own id, each runs once."""
    kb = KnowledgeBase()
    same = [
        ("call_Tw1nA0aBbCcDdEe", "search", {"q": "x"}),
        ("call_Tw1nB0aBbCcDdEe", "search", {"q": "x"}),
    ]
    agent = agent_of(
        ScriptedOpenAI(turn(same), FINAL),
        as_tools(SyncBoundary(sync_store, kb.specs()), SCHEMAS, run=RUN),
    )
    agent.run("Twice.")
    assert dict(kb.executed) == {"call_Tw1nA0aBbCcDdEe": 1, "call_Tw1nB0aBbCcDdEe": 1}


def test_a_call_without_the_models_id_is_refused_and_never_recorded(
    sync_store: SyncStore,
) -> None:
    """With the model unwrapped, smolagents gives the tool no id: the call is refused with
    INVALID_TOOL_CALL_ID (logged on the run), never recorded under a made-up id; so is a
    call smolagents parsed from the model's text (it invents a uuid4 id for it)."""
    kb = KnowledgeBase()
    boundary = SyncBoundary(sync_store, kb.specs())
    call = [("call_Kq1vD2bW7cYxZ0aR", "search", {"q": "refund"})]
    agent = agent_of(
        ScriptedOpenAI(turn(call), FINAL), as_tools(boundary, SCHEMAS, run=RUN), wrap=False
    )
    agent.run("Find it.")
    assert observed(agent) == {"call_Kq1vD2bW7cYxZ0aR": safe_error(ErrorCode.INVALID_TOOL_CALL_ID)}
    text_call = chat_completion(None, '{"name": "search", "arguments": {"q": "refund"}}')
    parsed = agent_of(ScriptedOpenAI(text_call, FINAL), as_tools(boundary, SCHEMAS, run=RUN))
    parsed.run("Find it.")
    [line] = observed(parsed).values()
    assert line == safe_error(ErrorCode.INVALID_TOOL_CALL_ID)
    assert kb.executed == {} and sync_store.get(RUN, "call_Kq1vD2bW7cYxZ0aR") is None
    codes = [refusal.code for refusal in sync_store.refusals(RUN)]
    assert codes == [ErrorCode.INVALID_TOOL_CALL_ID, ErrorCode.INVALID_TOOL_CALL_ID]


def test_a_tool_no_agent_lists_never_reaches_canon(sync_store: SyncStore) -> None:
    """A name the agent's tools do not list: smolagents answers it itself; canon records
    nothing and logs no refusal."""
    kb = KnowledgeBase()
    call = [("call_u7Yt6Rr5Ee4Ww3Qq", "search", {"q": "x"})]
    tools = as_tools(SyncBoundary(sync_store, kb.specs()), {"broken": SCHEMAS["broken"]}, run=RUN)
    agent_of(ScriptedOpenAI(turn(call), FINAL), tools).run("Search.")
    assert sync_store.get(RUN, "call_u7Yt6Rr5Ee4Ww3Qq") is None
    assert sync_store.refusals(RUN) == [] and kb.executed == {}


async def test_an_async_boundary_is_a_clear_error(make_open_store: Any) -> None:
    """smolagents calls tools from threads: an async ToolBoundary is a TypeError naming
    SyncBoundary, before any call."""
    store = await make_open_store()
    with pytest.raises(TypeError, match="SyncBoundary"):
        as_tools(ToolBoundary(store, KnowledgeBase().specs()), SCHEMAS, run=RUN)


def waiting_run(sync_store: SyncStore, refunds: Refunds) -> tuple[ToolCallingAgent, ScriptedOpenAI]:
    """An agent run whose refund waits for an operator: the model reads the pending payload
    as the call's observation (a result, not an error); nothing ran."""
    specs = refunds.specs()
    boundary = SyncBoundary(sync_store, specs, on_duplicate="replay")
    endpoint = ScriptedOpenAI(turn([(REFUND_ID, "refund", ORDER)]), FINAL, FINAL)
    agent = agent_of(endpoint, as_tools(boundary, specs, run=RUN))
    agent.run("Refund order 9.")
    pending = json.loads(observed(agent)[REFUND_ID])
    record = sync_store.get(RUN, REFUND_ID)
    assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL
    assert pending["status"] == "awaiting_approval"
    assert pending["approval_id"] == record.state.approval_id
    assert "has not run" in pending["message"] and refunds.done == []
    assert resume_waiting(agent) == {}  # undecided: nothing runs
    return agent, endpoint


def test_an_approved_call_runs_once_and_the_model_is_told(sync_store: SyncStore) -> None:
    """Approved by an operator in canon: resume_waiting runs the refund once and returns
    its result by call id; the agent's next run tells the model; asking again returns
    nothing and runs nothing."""
    refunds = Refunds()
    agent, endpoint = waiting_run(sync_store, refunds)
    sync_store.decide(RUN, REFUND_ID, approve=True, by="ops@example", reason="checked")
    late = resume_waiting(agent)
    assert late == {REFUND_ID: '{"refunded":125}'}
    assert resume_waiting(agent) == {} and refunds.done == [ORDER]
    agent.run(f"Calls that waited have run: {json.dumps(late)}", reset=False)
    assert REFUND_ID in json.dumps(endpoint.requests[-1]["messages"][-1])
    record = sync_store.get(RUN, REFUND_ID)
    assert record is not None and record.state.status is Status.READY


def test_a_denied_call_returns_its_error_and_never_runs(sync_store: SyncStore) -> None:
    """Denied: resume_waiting returns APPROVAL_DENIED as the model's text; nothing ran."""
    refunds = Refunds()
    agent, _ = waiting_run(sync_store, refunds)
    sync_store.decide(RUN, REFUND_ID, approve=False, by="ops@example", reason="no")
    assert resume_waiting(agent) == {REFUND_ID: safe_error(ErrorCode.APPROVAL_DENIED)}
    assert refunds.done == []


def test_a_pause_holds_an_approved_call_until_the_unpause(sync_store: SyncStore) -> None:
    """Approved, then the run paused: resume_waiting runs nothing and keeps the call, and a
    re-sent turn reads the pending payload again (not RUN_PAUSED); unpaused, the call runs
    once."""
    refunds = Refunds()
    agent, _ = waiting_run(sync_store, refunds)
    sync_store.decide(RUN, REFUND_ID, approve=True, by="ops@example", reason="ok")
    sync_store.pause_run(RUN, by="ops@example", reason="incident")
    assert resume_waiting(agent) == {}
    specs = refunds.specs()
    boundary = SyncBoundary(sync_store, specs, on_duplicate="replay")
    resent = agent_of(
        ScriptedOpenAI(turn([(REFUND_ID, "refund", ORDER)]), FINAL),
        as_tools(boundary, specs, run=RUN),
    )
    resent.run("Refund order 9.")
    assert json.loads(observed(resent)[REFUND_ID])["status"] == "awaiting_approval"
    assert refunds.done == []
    sync_store.unpause_run(RUN, by="ops@example", reason="resolved")
    assert resume_waiting(agent) == {REFUND_ID: '{"refunded":125}'}
    assert resume_waiting(resent) == {REFUND_ID: '{"refunded":125}'}  # its record's reply
    assert refunds.done == [ORDER]
