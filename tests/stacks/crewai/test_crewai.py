"""canon.integrations.crewai: a real CrewAI ``Crew`` whose agent's ``LLM`` (CrewAI's own
OpenAI provider) talks to a scripted Chat Completions endpoint (never the network) runs
canon tools: the model's call ids kept exactly (read from the model's response by the
adapter's hook), parallel calls, errors as ``Error: `` outputs, a re-sent turn replayed,
calls without the model's id refused, ``kickoff`` and ``kickoff_async``, and governed
calls approved, denied and paused by an operator in canon, resumed with
``resume_waiting``.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest
from crewai import LLM, Agent, Crew, Task
from crewai.hooks import clear_before_tool_call_hooks
from openai import OpenAI

from canon.integrations.crewai import as_tools, resume_waiting
from eventstore import Projection, SyncBoundary, SyncStore, ToolBoundary, ToolSpec
from machine.codes import SAFE_MESSAGES, ErrorCode, Stage, Status
from tests.support.agent_tools import SCHEMAS, TURN, KnowledgeBase, Refunds
from tests.support.openai_scripted import Tools, chat_completion, function_call
from tests.unit.test_base_install_imports_no_sdk import sdks_loaded_by

RUN = "crew-run-1"
FINAL = chat_completion(None, "done")
REFUND_ID = "call_R3fUnd9Xy7Tn4Bm1Cd6Wq2L"
SEARCH_ID = "call_S3arCh0bEf0rEr3fUnd1"
ORDER = {"amount": 125, "to": "acct-9"}


class ScriptedChat:
    """Answers each Chat Completions request with the next recorded reply (CrewAI's openai
    2.x client is on httpx); a token count CrewAI asks for first gets a fixed count."""

    def __init__(self, *replies: dict[str, Any]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def handle(self, request: httpx.Request) -> httpx.Response:
        """The transport's handler: record the request, send the next reply."""
        if request.url.path.endswith("/responses/input_tokens"):
            return httpx.Response(200, json={"object": "response.input_tokens", "input_tokens": 96})
        with self._lock:
            assert request.url.path.endswith("/chat/completions"), request.url.path
            self.requests.append(json.loads(request.content))
            assert self.replies, "the model was asked more often than scripted"
            return httpx.Response(200, json=self.replies.pop(0))

    def tool_messages(self, request: int = -1) -> dict[str, str]:
        """The tool messages the model was sent in a request, by tool call id."""
        return {
            message["tool_call_id"]: message["content"]
            for message in self.requests[request]["messages"]
            if message["role"] == "tool"
        }


def turn(calls: list[tuple[str, str, dict[str, Any]]]) -> dict[str, Any]:
    """A Chat Completions response asking for ``calls`` (id, tool, arguments)."""
    return chat_completion([function_call(i, name, json.dumps(args)) for i, name, args in calls])


def llm_of(endpoint: ScriptedChat) -> LLM:
    """CrewAI's LLM on its native OpenAI provider, its client's transport the endpoint."""
    llm = LLM(model="gpt-4.1", api_key="sk-test", max_retries=0)
    http = httpx.Client(transport=httpx.MockTransport(endpoint.handle))
    llm._client = OpenAI(api_key="sk-test", http_client=http, max_retries=0)
    return llm


def crew_of(endpoint: ScriptedChat, tools: list[Any], task: str = "Answer.") -> Crew:
    """A one-agent, one-task crew whose agent has ``tools``."""
    agent = Agent(
        role="support",
        goal="Answer from the knowledge base.",
        backstory="A support agent.",
        tools=tools,
        llm=llm_of(endpoint),
        verbose=False,
    )
    work = Task(description=task, expected_output="The answer.", agent=agent)
    return Crew(agents=[agent], tasks=[work], verbose=False)


def safe_error(code: ErrorCode) -> str:
    """An error as the model reads it: ``Error: `` and the safe error JSON."""
    body = {"error_code": code.value, "message": SAFE_MESSAGES[code]}
    return "Error: " + json.dumps(body, separators=(",", ":"))


