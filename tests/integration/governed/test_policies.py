"""Who may approve: never the requester, and as many distinct operators as the tool asks.

The identity that requested a governed call (the harness's ``RunContext.requester``, else
the run itself) is frozen in its ApprovalRequested and never approves it. A tool may ask
for several approvals (``approvals_required``): each is its own event, from a distinct
operator; the call runs only after the last; a denial by any one ends it. An edit is one
atomic step: no waiting edit ever stands beside an approved original.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from eventstore import (
    ApprovalPending,
    RunContext,
    Store,
    ToolBoundary,
    ToolError,
    ToolResult,
    ToolSpec,
)
from eventstore.audit import replay_invocation
from eventstore.boundary.contracts import Projection, ToolCall
from eventstore.decisions import NotAwaitingApproval, RequesterCannotApprove
from eventstore.errors import InvalidArgument
from machine.codes import ErrorCode, EvidenceStatus, Stage
from machine.requests import DUPLICATE_MEMBER
from tests.support.calls import envelope

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-p"
ORDER = {"amount": 125, "to": "acct-9"}


class Refunds:
    def __init__(self) -> None:
        self.done: list[dict[str, Any]] = []

    def refund(self, arguments: dict[str, Any], call: ToolCall) -> Any:
        self.done.append(arguments)
        return {"refunded": arguments["amount"]}


def project(raw: Any, call: ToolCall) -> Projection:
    return Projection(result=raw, evidence_status=EvidenceStatus.EVIDENCE_FOUND, scope="s")


def boundary_for(store: Store, tool: Refunds, **spec: Any) -> ToolBoundary:
    return ToolBoundary(
        store,
        {
            "refund": ToolSpec(
                executor=tool.refund, projector=project, read_only=False, approval=True, **spec
            )
        },
    )


async def requested(
    store: Store, tool: Refunds, call: str = "c1", requester: str | None = "ana", **spec: Any
) -> ToolBoundary:
    if await store.run_info(RUN) is None:
        await store.open_run(RUN, deadline=timedelta(minutes=10))
    boundary = boundary_for(store, tool, **spec)
    ctx = RunContext(RUN, requester=requester)
    reply = await boundary.invoke(ctx, envelope(call, tool="refund", arguments=ORDER, run_id=RUN))
    assert isinstance(reply, ApprovalPending)
    return boundary


async def test_the_requester_never_approves_its_own_call(make_store: Any) -> None:
    """ana's agent requested the refund: ana's approval is refused and nothing is written;
    the run's own identity is refused as an approver; ana may still withdraw (deny) it."""
    store: Store = make_store()
    tool = Refunds()
    await requested(store, tool)
    record = await store.get(RUN, "c1")
    assert record is not None and record.state.requested_by == "ana"
    with pytest.raises(RequesterCannotApprove):
        await store.decide(RUN, "c1", approve=True, by="ana", reason="mine")
    with pytest.raises(InvalidArgument):
        await store.decide(RUN, "c1", approve=True, by=f"run:{RUN}", reason="self")
    assert (await store.get(RUN, "c1")).state.version == 1  # type: ignore[union-attr]
    withdrawn = await store.decide(RUN, "c1", approve=False, by="ana", reason="withdrawn")
    assert (withdrawn.outcome, withdrawn.made_now) == ("denied", True)


async def test_a_call_without_a_requester_is_the_runs_own(make_store: Any) -> None:
    """No requester named: the run's identity is frozen as the requester."""
    store: Store = make_store()
    await requested(store, Refunds(), requester=None)
    record = await store.get(RUN, "c1")
    assert record is not None and record.state.requested_by == f"run:{RUN}"


async def test_two_of_three_distinct_operators_then_it_runs_once(make_store: Any) -> None:
    """approvals_required=2: the first approval is recorded and the call still waits (a
    resume answers pending, nothing runs); the same operator again adds nothing; a
    second operator's approval completes it and the resume runs the tool once."""
    store: Store = make_store()
    tool = Refunds()
    boundary = await requested(store, tool, approvals_required=2)
    ctx = RunContext(RUN, requester="ana")
    first = await store.decide(RUN, "c1", approve=True, by="bo", reason="ok")
    assert (first.outcome, first.approvals, first.approvals_required) == ("approval_added", 1, 2)
    assert isinstance(await boundary.resume(ctx, "c1"), ApprovalPending)
    again = await store.decide(RUN, "c1", approve=True, by="bo", reason="ok again")
    assert (again.made_now, again.approvals) == (False, 1)
    second = await store.decide(RUN, "c1", approve=True, by="cy", reason="ok")
    assert (second.outcome, second.made_now, second.approvals) == ("approved", True, 2)
    reply = await boundary.resume(ctx, "c1")
    assert isinstance(reply, ToolResult) and tool.done == [ORDER]
    replay = await replay_invocation(store, RUN, "c1")
    assert replay is not None and replay.verdict.intact, replay.problems
    assert [step.event_type for step in replay.timeline][:4] == [
        "ApprovalRequested",
        "ApprovalAdded",
        "Approved",
        "Dispatched",
    ]


