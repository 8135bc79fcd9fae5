"""canon.integrations.pydantic_ai with governed tools: a real Pydantic AI Agent (scripted
FunctionModel) calls a governed refund through ``BoundaryToolset``; the call is deferred
(``CallDeferred``, the approval in its metadata), operators decide in canon, and
``deferred_results`` resumes it through the boundary into the ``DeferredToolResults`` the
agent continues with: run once when approved, Pydantic AI's denial when denied, never run
on the framework's own approval, refused when the history's arguments were altered.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from typing import Any

import pytest
from pydantic import TypeAdapter
from pydantic_ai import Agent
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturn,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied

from canon.integrations.pydantic_ai import (
    AlteredToolCall,
    BoundaryToolset,
    deferred_results,
    waiting_calls,
)
from eventstore import (
    Projection,
    RunContext,
    Store,
    SyncBoundary,
    SyncStore,
    ToolBoundary,
    ToolCall,
    ToolSpec,
)
from eventstore.writer import now_ms
from machine.codes import SAFE_MESSAGES, ErrorCode, EvidenceStatus, Stage
from machine.ids import invocation_id
from tests.support.waiting import wait_for

RUN = "agent-run-governed"
CTX = RunContext(RUN)
LOOKUP_ID, REFUND_ID = "call_lookup_7Hq2", "call_refund_9Xk4"
ORDER = {"order": "A-17", "amount": 125}


class Shop:
    """A read-only lookup and a governed refund, each counting what it did."""

    def __init__(self) -> None:
        self.lookups: list[dict[str, Any]] = []
        self.refunds: list[dict[str, Any]] = []
        self.bank_down = False

    def lookup(self, arguments: dict[str, Any], call: ToolCall) -> Any:
        self.lookups.append(arguments)
        return {"order": arguments["order"], "status": "delivered"}

    def refund(self, arguments: dict[str, Any], call: ToolCall) -> Any:
        if self.bank_down:
            raise RuntimeError("bank unreachable: token sk-secret")
        self.refunds.append(arguments)
        return {"refunded": arguments["amount"]}

    def specs(self, **refund: Any) -> dict[str, ToolSpec]:
        refund.setdefault("approval", True)
        return {
            "lookup": ToolSpec(
                executor=self.lookup,
                projector=project,
                description="Look an order up.",
                input_schema={"type": "object", "properties": {"order": {"type": "string"}}},
            ),
            "refund": ToolSpec(
                executor=self.refund,
                projector=project,
                read_only=False,
                description="Refund an order (an operator approves it).",
                input_schema={
                    "type": "object",
                    "properties": {"order": {"type": "string"}, "amount": {"type": "integer"}},
                },
                **refund,
            ),
        }


def project(raw: Any, call: ToolCall) -> Projection:
    return Projection(result=raw, evidence_status=EvidenceStatus.EVIDENCE_FOUND, scope="shop")


class Customer:
    """The model's side: a lookup and a refund on the user's turn; then an answer naming
    every tool return it was shown (content and outcome). Every request is kept."""

    def __init__(self) -> None:
        self.requests: list[list[ModelMessage]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests.append(list(messages))
        last = messages[-1]
        if isinstance(last, ModelRequest) and isinstance(last.parts[-1], UserPromptPart):
            return ModelResponse(
                parts=[
                    ToolCallPart("lookup", json.dumps({"order": "A-17"}), LOOKUP_ID),
                    ToolCallPart("refund", json.dumps(ORDER), REFUND_ID),
                ]
            )
        seen = {p.tool_name: [p.content, p.outcome] for p in self.returns_seen()}
        return ModelResponse(parts=[TextPart(json.dumps(seen))])

    def returns_seen(self) -> list[ToolReturnPart]:
        """The tool returns sent after the model's last response, in its latest request."""
        latest = self.requests[-1]
        after = max(i for i, m in enumerate(latest) if isinstance(m, ModelResponse))
        return [
            part
            for message in latest[after + 1 :]
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, ToolReturnPart)
        ]