def test_a_turn_runs_under_the_models_ids_with_errors_as_outputs(sync_store: SyncStore) -> None:
    """One turn of six calls (kickoff): each call canon knows is recorded under the
    model's own id; the model reads every result, and a failed or unauthorized call as
    ``Error: `` and the safe error (no backend detail); a name no tool lists is CrewAI's
    own answer, never canon's."""
    kb = KnowledgeBase()
    endpoint = ScriptedChat(turn(TURN), FINAL)
    tools = as_tools(SyncBoundary(sync_store, kb.specs()), SCHEMAS, run=RUN)
    assert str(crew_of(endpoint, tools).kickoff()) == "done"
    seen = endpoint.tool_messages()
    assert list(seen) == [call_id for call_id, _, _ in TURN]
    assert json.loads(seen["call_Kq1vD2bW7cYxZ0aR"]) == {"titles": ["refund policy"]}
    assert json.loads(seen["call_m3Np8QeLt5sJ2uHw"]) == {"titles": ["shipping policy"]}
    assert json.loads(seen["call_Z9yXw8Vu7Ts6Rq5P"]) == {"titles": ["warranty policy"]}
    assert seen["call_A1b2C3d4E5f6G7h8"] == safe_error(ErrorCode.EXECUTION_FAILED)
    assert seen["call_P0o9I8u7Y6t5R4e3"] == safe_error(ErrorCode.UNAUTHORIZED)
    assert sync_store.get(RUN, "call_u7Yt6Rr5Ee4Ww3Qq") is None
    assert "sk-secret" not in str(endpoint.requests) and "raw row" not in str(endpoint.requests)
    assert dict(kb.executed) == {i: 1 for i, name, _ in TURN[:4]}
    record = sync_store.get(RUN, "call_A1b2C3d4E5f6G7h8")
    assert record is not None and record.state.status is Status.ERROR
    assert record.state.tool_call_id == "call_A1b2C3d4E5f6G7h8"


def test_a_turns_calls_run_at_once_and_identical_calls_take_one_id_each(
    sync_store: SyncStore,
) -> None:
    """Three calls of one turn, two of them identical, run concurrently (each waits at a
    barrier for the other two); each is recorded under its own id."""
    tools = Tools(together=3)
    calls = [
        ("call_Par0lLeLxYz0123", "search_kb", {"q": "same"}),
        ("call_Par1lLeLxYz0123", "search_kb", {"q": "same"}),
        ("call_Par2lLeLxYz0123", "search_kb", {"q": "other"}),
    ]
    endpoint = ScriptedChat(turn(calls), FINAL)
    boundary = SyncBoundary(sync_store, tools.specs())
    crew_of(endpoint, as_tools(boundary, {"search_kb": SCHEMAS["search"]}, run=RUN)).kickoff()
    assert tools.runs == {"search_kb": 3}
    seen = endpoint.tool_messages()
    assert {i: json.loads(seen[i]) for i, _, _ in calls} == {
        i: [f"{args['q']} policy"] for i, _, args in calls
    }
    for call_id, _, _ in calls:
        record = sync_store.get(RUN, call_id)
        assert record is not None and record.state.status is Status.READY


def test_the_model_sees_each_tool_as_its_tool_spec_describes_it(sync_store: SyncStore) -> None:
    """The request's tools come from the ToolSpecs: the description and properties as
    written (CrewAI's strict mode requires every property and no other)."""
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
    endpoint = ScriptedChat(FINAL)
    crew_of(endpoint, as_tools(SyncBoundary(sync_store, specs), specs, run=RUN)).kickoff()
    [shown] = endpoint.requests[0]["tools"]
    assert shown["function"]["name"] == "search"
    assert shown["function"]["description"] == "Search the knowledge base."
    assert shown["function"]["parameters"] == {**schema, "additionalProperties": False}