async def test_a_denial_by_any_one_ends_a_call_that_needs_several(make_store: Any) -> None:
    """One approval of two, then a denial: the call ends APPROVAL_DENIED, never runs."""
    store: Store = make_store()
    tool = Refunds()
    boundary = await requested(store, tool, approvals_required=2)
    await store.decide(RUN, "c1", approve=True, by="bo", reason="ok")
    denied = await store.decide(RUN, "c1", approve=False, by="cy", reason="no")
    assert denied.outcome == "denied"
    reply = await boundary.resume(RunContext(RUN, requester="ana"), "c1")
    assert isinstance(reply, ToolError) and reply.error_code is ErrorCode.APPROVAL_DENIED
    assert tool.done == []


async def test_concurrent_approvals_of_a_two_operator_call_count_each_once(
    make_store: Any,
) -> None:
    """Five operators approve at once a call that needs two: exactly two approvals are
    recorded (two events), the call is approved, and every answer says so."""
    store: Store = make_store()
    await requested(store, Refunds(), approvals_required=2)
    answers = await asyncio.gather(
        *(store.decide(RUN, "c1", approve=True, by=f"op-{n}", reason="ok") for n in range(5))
    )
    assert sum(answer.made_now for answer in answers) == 2
    record = await store.get(RUN, "c1")
    assert record is not None and record.state.stage is Stage.APPROVED
    assert record.state.version == 3


async def test_an_edit_racing_an_approval_never_leaves_two_runnable_calls(
    make_store: Any,
) -> None:
    """200 times: an edit and an approval of the same waiting call at once. Either the
    approval won (no edited call exists) or the edit did (the original denied, the edit
    waiting); never an approved original beside a waiting edit."""
    store: Store = make_store()
    tool = Refunds()
    await store.open_run(RUN, deadline=timedelta(minutes=10), budget=1000)
    boundary = boundary_for(store, tool)
    ctx = RunContext(RUN, requester="ana")
    outcomes = {"approved": 0, "edited": 0}
    for n in range(200):
        call = f"r{n}"
        await boundary.invoke(ctx, envelope(call, tool="refund", arguments=ORDER, run_id=RUN))
        edit, approval = await asyncio.gather(
            store.decisions.supersede(RUN, call, {"amount": 1}, by="ed", reason="cap"),
            store.decide(RUN, call, approve=True, by="bo", reason="ok"),
        )
        original = await store.get(RUN, call)
        edited = await store.get(RUN, f"{call}.edit1")
        assert original is not None
        if original.state.stage is Stage.APPROVED:
            assert edited is None and edit.edited is None and approval.made_now
            outcomes["approved"] += 1
        else:
            assert original.state.error_code is ErrorCode.APPROVAL_DENIED
            assert original.state.superseded_by == f"{call}.edit1"
            assert edited is not None and edited.state.stage is Stage.AWAITING_APPROVAL
            assert edit.edited == f"{call}.edit1" and not approval.made_now
            outcomes["edited"] += 1
    assert sum(outcomes.values()) == 200
    info = await store.run_info(RUN)
    assert info is not None and info.used == {"refund": 200}  # an edit spends no budget


async def test_an_edit_works_in_a_paused_run_and_waits(make_store: Any) -> None:
    """A pause holds dispatches, not decisions: the edit is recorded and waits; its
    approval runs it once after the unpause."""
    store: Store = make_store()
    tool = Refunds()
    boundary = await requested(store, tool)
    assert await store.pause_run(RUN, by="ops", reason="incident")
    edit = await store.decisions.supersede(RUN, "c1", '{"amount": 7}', by="ed", reason="cap")
    assert edit.edited == "c1.edit1"
    await store.decide(RUN, "c1.edit1", approve=True, by="bo", reason="ok")
    ctx = RunContext(RUN, requester="ana")
    paused = await boundary.resume(ctx, "c1.edit1")
    assert isinstance(paused, ToolError) and paused.error_code is ErrorCode.RUN_PAUSED
    assert await store.unpause_run(RUN, by="ops", reason="over")
    done = await boundary.resume(ctx, "c1.edit1")
    assert isinstance(done, ToolResult) and tool.done == [{"amount": 7}]
    edited = await store.get(RUN, "c1.edit1")
    assert edited is not None and edited.state.requested_by == "ana"  # the policy follows


async def test_an_edit_naming_a_member_twice_is_refused(make_store: Any) -> None:
    """'{"amount": 1, "amount": 1000}': which would be frozen is a parser's choice, so it
    is refused with the one error every door gives; nothing is written."""
    store: Store = make_store()
    await requested(store, Refunds())
    with pytest.raises(InvalidArgument) as refused:
        await store.decisions.supersede(
            RUN, "c1", '{"amount": 1, "amount": 1000}', by="ed", reason="cap"
        )
    assert DUPLICATE_MEMBER in str(refused.value)
    record = await store.get(RUN, "c1")
    assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL
    assert await store.get(RUN, "c1.edit1") is None


async def test_an_edit_after_the_approval_changes_nothing(make_store: Any) -> None:
    """The original was approved first: the edit writes nothing and says what was decided."""
    store: Store = make_store()
    await requested(store, Refunds())
    await store.decide(RUN, "c1", approve=True, by="bo", reason="ok")
    edit = await store.decisions.supersede(RUN, "c1", {"amount": 1}, by="ed", reason="cap")
    assert edit.edited is None and edit.original.outcome == "approved"
    assert await store.get(RUN, "c1.edit1") is None
    with pytest.raises(NotAwaitingApproval):
        await store.decide(RUN, "c1.edit1", approve=True, by="bo", reason="ok")