class CountingToolset(BoundaryToolset):
    """BoundaryToolset counting the calls Pydantic AI makes to it, by tool call id."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.called: list[str] = []

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: Any, tool: Any) -> Any:
        self.called.append(ctx.tool_call_id)
        return await super().call_tool(name, tool_args, ctx, tool)


class Harness:
    """One agent over one boundary: the first run, and its continuation."""

    def __init__(self, boundary: ToolBoundary | SyncBoundary, shop: Shop) -> None:
        self.shop = shop
        self.boundary = boundary
        self.model = Customer()
        self.toolset = CountingToolset(boundary, shop.specs(), run_id=RUN)
        self.agent = Agent(
            FunctionModel(self.model),
            toolsets=[self.toolset],
            output_type=[str, DeferredToolRequests],
        )
        self.messages: list[ModelMessage] = []

    async def start(self) -> DeferredToolRequests:
        """The user's turn: ends deferred, the refund waiting for an operator."""
        result = await self.agent.run("Refund order A-17, it never arrived.")
        self.messages = result.all_messages()
        assert isinstance(result.output, DeferredToolRequests)
        return result.output

    async def resume(self, results: DeferredToolResults) -> Any:
        result = await self.agent.run(message_history=self.messages, deferred_tool_results=results)
        self.messages = result.all_messages()
        return result.output


@pytest.fixture
async def store(make_open_store: Any) -> Store:
    store: Store = await make_open_store()
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    return store


async def decide(store: Store, *, approve: bool) -> None:
    decision = await store.decide(
        RUN, REFUND_ID, approve=approve, by="ops@example", reason="checked the order"
    )
    assert decision.made_now


def with_refund_args(messages: list[ModelMessage], args: Any, tool: str = "refund") -> Any:
    """The history with the refund call's arguments (or tool) replaced, as a client could."""
    changed: list[ModelMessage] = []
    for message in messages:
        if isinstance(message, ModelResponse):
            parts = [
                ToolCallPart(tool, args, REFUND_ID)
                if isinstance(part, ToolCallPart) and part.tool_call_id == REFUND_ID
                else part
                for part in message.parts
            ]
            message = dataclasses.replace(message, parts=parts)
        changed.append(message)
    return changed


async def test_a_governed_call_ends_the_run_deferred_with_its_approval(store: Store) -> None:
    """The refund is deferred (CallDeferred): the run's DeferredToolRequests lists it in
    ``calls`` with the run, invocation and approval ids in its metadata; it has not run,
    and the read-only lookup of the same turn has."""
    shop = Shop()
    harness = Harness(ToolBoundary(store, shop.specs()), shop)
    requests = await harness.start()
    [call] = requests.calls
    assert (call.tool_call_id, call.tool_name, call.args_as_dict()) == (REFUND_ID, "refund", ORDER)
    assert requests.approvals == []
    record = await store.get(RUN, REFUND_ID)
    assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL
    assert requests.metadata[REFUND_ID] == {
        "run_id": RUN,
        "invocation_id": invocation_id(RUN, REFUND_ID),
        "approval_id": record.state.approval_id,
    }
    assert shop.refunds == [] and len(shop.lookups) == 1
    returns = [
        p
        for m in harness.messages
        for p in getattr(m, "parts", [])
        if isinstance(p, ToolReturnPart)
    ]
    assert [p.tool_call_id for p in returns] == [LOOKUP_ID]