def test_a_re_sent_turn_replays_the_recorded_replies(sync_store: SyncStore) -> None:
    """The same model turn (same ids) in a new crew: every call answers its record,
    nothing runs twice, the model reads the same outputs."""
    kb = KnowledgeBase()
    boundary = SyncBoundary(sync_store, kb.specs(), on_duplicate="replay")
    first = ScriptedChat(turn(TURN), FINAL)
    crew_of(first, as_tools(boundary, SCHEMAS, run=RUN)).kickoff()
    again = ScriptedChat(turn(TURN), FINAL)
    crew_of(again, as_tools(boundary, SCHEMAS, run=RUN)).kickoff()
    assert again.tool_messages() == first.tool_messages()
    assert dict(kb.executed) == {i: 1 for i, name, _ in TURN[:4]}


def test_calls_without_the_models_id_are_refused_and_never_recorded(
    sync_store: SyncStore,
) -> None:
    """A model's call that came without an id, and a call by hand (``tool.run``): each is
    refused with INVALID_TOOL_CALL_ID (logged on the run), never recorded under an id made
    up for it; the tool does not run."""
    kb = KnowledgeBase()
    endpoint = ScriptedChat(turn([("", "search", {"q": "refund"})]), FINAL)
    tools = as_tools(SyncBoundary(sync_store, kb.specs()), SCHEMAS, run=RUN)
    crew_of(endpoint, tools).kickoff()
    assert endpoint.tool_messages() == {"": safe_error(ErrorCode.INVALID_TOOL_CALL_ID)}
    assert tools[0].run(q="refund") == safe_error(ErrorCode.INVALID_TOOL_CALL_ID)
    assert kb.executed == {}
    codes = [refusal.code for refusal in sync_store.refusals(RUN)]
    assert codes == [ErrorCode.INVALID_TOOL_CALL_ID, ErrorCode.INVALID_TOOL_CALL_ID]


def test_as_tools_registers_its_hook_again_after_crewais_hooks_were_cleared(
    sync_store: SyncStore,
) -> None:
    """``clear_before_tool_call_hooks()`` drops the hook that finds the ids; the next
    as_tools registers it again, and the call runs under the model's id."""
    clear_before_tool_call_hooks()
    kb = KnowledgeBase()
    endpoint = ScriptedChat(turn([TURN[0]]), FINAL)
    crew_of(endpoint, as_tools(SyncBoundary(sync_store, kb.specs()), SCHEMAS, run=RUN)).kickoff()
    assert json.loads(endpoint.tool_messages()[TURN[0][0]]) == {"titles": ["refund policy"]}
    assert dict(kb.executed) == {TURN[0][0]: 1}


async def test_kickoff_async_runs_the_calls_under_the_models_ids(sync_store: SyncStore) -> None:
    """``await crew.kickoff_async()``: the tools still run in threads, on the SyncBoundary,
    under the model's ids."""
    kb = KnowledgeBase()
    endpoint = ScriptedChat(turn(TURN), FINAL)
    tools = as_tools(SyncBoundary(sync_store, kb.specs()), SCHEMAS, run=RUN)
    assert str(await crew_of(endpoint, tools).kickoff_async()) == "done"
    assert json.loads(endpoint.tool_messages()["call_Kq1vD2bW7cYxZ0aR"]) == {
        "titles": ["refund policy"]
    }
    assert dict(kb.executed) == {i: 1 for i, name, _ in TURN[:4]}


async def test_an_async_boundary_is_a_clear_error(make_open_store: Any) -> None:
    """CrewAI calls tools from threads: an async ToolBoundary is a TypeError naming
    SyncBoundary, before any call."""
    store = await make_open_store()
    with pytest.raises(TypeError, match="SyncBoundary"):
        as_tools(ToolBoundary(store, KnowledgeBase().specs()), SCHEMAS, run=RUN)


