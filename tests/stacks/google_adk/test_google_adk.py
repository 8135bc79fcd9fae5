"""canon.integrations.google_adk: a real ADK ``LlmAgent`` on the SDK's ``Gemini`` model,
whose google-genai client talks to a scripted generateContent endpoint (never the network),
runs canon tools through ADK's runner: the model's call ids kept exactly, parallel calls,
errors as ``{"error": ...}``, a re-sent turn replayed, ADK's made-up ``adk-`` ids refused,
``runner.run`` (sync) and ``runner.run_async``, and governed calls approved, denied and
paused by an operator in canon, resumed through ADK's tool confirmation.
"""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import timedelta
from typing import Any

import httpx2
from google import genai
from google.adk.agents import LlmAgent
from google.adk.models.google_llm import Gemini
from google.adk.runners import InMemoryRunner
from google.genai import types

from canon.integrations.google_adk import (
    APPROVAL_KEY,
    REQUEST_CONFIRMATION,
    as_tools,
    confirmations,
)
from eventstore import Projection, SyncBoundary, SyncStore, ToolBoundary, ToolCall, ToolSpec
from machine.codes import SAFE_MESSAGES, ErrorCode, Stage, Status
from tests.support.agent_tools import SCHEMAS, TURN, KnowledgeBase, Refunds
from tests.unit.test_base_install_imports_no_sdk import sdks_loaded_by

RUN = "adk-run-1"
MODEL = "gemini-3-flash"
REFUND_ID = "rf8c2f1a"
SEARCH_ID = "sr4d9e0b"
ORDER = {"amount": 125, "to": "acct-9"}
USER = "user-1"


class Together:
    """A search whose calls wait for each other: they pass only if three run at once."""

    def __init__(self) -> None:
        self.runs = 0
        self._lock = threading.Lock()
        self._barrier = threading.Barrier(3, timeout=10)

    def specs(self) -> dict[str, ToolSpec]:
        def search(arguments: dict[str, Any], call: ToolCall) -> Any:
            with self._lock:
                self.runs += 1
            self._barrier.wait()
            return [f"{arguments['q']} policy"]

        return {
            "search_kb": ToolSpec(
                executor=search,
                projector=lambda raw, call: Projection(result=raw, evidence_status="NO_EVIDENCE"),
            )
        }