async def test_before_a_decision_the_helper_answers_nothing(store: Store) -> None:
    """Undecided: no result, no denial; the call is listed as waiting and has not run,
    however often the helper asks."""
    shop = Shop()
    boundary = ToolBoundary(store, shop.specs())
    harness = Harness(boundary, shop)
    requests = await harness.start()
    for _ in range(2):
        results = await deferred_results(boundary, CTX, requests, message_history=harness.messages)
        assert (results.calls, results.approvals) == ({}, {})
        assert [c.tool_call_id for c in waiting_calls(requests, results)] == [REFUND_ID]
    assert shop.refunds == []
    record = await store.get(RUN, REFUND_ID)
    assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_an_approved_call_runs_once_and_the_agent_answers_with_it(
    store: Store, redis_url: str, namespace: str, kind: str
) -> None:
    """Approved in canon: the helper runs the frozen request once and returns its result;
    the agent continues to its final answer with it, without calling the toolset again; a
    second helper call answers the recorded result and runs nothing. Also through a
    SyncBoundary."""
    shop = Shop()
    if kind == "sync":
        sync_store = SyncStore.from_url(redis_url, namespace=namespace)
        boundary: ToolBoundary | SyncBoundary = SyncBoundary(sync_store, shop.specs())
    else:
        boundary = ToolBoundary(store, shop.specs())
    try:
        harness = Harness(boundary, shop)
        requests = await harness.start()
        await decide(store, approve=True)

        results = await deferred_results(boundary, CTX, requests, message_history=harness.messages)
        assert (
            results.calls == {REFUND_ID: ToolReturn({"refunded": 125})} and results.approvals == {}
        )
        assert waiting_calls(requests, results) == []
        assert shop.refunds == [ORDER]

        again = await deferred_results(boundary, CTX, requests, message_history=harness.messages)
        assert again.calls == results.calls and shop.refunds == [ORDER]

        answer = json.loads(await harness.resume(results))
        assert answer == {
            "lookup": [{"order": "A-17", "status": "delivered"}, "success"],
            "refund": [{"refunded": 125}, "success"],
        }
        assert harness.toolset.called == [LOOKUP_ID, REFUND_ID]  # the first run's only
        assert shop.refunds == [ORDER] and len(shop.lookups) == 1
        record = await store.get(RUN, REFUND_ID)
        assert record is not None and record.state.stage is not Stage.AWAITING_APPROVAL
    finally:
        if kind == "sync":
            sync_store.close()


async def test_a_denied_call_reaches_the_model_as_pydantic_ais_denial(store: Store) -> None:
    """Denied in canon: the helper answers ToolDenied (in ``approvals``, where Pydantic AI
    reads a denial), which the model sees as a denied return (``outcome="denied"``) with
    the safe APPROVAL_DENIED text; the refund never runs."""
    shop = Shop()
    boundary = ToolBoundary(store, shop.specs())
    harness = Harness(boundary, shop)
    requests = await harness.start()
    await decide(store, approve=False)

    results = await deferred_results(boundary, CTX, requests, message_history=harness.messages)
    assert results.calls == {}
    denial = results.approvals[REFUND_ID]
    assert isinstance(denial, ToolDenied)
    assert json.loads(denial.message) == {
        "error_code": "APPROVAL_DENIED",
        "message": SAFE_MESSAGES[ErrorCode.APPROVAL_DENIED],
    }
    assert waiting_calls(requests, results) == []

    answer = json.loads(await harness.resume(results))
    assert answer["refund"] == [denial.message, "denied"]
    assert shop.refunds == [] and harness.toolset.called == [LOOKUP_ID, REFUND_ID]


async def test_an_expired_approval_is_a_denial_too(store: Store) -> None:
    """Nobody decided in time: APPROVAL_EXPIRED, shown to the model as a denial."""
    shop = Shop()
    boundary = ToolBoundary(store, shop.specs(approval_timeout=timedelta(milliseconds=50)))
    harness = Harness(boundary, shop)
    requests = await harness.start()
    record = await store.get(RUN, REFUND_ID)
    assert record is not None and record.state.approval_expires_at_ms is not None
    due = record.state.approval_expires_at_ms
    await wait_for(lambda: now_ms() > due)

    results = await deferred_results(boundary, CTX, requests, message_history=harness.messages)
    denial = results.approvals[REFUND_ID]
    assert isinstance(denial, ToolDenied)
    assert json.loads(denial.message)["error_code"] == "APPROVAL_EXPIRED"
    assert json.loads(await harness.resume(results))["refund"][1] == "denied"
    assert shop.refunds == []


