"""Governed tools under the OpenAI Agents SDK: canon's ``needs_approval`` interrupts the
run, :func:`apply_decisions` resumes each call in canon (an approved one runs exactly once
there) and carries the outcome into the SDK's ``RunState``, and the SDK's own resume
hands the model what ran; a pause keeps a call pending. A real Runner and the SDK's own
Responses model over a scripted endpoint, real Redis."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from agents import (
    Agent,
    FunctionTool,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    RunResult,
    RunState,
    Tool,
    UserError,
    set_tracing_disabled,
)

from canon.integrations.openai import ERROR_PREFIX
from canon.integrations.openai_agents import (
    apply_decisions,
    apply_decisions_sync,
    function_tool,
    function_tools,
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
from eventstore.errors import InvalidArgument
from eventstore.writer import now_ms
from machine.codes import SAFE_MESSAGES, ErrorCode, EvidenceStatus, Stage, Status
from tests.support.calls import RUN, open_run
from tests.support.openai_scripted import (
    FINAL_RESPONSE_ID,
    ScriptedOpenAI,
    in_thread,
    response,
    response_function_call,
    response_message,
)
from tests.support.waiting import wait_for

MODEL = "gpt-4.1"
CTX = RunContext(RUN)
#: The Runner's context: a mapping, so that a saved RunState keeps the run id.
CONTEXT = {"run_id": RUN}
RUN_CONFIG = RunConfig(tracing_disabled=True)
REFUND_SCHEMA = {
    "type": "object",
    "properties": {"amount": {"type": "integer"}, "to": {"type": "string"}},
    "required": ["amount", "to"],
}
ORDER = {"amount": 125, "to": "acct-9"}
CALL_ID = "call_R3fUnd9Xy7Tn4Bm1Cd6Wq2Lk"
REFUND_CALL = response_function_call(
    "fc_67ccd2c3b5c48190a1c6b6e1a7f43c1f0bb6a6b452d3795b", CALL_ID, "refund", json.dumps(ORDER)
)


class Refunds:
    """A side-effecting tool that counts what it did, so a test sees it ran once."""

    def __init__(self) -> None:
        self.done: list[dict[str, Any]] = []

    def refund(self, arguments: dict[str, Any], call: ToolCall) -> Any:
        self.done.append(arguments)
        return {"refunded": arguments.get("amount")}

    def specs(self, **spec: Any) -> dict[str, ToolSpec]:
        spec.setdefault("approval", True)
        return {
            "refund": ToolSpec(
                executor=self.refund,
                projector=project,
                read_only=False,
                description="Refund an order.",
                input_schema=REFUND_SCHEMA,
                **spec,
            )
        }


def project(raw: Any, call: ToolCall) -> Projection:
    return Projection(result=raw, evidence_status=EvidenceStatus.EVIDENCE_FOUND, scope="refunds")


_endpoints: list[ScriptedOpenAI] = []


def scripted(*turns: list[dict[str, Any]]) -> ScriptedOpenAI:
    """A model that asks for each turn's calls, then answers "Done." (clients closed after)."""
    endpoint = ScriptedOpenAI(
        *(response(calls) for calls in turns),
        response([response_message("msg_final", "Done.")], FINAL_RESPONSE_ID),
    )
    _endpoints.append(endpoint)
    return endpoint


@pytest.fixture(autouse=True)
async def close_endpoints() -> Any:
    yield
    while _endpoints:
        await _endpoints.pop().aclose()


@pytest.fixture(autouse=True, scope="module")
def no_tracing() -> Iterator[None]:
    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)


def agent_on(endpoint: ScriptedOpenAI, tools: list[FunctionTool]) -> Agent[Any]:
    """An agent whose model is the SDK's Responses model over the scripted endpoint."""
    model = OpenAIResponsesModel(model=MODEL, openai_client=endpoint.async_client())
    listed: list[Tool] = [*tools]
    return Agent(name="refunds", instructions="Refund when asked.", model=model, tools=listed)


def refund_agent(endpoint: ScriptedOpenAI, boundary: ToolBoundary | SyncBoundary) -> Agent[Any]:
    return agent_on(endpoint, function_tools(boundary, boundary.tools))