class ScriptedGemini:
    """Answers each generateContent request with the next recorded reply; keeps each body."""

    def __init__(self, *replies: dict[str, Any]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        """The transport's handler: record the request, send the next reply."""
        with self._lock:
            assert request.url.path.endswith(f"/models/{MODEL}:generateContent")
            self.requests.append(json.loads(request.content))
            assert self.replies, "the model was asked more often than scripted"
            return httpx2.Response(200, json=self.replies.pop(0))

    def responses(self, request: int = -1) -> dict[str, dict[str, Any]]:
        """The function responses the model was sent in a request, by call id."""
        return {
            part["functionResponse"]["id"]: part["functionResponse"]["response"]
            for content in self.requests[request]["contents"]
            for part in content["parts"]
            if "functionResponse" in part
        }


def response(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """A generateContent response body as the Gemini API publishes it."""
    candidate = {"content": {"parts": parts, "role": "model"}, "finishReason": "STOP", "index": 0}
    return {
        "candidates": [candidate],
        "responseId": "Yx3aZ7b0Ocs2-O4Pm8WKoAg",
        "modelVersion": MODEL,
    }


def turn(calls: list[tuple[str | None, str, dict[str, Any]]]) -> dict[str, Any]:
    """A response asking for ``calls`` (id, or None as Gemini 2.x sends them; tool; args)."""
    parts = []
    for call_id, name, args in calls:
        function_call: dict[str, Any] = {"name": name, "args": args}
        if call_id is not None:
            function_call["id"] = call_id
        parts.append({"functionCall": function_call})
    return response(parts)


FINAL = response([{"text": "done"}])


def runner_of(endpoint: ScriptedGemini, tools: list[Any]) -> InMemoryRunner:
    """An in-memory runner of an LlmAgent on ADK's Gemini model over the scripted endpoint."""
    http = httpx2.AsyncClient(transport=httpx2.MockTransport(endpoint.handle))
    client = genai.Client(api_key="test", http_options=types.HttpOptions(httpx_async_client=http))
    agent = LlmAgent(name="kb", model=Gemini(model=MODEL, client=client), tools=tools)
    return InMemoryRunner(agent=agent, app_name="canon-test")


def message(text: str) -> types.Content:
    """A user message."""
    return types.Content(role="user", parts=[types.Part(text=text)])


async def session_of(runner: InMemoryRunner) -> str:
    """A new session's id."""
    session = await runner.session_service.create_session(app_name="canon-test", user_id=USER)
    return str(session.id)


async def run_async(runner: InMemoryRunner, session_id: str, new: types.Content) -> list[Any]:
    """Every event of one invocation."""
    return [
        event
        async for event in runner.run_async(user_id=USER, session_id=session_id, new_message=new)
    ]


def run_sync(runner: InMemoryRunner, new: types.Content, session_id: str | None = None) -> Any:
    """``runner.run`` (ADK's sync entry point, a loop of its own in a thread): the events."""
    session_id = session_id or asyncio.run(session_of(runner))
    return list(runner.run(user_id=USER, session_id=session_id, new_message=new)), session_id


def safe_error(code: ErrorCode) -> dict[str, str]:
    """An error as the model reads it: the safe error JSON under ``error``."""
    body = {"error_code": code.value, "message": SAFE_MESSAGES[code]}
    return {"error": json.dumps(body, separators=(",", ":"))}


def test_a_turn_runs_under_the_models_ids_with_errors_as_error_responses(
    sync_store: SyncStore,
) -> None:
    """One turn of six calls (runner.run, a SyncBoundary): each call canon knows is
    recorded under the model's own id; the model reads every result, and a failed or
    unauthorized call as the safe error under ``error`` (no backend detail); a name no
    tool lists is ADK's own answer, never canon's."""
    kb = KnowledgeBase()
    endpoint = ScriptedGemini(turn(list(TURN)), FINAL)
    runner = runner_of(endpoint, as_tools(SyncBoundary(sync_store, kb.specs()), SCHEMAS, run=RUN))
    run_sync(runner, message("Find our policies."))
    seen = endpoint.responses()
    assert list(seen) == [call_id for call_id, _, _ in TURN]
    assert seen["call_Kq1vD2bW7cYxZ0aR"] == {"result": {"titles": ["refund policy"]}}
    assert seen["call_m3Np8QeLt5sJ2uHw"] == {"result": {"titles": ["shipping policy"]}}
    assert seen["call_Z9yXw8Vu7Ts6Rq5P"] == {"result": {"titles": ["warranty policy"]}}
    assert seen["call_A1b2C3d4E5f6G7h8"] == safe_error(ErrorCode.EXECUTION_FAILED)
    assert seen["call_P0o9I8u7Y6t5R4e3"] == safe_error(ErrorCode.UNAUTHORIZED)
    assert "no_such_tool" in seen["call_u7Yt6Rr5Ee4Ww3Qq"]["error"]  # ADK's own answer
    assert sync_store.get(RUN, "call_u7Yt6Rr5Ee4Ww3Qq") is None
    assert "sk-secret" not in str(endpoint.requests) and "raw row" not in str(endpoint.requests)
    assert dict(kb.executed) == {i: 1 for i, name, _ in TURN[:4]}
    record = sync_store.get(RUN, "call_A1b2C3d4E5f6G7h8")
    assert record is not None and record.state.status is Status.ERROR
    assert record.state.tool_call_id == "call_A1b2C3d4E5f6G7h8"


def test_a_turns_calls_run_at_once(sync_store: SyncStore) -> None:
    """Three calls of one turn run concurrently: each waits at a barrier for the other
    two, so one at a time would fail the turn."""
    tools = Together()
    calls: list[tuple[str | None, str, dict[str, Any]]] = [
        (f"par{n}llel", "search_kb", {"q": f"q{n}"}) for n in range(3)
    ]
    endpoint = ScriptedGemini(turn(calls), FINAL)
    boundary = SyncBoundary(sync_store, tools.specs())
    run_sync(
        runner_of(endpoint, as_tools(boundary, {"search_kb": SCHEMAS["search"]}, run=RUN)),
        message("Go."),
    )
    assert tools.runs == 3
    assert endpoint.responses() == {
        str(i): {"result": [f"{args['q']} policy"]} for i, _, args in calls
    }


def test_the_model_sees_each_tool_as_its_tool_spec_describes_it(sync_store: SyncStore) -> None:
    """The request's function declarations come from the ToolSpecs, as written."""
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
    endpoint = ScriptedGemini(FINAL)
    run_sync(
        runner_of(endpoint, as_tools(SyncBoundary(sync_store, specs), specs, run=RUN)),
        message("Hi."),
    )
    [tool] = endpoint.requests[0]["tools"]
    [declaration] = tool["functionDeclarations"]
    assert declaration["name"] == "search"
    assert declaration["description"] == "Search the knowledge base."
    assert declaration["parameters_json_schema"] == schema


def test_a_re_sent_turn_replays_the_recorded_replies(sync_store: SyncStore) -> None:
    """The same model turn (same ids) in a new session: every call answers its record,
    nothing runs twice, the model reads the same responses."""
    kb = KnowledgeBase()
    boundary = SyncBoundary(sync_store, kb.specs(), on_duplicate="replay")
    first = ScriptedGemini(turn(list(TURN)), FINAL)
    run_sync(runner_of(first, as_tools(boundary, SCHEMAS, run=RUN)), message("Find."))
    again = ScriptedGemini(turn(list(TURN)), FINAL)
    run_sync(runner_of(again, as_tools(boundary, SCHEMAS, run=RUN)), message("Find."))
    assert again.responses() == first.responses()
    assert dict(kb.executed) == {i: 1 for i, name, _ in TURN[:4]}


def test_a_call_without_the_models_id_is_refused_and_never_recorded(
    sync_store: SyncStore,
) -> None:
    """A Gemini 2.x call (no id): ADK makes one up (``adk-...``) and strips it before the
    model reads the turn; canon refuses the call with INVALID_TOOL_CALL_ID (logged on the
    run), never records it, and the tool does not run."""
    kb = KnowledgeBase()
    endpoint = ScriptedGemini(turn([(None, "search", {"q": "refund"})]), FINAL)
    runner = runner_of(endpoint, as_tools(SyncBoundary(sync_store, kb.specs()), SCHEMAS, run=RUN))
    events, _ = run_sync(runner, message("Find it."))
    [answer] = [
        part["functionResponse"]
        for content in endpoint.requests[-1]["contents"]
        for part in content["parts"]
        if "functionResponse" in part
    ]
    assert "id" not in answer  # ADK strips its own ids before the model reads the turn
    assert answer["response"] == safe_error(ErrorCode.INVALID_TOOL_CALL_ID)
    [made_up] = [call.id for event in events for call in event.get_function_calls()]
    assert made_up.startswith("adk-") and sync_store.get(RUN, made_up) is None
    assert kb.executed == {}
    assert [refusal.code for refusal in sync_store.refusals(RUN)] == [
        ErrorCode.INVALID_TOOL_CALL_ID
    ]


async def test_run_async_with_a_tool_boundary_on_the_stores_loop(make_open_store: Any) -> None:
    """``runner.run_async`` with an async ToolBoundary on the store's loop: the calls are
    recorded under the model's ids, as with a SyncBoundary."""
    store = await make_open_store()
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    kb = KnowledgeBase()
    endpoint = ScriptedGemini(turn(list(TURN)), FINAL)
    runner = runner_of(endpoint, as_tools(ToolBoundary(store, kb.specs()), SCHEMAS, run=RUN))
    await run_async(runner, await session_of(runner), message("Find our policies."))
    seen = endpoint.responses()
    assert seen["call_Kq1vD2bW7cYxZ0aR"] == {"result": {"titles": ["refund policy"]}}
    assert seen["call_A1b2C3d4E5f6G7h8"] == safe_error(ErrorCode.EXECUTION_FAILED)
    assert dict(kb.executed) == {i: 1 for i, name, _ in TURN[:4]}
    record = await store.get(RUN, "call_Kq1vD2bW7cYxZ0aR")
    assert record is not None and record.state.status is Status.READY


class Waiting:
    """An invocation whose turn asks for a search and a refund: the search runs, the
    refund waits for an operator, and ADK ends the invocation asking for a confirmation."""

    def __init__(self, sync_store: SyncStore, refunds: Refunds) -> None:
        specs = refunds.specs()
        boundary = self.boundary = SyncBoundary(sync_store, specs, on_duplicate="replay")
        calls: list[tuple[str | None, str, dict[str, Any]]] = [
            (SEARCH_ID, "search", {"q": "refund"}),
            (REFUND_ID, "refund", ORDER),
        ]
        self.endpoint = ScriptedGemini(turn(calls), FINAL)
        self.runner = runner_of(self.endpoint, as_tools(boundary, specs, run=RUN))
        self.events, self.session_id = run_sync(self.runner, message("Refund order 9."))
        [request] = self.requests()
        record = sync_store.get(RUN, REFUND_ID)
        assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL
        original = request.args["originalFunctionCall"]
        assert (original["id"], original["name"], original["args"]) == (REFUND_ID, "refund", ORDER)
        told = request.args["toolConfirmation"]["payload"][APPROVAL_KEY]
        assert told["status"] == "awaiting_approval" and told["run_id"] == RUN
        assert told["approval_id"] == record.state.approval_id
        assert refunds.done == [] and len(self.endpoint.requests) == 1

    def requests(self) -> list[Any]:
        """ADK's confirmation requests among the last invocation's events."""
        return [
            call
            for event in self.events
            for call in event.get_function_calls()
            if call.name == REQUEST_CONFIRMATION
        ]

    def answer(self) -> types.Content | None:
        """canon's answer to the confirmation requests (None while a call waits)."""
        return asyncio.run(confirmations(self.boundary, self.events))

    def resume(self, answer: types.Content | None = None) -> list[Any]:
        """Send the answer (canon's, unless given): the new events."""
        answer = self.answer() if answer is None else answer
        assert answer is not None
        self.events, _ = run_sync(self.runner, answer, self.session_id)
        return self.events


def test_an_approved_call_runs_once_and_the_model_reads_its_result(
    sync_store: SyncStore,
) -> None:
    """Before any decision, canon has no answer yet (nothing runs). Approved by an
    operator in canon, the answer runs the refund once; the model reads both results of
    the turn (the search ran once, before the request)."""
    refunds = Refunds()
    waiting = Waiting(sync_store, refunds)
    assert waiting.answer() is None and refunds.done == []
    sync_store.decide(RUN, REFUND_ID, approve=True, by="ops@example", reason="checked")
    waiting.resume()
    assert not waiting.requests() and refunds.done == [ORDER]
    seen = waiting.endpoint.responses()
    assert seen[REFUND_ID] == {"result": {"refunded": 125}}
    assert seen[SEARCH_ID] == {"result": {"titles": ["refund policy"]}}
    for call_id in (SEARCH_ID, REFUND_ID):
        record = sync_store.get(RUN, call_id)
        assert record is not None and record.state.status is Status.READY


def test_a_denied_call_is_its_error_and_never_runs(sync_store: SyncStore) -> None:
    """Denied by an operator in canon: the answer tells the model APPROVAL_DENIED; the
    refund never ran."""
    refunds = Refunds()
    waiting = Waiting(sync_store, refunds)
    sync_store.decide(RUN, REFUND_ID, approve=False, by="ops@example", reason="no")
    waiting.resume()
    assert waiting.endpoint.responses()[REFUND_ID] == safe_error(ErrorCode.APPROVAL_DENIED)
    assert refunds.done == []


def test_adks_own_confirmation_decides_nothing(sync_store: SyncStore) -> None:
    """A ``confirmed: true`` sent by other means before canon decided: the call asks canon,
    still waits, and the model reads canon's pending payload; the refund never ran."""
    refunds = Refunds()
    waiting = Waiting(sync_store, refunds)
    [request] = waiting.requests()
    confirmed = types.FunctionResponse(
        id=request.id, name=REQUEST_CONFIRMATION, response={"confirmed": True}
    )
    waiting.resume(types.Content(role="user", parts=[types.Part(function_response=confirmed)]))
    told = waiting.endpoint.responses()[REFUND_ID]["result"]
    assert told["status"] == "awaiting_approval" and refunds.done == []
    record = sync_store.get(RUN, REFUND_ID)
    assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL


def test_a_pause_holds_an_approved_call_until_the_unpause(sync_store: SyncStore) -> None:
    """Approved, then the run paused: canon has no answer yet, nothing runs; unpaused,
    the answer runs the refund once."""
    refunds = Refunds()
    waiting = Waiting(sync_store, refunds)
    sync_store.decide(RUN, REFUND_ID, approve=True, by="ops@example", reason="ok")
    sync_store.pause_run(RUN, by="ops@example", reason="incident")
    assert waiting.answer() is None and refunds.done == []
    sync_store.unpause_run(RUN, by="ops@example", reason="resolved")
    waiting.resume()
    assert refunds.done == [ORDER]
    assert waiting.endpoint.responses()[REFUND_ID] == {"result": {"refunded": 125}}


def test_the_adapter_loads_adk_and_the_base_install_does_not() -> None:
    """With ADK installed, the packages and the CLI still leave it unloaded; the adapter
    loads it."""
    assert sdks_loaded_by("eventstore", "canon.cli", "canon.integrations._shared") == []
    assert "google.adk" in sdks_loaded_by("canon.integrations.google_adk")