@pytest.mark.parametrize(
    "framework_says",
    [True, ToolApproved(), ToolApproved(override_args={"order": "A-17", "amount": 9999})],
    ids=["true", "tool-approved", "override-args"],
)
async def test_the_frameworks_own_approval_never_dispatches(
    store: Store, framework_says: Any
) -> None:
    """``DeferredToolResults.approvals`` approving a canon call only makes Pydantic AI call
    the toolset again: the boundary re-enters the same call, still waiting, so the run
    ends deferred again (other arguments are a duplicate, a failed return); nothing runs,
    and the operator's decision is still open."""
    shop = Shop()
    boundary = ToolBoundary(store, shop.specs())
    harness = Harness(boundary, shop)
    await harness.start()

    output = await harness.resume(DeferredToolResults(approvals={REFUND_ID: framework_says}))
    if isinstance(framework_says, ToolApproved) and framework_says.override_args:
        [part] = [p for p in harness.model.returns_seen() if p.tool_call_id == REFUND_ID]
        assert part.outcome == "failed"
        assert json.loads(output)["refund"][1] == "failed"
        assert json.loads(part.content)["error_code"] == "DUPLICATE_TOOL_CALL"  # type: ignore[arg-type]
    else:
        assert isinstance(output, DeferredToolRequests)
        assert [c.tool_call_id for c in output.calls] == [REFUND_ID]
        assert output.metadata[REFUND_ID]["invocation_id"] == invocation_id(RUN, REFUND_ID)
    assert shop.refunds == []
    record = await store.get(RUN, REFUND_ID)
    assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL


@pytest.mark.parametrize(
    "args, tool",
    [
        (json.dumps({"order": "A-17", "amount": 9999}), "refund"),
        ({"order": "A-17", "amount": 9999}, "refund"),
        ({"amount": 125, "order": "A-17"}, "refund"),  # another canonical request
        (None, "refund"),
        ("{not json", "refund"),
        (json.dumps(ORDER), "lookup"),
    ],
    ids=["json-text", "dict", "reordered", "none", "not-json", "other-tool"],
)
async def test_altered_history_arguments_are_refused(store: Store, args: Any, tool: str) -> None:
    """A history whose deferred call is not the recorded one (arguments or tool) is
    refused with AlteredToolCall before anything is resumed: even approved, nothing runs
    and no result is given; the unaltered history then goes on."""
    shop = Shop()
    boundary = ToolBoundary(store, shop.specs())
    harness = Harness(boundary, shop)
    requests = await harness.start()
    await decide(store, approve=True)

    altered = with_refund_args(harness.messages, args, tool)
    with pytest.raises(AlteredToolCall) as refused:
        await deferred_results(boundary, CTX, requests, message_history=altered)
    assert refused.value.tool_call_id == REFUND_ID and REFUND_ID in str(refused.value)
    assert shop.refunds == []
    record = await store.get(RUN, REFUND_ID)
    assert record is not None and record.state.stage is Stage.APPROVED

    results = await deferred_results(boundary, CTX, requests, message_history=harness.messages)
    assert results.calls == {REFUND_ID: ToolReturn({"refunded": 125})} and shop.refunds == [ORDER]


async def test_altered_request_arguments_are_refused(store: Store) -> None:
    """The DeferredToolRequests passed in is checked as well as the history."""
    shop = Shop()
    boundary = ToolBoundary(store, shop.specs())
    harness = Harness(boundary, shop)
    requests = await harness.start()
    await decide(store, approve=True)
    [call] = requests.calls
    altered = dataclasses.replace(
        requests, calls=[dataclasses.replace(call, args={"order": "B-2", "amount": 125})]
    )
    with pytest.raises(AlteredToolCall):
        await deferred_results(boundary, CTX, altered, message_history=harness.messages)
    assert shop.refunds == []