def waiting_crew(sync_store: SyncStore, refunds: Refunds) -> tuple[list[Any], ScriptedChat]:
    """A kickoff whose refund waits for an operator: the model reads the pending payload
    as the call's output (a result, not an error); the search ran, the refund did not."""
    specs = refunds.specs()
    boundary = SyncBoundary(sync_store, specs, on_duplicate="replay")
    calls = [(SEARCH_ID, "search", {"q": "refund"}), (REFUND_ID, "refund", ORDER)]
    endpoint = ScriptedChat(turn(calls), FINAL, FINAL)
    tools = as_tools(boundary, specs, run=RUN)
    crew_of(endpoint, tools, "Refund order 9.").kickoff()
    pending = json.loads(endpoint.tool_messages()[REFUND_ID])
    record = sync_store.get(RUN, REFUND_ID)
    assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL
    assert pending["status"] == "awaiting_approval"
    assert pending["approval_id"] == record.state.approval_id
    assert refunds.done == []
    assert resume_waiting(tools) == {}  # undecided: nothing runs
    return tools, endpoint


def test_an_approved_call_runs_once_and_the_next_kickoff_is_told(sync_store: SyncStore) -> None:
    """Approved by an operator in canon: resume_waiting runs the refund once and returns
    its output by call id; asking again returns nothing and runs nothing."""
    refunds = Refunds()
    tools, _ = waiting_crew(sync_store, refunds)
    sync_store.decide(RUN, REFUND_ID, approve=True, by="ops@example", reason="checked")
    late = resume_waiting(tools)
    assert late == {REFUND_ID: '{"refunded":125}'}
    assert resume_waiting(tools) == {} and refunds.done == [ORDER]
    told = ScriptedChat(FINAL)
    crew_of(told, tools, f"Calls that waited have run: {json.dumps(late)}").kickoff()
    assert REFUND_ID in json.dumps(told.requests[0]["messages"])
    record = sync_store.get(RUN, REFUND_ID)
    assert record is not None and record.state.status is Status.READY


def test_a_denied_call_returns_its_error_and_never_runs(sync_store: SyncStore) -> None:
    """Denied: resume_waiting returns APPROVAL_DENIED as the model's text; nothing ran."""
    refunds = Refunds()
    tools, _ = waiting_crew(sync_store, refunds)
    sync_store.decide(RUN, REFUND_ID, approve=False, by="ops@example", reason="no")
    assert resume_waiting(tools) == {REFUND_ID: safe_error(ErrorCode.APPROVAL_DENIED)}
    assert refunds.done == []


def test_a_pause_holds_an_approved_call_until_the_unpause(sync_store: SyncStore) -> None:
    """Approved, then the run paused: resume_waiting runs nothing and keeps the call, and a
    re-sent turn reads the pending payload again (not RUN_PAUSED); unpaused, the call runs
    once."""
    refunds = Refunds()
    tools, _ = waiting_crew(sync_store, refunds)
    sync_store.decide(RUN, REFUND_ID, approve=True, by="ops@example", reason="ok")
    sync_store.pause_run(RUN, by="ops@example", reason="incident")
    assert resume_waiting(tools) == {}
    specs = refunds.specs()
    resent_tools = as_tools(SyncBoundary(sync_store, specs, on_duplicate="replay"), specs, run=RUN)
    resent = ScriptedChat(turn([(REFUND_ID, "refund", ORDER)]), FINAL)
    crew_of(resent, resent_tools, "Refund order 9.").kickoff()
    assert json.loads(resent.tool_messages()[REFUND_ID])["status"] == "awaiting_approval"
    assert refunds.done == []
    sync_store.unpause_run(RUN, by="ops@example", reason="resolved")
    assert resume_waiting(tools) == {REFUND_ID: '{"refunded":125}'}
    assert resume_waiting(resent_tools) == {REFUND_ID: '{"refunded":125}'}  # its record's
    assert refunds.done == [ORDER]


def test_the_adapter_loads_crewai_and_the_base_install_does_not() -> None:
    """With CrewAI installed, the packages and the CLI still leave it unloaded; the adapter
    loads it."""
    assert sdks_loaded_by("eventstore", "canon.cli", "canon.integrations._shared") == []
    assert "crewai" in sdks_loaded_by("canon.integrations.crewai")