def outputs(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The function_call_output items a request sends back to the model."""
    return [item for item in request["input"] if item.get("type") == "function_call_output"]


def error_text(code: ErrorCode) -> str:
    """Canon's error as this adapter shows it to the model."""
    safe = {"error_code": code.value, "message": SAFE_MESSAGES[code]}
    return ERROR_PREFIX + json.dumps(safe, separators=(",", ":"))


async def interrupted(agent: Agent[Any], store: Store) -> RunResult:
    """Run until canon's approval interrupts; check nothing ran and the call waits."""
    result = await Runner.run(agent, "Refund order 9.", context=CONTEXT, run_config=RUN_CONFIG)
    assert [item.call_id for item in result.interruptions] == [CALL_ID]
    record = await store.get(RUN, CALL_ID)
    assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL
    return result


async def saved(result: RunResult, agent: Agent[Any]) -> RunState[Any, Any]:
    """The run's state as a harness keeps it between the interruption and the resume (the
    run id in a mapping context, which the SDK's JSON keeps)."""
    return await RunState.from_string(agent, result.to_state().to_string())


async def decide(store: Store, *, approve: bool) -> None:
    decision = await store.decide(RUN, CALL_ID, approve=approve, by="ops@example", reason="ok")
    assert decision.made_now


async def test_a_governed_call_interrupts_the_run_recorded_once_and_waiting(
    store: Store,
) -> None:
    """The SDK interrupts on canon's approval; the call is recorded once, frozen; resuming
    before any decision interrupts again on the same waiting call; nothing ran."""
    await open_run(store)
    tool = Refunds()
    boundary = ToolBoundary(store, tool.specs())
    endpoint = scripted([REFUND_CALL])
    agent = refund_agent(endpoint, boundary)
    first = await interrupted(agent, store)
    record = await store.get(RUN, CALL_ID)
    assert record is not None
    approval_id = record.state.approval_id
    state = await saved(first, agent)
    applied = await apply_decisions(state, store, run=CTX)
    assert [item.call_id for item in applied.pending] == [CALL_ID]
    assert applied.approved == applied.rejected == applied.others == []
    again = await Runner.run(agent, state, run_config=RUN_CONFIG)
    assert [item.call_id for item in again.interruptions] == [CALL_ID]
    record = await store.get(RUN, CALL_ID)
    assert record is not None and record.state.approval_id == approval_id
    events = [type(stored.event).__name__ for stored in await store.events(RUN, CALL_ID)]
    assert events == ["ApprovalRequested"]
    assert tool.done == [] and len(endpoint.requests) == 1


async def test_an_approved_call_runs_once_and_the_sdks_resume_hands_over_its_result(
    store: Store,
) -> None:
    """Approved in canon and applied to the saved state: canon runs the tool once, with
    the frozen request, before the SDK's state approves it; resumed by the SDK, the
    model reads that result and nothing runs again."""
    await open_run(store)
    tool = Refunds()
    boundary = ToolBoundary(store, tool.specs())
    endpoint = scripted([REFUND_CALL])
    agent = refund_agent(endpoint, boundary)
    state = await saved(await interrupted(agent, store), agent)
    await decide(store, approve=True)
    applied = await apply_decisions(state, store, run=CTX)
    assert [item.call_id for item in applied.approved] == [CALL_ID]
    assert tool.done == [ORDER]  # canon dispatched it before the SDK's state says approved
    result = await Runner.run(agent, state, run_config=RUN_CONFIG)
    assert result.final_output == "Done."
    [output] = outputs(endpoint.requests[1])
    assert output["call_id"] == CALL_ID and json.loads(output["output"]) == {"refunded": 125}
    assert tool.done == [ORDER]
    record = await store.get(RUN, CALL_ID)
    assert record is not None and record.state.status is Status.READY
    assert record.state.decided_by == "ops@example"
    # The same call reaching canon again (a retried resume) answers its one run.
    await boundary.resume(CTX, CALL_ID)
    assert tool.done == [ORDER]


async def test_a_denied_call_reaches_the_model_as_the_sdks_rejection(store: Store) -> None:
    """Denied in canon: the SDK rejects the call with canon's denial as the text the model
    reads (an error, never a result); the tool never runs."""
    await open_run(store)
    tool = Refunds()
    endpoint = scripted([REFUND_CALL])
    agent = refund_agent(endpoint, ToolBoundary(store, tool.specs()))
    state = await saved(await interrupted(agent, store), agent)
    await decide(store, approve=False)
    applied = await apply_decisions(state, store, run=CTX)
    assert [item.call_id for item in applied.rejected] == [CALL_ID]
    result = await Runner.run(agent, state, run_config=RUN_CONFIG)
    assert result.final_output == "Done."
    [output] = outputs(endpoint.requests[1])
    assert output["call_id"] == CALL_ID
    assert output["output"] == error_text(ErrorCode.APPROVAL_DENIED)
    assert tool.done == []
    record = await store.get(RUN, CALL_ID)
    assert record is not None and record.state.error_code is ErrorCode.APPROVAL_DENIED


@pytest.mark.parametrize("approved", [False, True], ids=["undecided", "approved"])
async def test_an_expired_approval_is_recorded_and_rejected(store: Store, approved: bool) -> None:
    """Past its approval's expiry (undecided, or approved but not yet dispatched):
    applying the decisions records the expiry and rejects the call with APPROVAL_EXPIRED;
    the tool never runs."""
    await open_run(store)
    tool = Refunds()
    boundary = ToolBoundary(store, tool.specs(approval_timeout=timedelta(seconds=1)))
    endpoint = scripted([REFUND_CALL])
    agent = refund_agent(endpoint, boundary)
    state = await saved(await interrupted(agent, store), agent)
    if approved:
        await decide(store, approve=True)
    record = await store.get(RUN, CALL_ID)
    assert record is not None and record.state.approval_expires_at_ms is not None
    due = record.state.approval_expires_at_ms
    await wait_for(lambda: now_ms() > due)
    applied = await apply_decisions(state, store, run=CTX)
    assert [item.call_id for item in applied.rejected] == [CALL_ID]
    record = await store.get(RUN, CALL_ID)
    assert record is not None and record.state.error_code is ErrorCode.APPROVAL_EXPIRED
    await Runner.run(agent, state, run_config=RUN_CONFIG)
    [output] = outputs(endpoint.requests[1])
    assert output["output"] == error_text(ErrorCode.APPROVAL_EXPIRED)
    assert tool.done == []


async def test_a_resent_turn_of_a_call_that_ran_answers_its_result(store: Store) -> None:
    """The same model turn in a new Runner.run of the same canon run (a harness retry):
    canon answers the call's one recorded result; no interruption, nothing runs again."""
    await open_run(store)
    tool = Refunds()
    boundary = ToolBoundary(store, tool.specs())
    endpoint = scripted([REFUND_CALL])
    agent = refund_agent(endpoint, boundary)
    state = await saved(await interrupted(agent, store), agent)
    await decide(store, approve=True)
    await apply_decisions(state, store, run=CTX)
    await Runner.run(agent, state, run_config=RUN_CONFIG)
    retry = scripted([REFUND_CALL])
    result = await Runner.run(
        refund_agent(retry, boundary), "Refund order 9.", context=CONTEXT, run_config=RUN_CONFIG
    )
    assert result.interruptions == []
    [output] = outputs(retry.requests[1])
    assert json.loads(output["output"]) == {"refunded": 125}
    assert tool.done == [ORDER]


async def test_the_sdks_own_approve_dispatches_nothing(store: Store) -> None:
    """``state.approve`` without canon's approval: the tool's call reaches canon, which
    answers that the call waits (the pending payload, not an error) and runs nothing."""
    await open_run(store)
    tool = Refunds()
    endpoint = scripted([REFUND_CALL])
    agent = refund_agent(endpoint, ToolBoundary(store, tool.specs()))
    first = await interrupted(agent, store)
    state = first.to_state()
    state.approve(first.interruptions[0])
    await Runner.run(agent, state, run_config=RUN_CONFIG)
    [output] = outputs(endpoint.requests[1])
    assert not output["output"].startswith(ERROR_PREFIX)
    shown = json.loads(output["output"])
    assert shown["status"] == "awaiting_approval" and "has not run" in shown["message"]
    assert tool.done == []
    record = await store.get(RUN, CALL_ID)
    assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL
    assert shown["approval_id"] == record.state.approval_id


async def test_always_approve_is_refused_for_a_governed_tool(store: Store) -> None:
    """canon approves one call at a time: an SDK approval of every call of a governed tool
    ends the run with a UserError that says so; nothing runs."""
    await open_run(store)
    tool = Refunds()
    endpoint = scripted([REFUND_CALL])
    agent = refund_agent(endpoint, ToolBoundary(store, tool.specs()))
    first = await interrupted(agent, store)
    await decide(store, approve=True)
    state = first.to_state()
    state.approve(first.interruptions[0], always_approve=True)
    with pytest.raises(
        UserError, match=r"canon: the governed tool 'refund' was approved with always_approve"
    ):
        await Runner.run(agent, state, run_config=RUN_CONFIG)
    assert tool.done == []


async def test_needs_approval_of_your_own_is_refused_for_a_governed_tool(store: Store) -> None:
    """canon owns a governed tool's approvals: passing needs_approval is a clear error when
    the tool is built; a tool canon does not govern keeps the SDK's option."""
    tool = Refunds()
    specs = {**tool.specs(), "lookup": ToolSpec(executor=tool.refund, projector=project)}
    boundary = ToolBoundary(store, specs)
    with pytest.raises(InvalidArgument, match="governed"):
        function_tool(
            boundary, "refund", description="x", params_json_schema={}, needs_approval=True
        )
    with pytest.raises(InvalidArgument, match="governed"):
        function_tools(boundary, specs, needs_approval=True)
    [lookup] = function_tools(boundary, {"lookup": specs["lookup"]}, needs_approval=True)
    assert lookup.needs_approval is True


async def test_the_policy_lets_small_calls_run_without_an_interruption(store: Store) -> None:
    """A policy decides per call: in one turn the small refund runs at once (once) and only
    the large one interrupts; approved, it runs once on the resume."""
    await open_run(store)
    tool = Refunds()

    def large(arguments: dict[str, Any], call: ToolCall) -> bool:
        return bool(arguments["amount"] >= 100)

    small_call = response_function_call(
        "fc_small", "call_Sm4llRefundXy7Tn4Bm1Cd6", "refund", '{"amount": 5, "to": "acct-1"}'
    )
    endpoint = scripted([small_call, REFUND_CALL])
    agent = refund_agent(endpoint, ToolBoundary(store, tool.specs(approval=large)))
    first = await interrupted(agent, store)
    assert tool.done == [{"amount": 5, "to": "acct-1"}]
    small = await store.get(RUN, "call_Sm4llRefundXy7Tn4Bm1Cd6")
    assert small is not None and small.state.approval_id is None
    assert small.state.status is Status.READY
    state = first.to_state()
    await decide(store, approve=True)
    await apply_decisions(state, store, run=CTX)
    await Runner.run(agent, state, run_config=RUN_CONFIG)
    small_output, large_output = outputs(endpoint.requests[1])
    assert json.loads(small_output["output"]) == {"refunded": 5}
    assert json.loads(large_output["output"]) == {"refunded": 125}
    assert tool.done == [{"amount": 5, "to": "acct-1"}, ORDER]


async def test_a_call_resumed_while_pending_interrupts_again_until_approved(
    store: Store,
) -> None:
    """Resumed while canon still waits, the run stops on the same call again (the model is
    not asked); approved later and applied to that state, the call runs once."""
    await open_run(store)
    tool = Refunds()
    endpoint = scripted([REFUND_CALL])
    agent = refund_agent(endpoint, ToolBoundary(store, tool.specs()))
    state = await saved(await interrupted(agent, store), agent)
    assert len((await apply_decisions(state, store, run=CTX)).pending) == 1
    again = await Runner.run(agent, state, run_config=RUN_CONFIG)
    assert [item.call_id for item in again.interruptions] == [CALL_ID]
    assert len(endpoint.requests) == 1 and tool.done == []
    await decide(store, approve=True)
    state = await saved(again, agent)
    assert len((await apply_decisions(state, store, run=CTX)).approved) == 1
    result = await Runner.run(agent, state, run_config=RUN_CONFIG)
    assert result.final_output == "Done."
    [output] = outputs(endpoint.requests[1])
    assert json.loads(output["output"]) == {"refunded": 125}
    assert tool.done == [ORDER]


async def test_a_refusal_when_asked_is_the_model_s_error_and_logged_once(store: Store) -> None:
    """A paused run refuses the governed call when the SDK asks: no interruption, the model
    reads RUN_PAUSED, and the run's refusal log has it once."""
    await open_run(store)
    await store.pause_run(RUN, by="ops@example", reason="incident")
    tool = Refunds()
    endpoint = scripted([REFUND_CALL])
    agent = refund_agent(endpoint, ToolBoundary(store, tool.specs()))
    result = await Runner.run(agent, "Refund order 9.", context=CTX, run_config=RUN_CONFIG)
    assert result.interruptions == []
    [output] = outputs(endpoint.requests[1])
    assert output["output"] == error_text(ErrorCode.RUN_PAUSED)
    assert [refusal.code for refusal in await store.refusals(RUN)] == [ErrorCode.RUN_PAUSED]
    assert tool.done == []


async def test_a_call_without_arguments_is_recorded_when_decisions_are_applied(
    store: Store,
) -> None:
    """The SDK interrupts a call whose arguments it cannot read (``""``) without asking
    canon; applying the decisions records it waiting, and once approved it runs once."""
    await open_run(store)
    tool = Refunds()
    specs = {
        "reset": ToolSpec(executor=tool.refund, projector=project, read_only=False, approval=True)
    }
    call = response_function_call("fc_reset", "call_R3s3tNoArgsXy7Tn4Bm1C", "reset", "")
    endpoint = scripted([call])
    agent = refund_agent(endpoint, ToolBoundary(store, specs))
    first = await Runner.run(agent, "Reset.", context=CTX, run_config=RUN_CONFIG)
    [item] = first.interruptions
    assert await store.get(RUN, "call_R3s3tNoArgsXy7Tn4Bm1C") is None  # canon was not asked
    state = first.to_state()
    applied = await apply_decisions(state, store, run=CTX)
    assert [waiting.call_id for waiting in applied.pending] == [item.call_id]
    record = await store.get(RUN, "call_R3s3tNoArgsXy7Tn4Bm1C")
    assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL
    await store.decide(RUN, "call_R3s3tNoArgsXy7Tn4Bm1C", approve=True, by="ops", reason="ok")
    applied = await apply_decisions(state, store, run=CTX)
    assert len(applied.approved) == 1
    await Runner.run(agent, state, run_config=RUN_CONFIG)
    [output] = outputs(endpoint.requests[1])
    assert json.loads(output["output"]) == {"refunded": None}
    assert tool.done == [{}]


async def test_interruptions_canon_does_not_govern_are_left_alone(store: Store) -> None:
    """An interruption from the SDK's own needs_approval on a tool canon does not govern is
    reported as another's and left undecided."""
    await open_run(store)
    tool = Refunds()
    specs = {"lookup": ToolSpec(executor=tool.refund, projector=project)}
    boundary = ToolBoundary(store, specs)
    call = response_function_call("fc_l", "call_L00kupXy7Tn4Bm1Cd6Wq2", "lookup", "{}")
    endpoint = scripted([call])
    agent = agent_on(endpoint, function_tools(boundary, specs, needs_approval=True))
    first = await Runner.run(agent, "Look up.", context=CTX, run_config=RUN_CONFIG)
    applied = await apply_decisions(first.to_state(), store, run=CTX)
    assert [item.call_id for item in applied.others] == ["call_L00kupXy7Tn4Bm1Cd6Wq2"]
    assert applied.approved == applied.rejected == applied.pending == []


async def test_apply_decisions_needs_the_run(store: Store) -> None:
    """Without ``run=`` (on the tools or here) the calls' run is unknown: a clear error."""
    await open_run(store)
    endpoint = scripted([REFUND_CALL])
    agent = refund_agent(endpoint, ToolBoundary(store, Refunds().specs()))
    first = await interrupted(agent, store)
    with pytest.raises(InvalidArgument, match="run="):
        await apply_decisions(first.to_state(), store)


@pytest.fixture
def sync_store(redis_url: str, namespace: str) -> Iterator[SyncStore]:
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        yield store


def test_runner_run_sync_with_apply_decisions_sync(sync_store: SyncStore) -> None:
    """``Runner.run_sync`` over a SyncBoundary: interrupted, approved in canon, applied with
    apply_decisions_sync, resumed: the tool runs once."""
    tool = Refunds()
    boundary = SyncBoundary(sync_store, tool.specs())
    endpoint = scripted([REFUND_CALL])
    agent = refund_agent(endpoint, boundary)
    first = in_thread(
        lambda: Runner.run_sync(agent, "Refund order 9.", context=CTX, run_config=RUN_CONFIG)
    )
    assert [item.call_id for item in first.interruptions] == [CALL_ID]
    state = first.to_state()
    assert len(apply_decisions_sync(state, sync_store, run=CTX).pending) == 1
    sync_store.decide(RUN, CALL_ID, approve=True, by="ops@example", reason="ok")
    assert len(apply_decisions_sync(state, sync_store, run=CTX).approved) == 1
    result = in_thread(lambda: Runner.run_sync(agent, state, run_config=RUN_CONFIG))
    assert result.final_output == "Done."
    assert tool.done == [ORDER]


async def test_a_sync_store_serves_apply_decisions_under_runner_run(
    sync_store: SyncStore,
) -> None:
    """A SyncBoundary under ``await Runner.run``: apply_decisions takes its SyncStore."""
    tool = Refunds()
    endpoint = scripted([REFUND_CALL])
    agent = refund_agent(endpoint, SyncBoundary(sync_store, tool.specs()))
    first = await Runner.run(agent, "Refund order 9.", context=CTX, run_config=RUN_CONFIG)
    state = first.to_state()
    sync_store.decide(RUN, CALL_ID, approve=False, by="ops@example", reason="no")
    applied = await apply_decisions(state, sync_store, run=CTX)
    assert len(applied.rejected) == 1
    await Runner.run(agent, state, run_config=RUN_CONFIG)
    [output] = outputs(endpoint.requests[1])
    assert output["output"] == error_text(ErrorCode.APPROVAL_DENIED)
    assert tool.done == []


async def test_a_pause_holds_an_approved_call_until_the_unpause(store: Store) -> None:
    """Approved, then the run paused: applying the decisions leaves the call pending (the
    SDK's state is not approved) and resuming the state interrupts on it again; nothing
    ran and the model was not asked. Unpaused, applied again and resumed: the tool runs
    once and the model reads its result."""
    await open_run(store)
    tool = Refunds()
    endpoint = scripted([REFUND_CALL])
    agent = refund_agent(endpoint, ToolBoundary(store, tool.specs()))
    state = await saved(await interrupted(agent, store), agent)
    await decide(store, approve=True)
    await store.pause_run(RUN, by="ops@example", reason="incident")
    applied = await apply_decisions(state, store, run=CTX)
    assert [item.call_id for item in applied.pending] == [CALL_ID]
    assert applied.approved == applied.rejected == []
    again = await Runner.run(agent, state, run_config=RUN_CONFIG)
    assert [item.call_id for item in again.interruptions] == [CALL_ID]
    assert tool.done == [] and len(endpoint.requests) == 1
    record = await store.get(RUN, CALL_ID)
    assert record is not None and record.state.stage is Stage.APPROVED
    await store.unpause_run(RUN, by="ops@example", reason="resolved")
    state = await saved(again, agent)
    assert [item.call_id for item in (await apply_decisions(state, store, run=CTX)).approved] == [
        CALL_ID
    ]
    result = await Runner.run(agent, state, run_config=RUN_CONFIG)
    assert result.final_output == "Done."
    [output] = outputs(endpoint.requests[1])
    assert output["call_id"] == CALL_ID and json.loads(output["output"]) == {"refunded": 125}
    assert tool.done == [ORDER]


async def test_a_pause_after_the_run_gives_the_model_the_result_not_run_paused(
    store: Store,
) -> None:
    """Applied (canon ran the call), then the run paused before the SDK resumed: the
    tool's call answers the recorded result of that one run, never RUN_PAUSED."""
    await open_run(store)
    tool = Refunds()
    endpoint = scripted([REFUND_CALL])
    agent = refund_agent(endpoint, ToolBoundary(store, tool.specs()))
    state = await saved(await interrupted(agent, store), agent)
    await decide(store, approve=True)
    assert len((await apply_decisions(state, store, run=CTX)).approved) == 1
    await store.pause_run(RUN, by="ops@example", reason="incident")
    await Runner.run(agent, state, run_config=RUN_CONFIG)
    [output] = outputs(endpoint.requests[1])
    assert json.loads(output["output"]) == {"refunded": 125}
    assert tool.done == [ORDER]


def test_a_pause_holds_a_call_under_runner_run_sync(sync_store: SyncStore) -> None:
    """The same round trip with ``Runner.run_sync`` over a SyncBoundary and
    apply_decisions_sync: paused, the call stays pending; unpaused, it runs once."""
    tool = Refunds()
    endpoint = scripted([REFUND_CALL])
    agent = refund_agent(endpoint, SyncBoundary(sync_store, tool.specs()))
    first = in_thread(
        lambda: Runner.run_sync(agent, "Refund order 9.", context=CTX, run_config=RUN_CONFIG)
    )
    state = first.to_state()
    sync_store.decide(RUN, CALL_ID, approve=True, by="ops@example", reason="ok")
    sync_store.pause_run(RUN, by="ops@example", reason="incident")
    assert len(apply_decisions_sync(state, sync_store, run=CTX).pending) == 1
    assert tool.done == []
    sync_store.unpause_run(RUN, by="ops@example", reason="resolved")
    assert len(apply_decisions_sync(state, sync_store, run=CTX).approved) == 1
    result = in_thread(lambda: Runner.run_sync(agent, state, run_config=RUN_CONFIG))
    assert result.final_output == "Done."
    assert tool.done == [ORDER]