async def test_a_paused_run_leaves_an_approved_call_waiting(store: Store) -> None:
    """Approved but the run paused: nothing runs and the call is still waiting; once the
    run is unpaused, the helper runs it."""
    shop = Shop()
    boundary = ToolBoundary(store, shop.specs())
    harness = Harness(boundary, shop)
    requests = await harness.start()
    await decide(store, approve=True)
    await store.pause_run(RUN, by="ops@example", reason="incident")

    results = await deferred_results(boundary, CTX, requests, message_history=harness.messages)
    assert (results.calls, results.approvals) == ({}, {})
    assert [c.tool_call_id for c in waiting_calls(requests, results)] == [REFUND_ID]
    assert shop.refunds == []

    await store.unpause_run(RUN, by="ops@example", reason="resolved")
    results = await deferred_results(boundary, CTX, requests, message_history=harness.messages)
    assert results.calls == {REFUND_ID: ToolReturn({"refunded": 125})} and shop.refunds == [ORDER]


async def test_an_approved_call_that_fails_is_a_failed_return(store: Store) -> None:
    """The approved refund raises: ToolFailed with the safe error JSON (never the tool's
    own text), which the model reads as a failed return; it is not run again."""
    shop = Shop()
    shop.bank_down = True
    boundary = ToolBoundary(store, shop.specs())
    harness = Harness(boundary, shop)
    requests = await harness.start()
    await decide(store, approve=True)

    results = await deferred_results(boundary, CTX, requests, message_history=harness.messages)
    failure = results.calls[REFUND_ID]
    assert isinstance(failure, ToolFailed)
    assert json.loads(failure.message) == {
        "error_code": "EXECUTION_FAILED",
        "message": SAFE_MESSAGES[ErrorCode.EXECUTION_FAILED],
    }
    shop.bank_down = False
    again = await deferred_results(boundary, CTX, requests, message_history=harness.messages)
    assert again.calls[REFUND_ID] == failure and shop.refunds == []
    answer = json.loads(await harness.resume(results))
    assert answer["refund"] == [failure.message, "failed"]
    assert "sk-secret" not in json.dumps(answer)


async def test_calls_deferred_by_others_are_left_to_the_application(store: Store) -> None:
    """A deferred call whose metadata does not name its canon invocation in this run is
    not canon's: the helper leaves it out (waiting) and asks canon nothing about it."""
    shop = Shop()
    boundary = ToolBoundary(store, shop.specs())
    harness = Harness(boundary, shop)
    requests = await harness.start()
    await decide(store, approve=True)
    foreign = ToolCallPart("ask_user", {"question": "which card?"}, "call_external_1")
    mixed = dataclasses.replace(
        requests,
        calls=[*requests.calls, foreign],
        metadata={**requests.metadata, "call_external_1": {"ticket": 4}},
    )
    results = await deferred_results(boundary, CTX, mixed, message_history=harness.messages)
    assert list(results.calls) == [REFUND_ID]
    assert waiting_calls(mixed, results) == [foreign]
    assert await store.get(RUN, "call_external_1") is None

    other_run = await deferred_results(
        boundary, RunContext("another-run"), requests, message_history=harness.messages
    )
    assert (other_run.calls, other_run.approvals) == ({}, {})


async def test_a_paused_agent_stored_as_json_goes_on_after_the_decision(store: Store) -> None:
    """The harness stores the history and the requests as JSON while the operator takes
    their time, then loads them in a fresh agent: the stored call is still the recorded
    one, the refund runs once, and the agent answers with it."""
    shop = Shop()
    boundary = ToolBoundary(store, shop.specs())
    first = Harness(boundary, shop)
    requests = await first.start()
    saved_history = ModelMessagesTypeAdapter.dump_json(first.messages)
    saved_requests = TypeAdapter(DeferredToolRequests).dump_json(requests)
    await decide(store, approve=True)

    later = Harness(boundary, shop)
    later.messages = ModelMessagesTypeAdapter.validate_json(saved_history)
    loaded = TypeAdapter(DeferredToolRequests).validate_json(saved_requests)
    results = await deferred_results(boundary, CTX, loaded, message_history=later.messages)
    stored = TypeAdapter(DeferredToolResults).validate_json(
        TypeAdapter(DeferredToolResults).dump_json(results)
    )
    assert json.loads(await later.resume(stored))["refund"] == [{"refunded": 125}, "success"]
    assert shop.refunds == [ORDER] and later.toolset.called == []
