"""What the operator doors share: decisions and settlements, by the operator they name.

The console and the HTTP API (and the CLI, through the same store call) end in
:meth:`eventstore.decisions.Decisions.decide` with a
:class:`~eventstore.decisions.DecisionRequest` whose ``by`` is the operator the door
authenticated (a login session's, a Bearer token's): never a name the form or the body
gives. This module names the calls, keeps a batch to exactly the calls listed, under one
decision id, and says for each call what happened in terms every door shows: decided
now, already decided (what, by whom), the requester refused, not awaiting a decision, or
no such call. Each decision made is logged (``approval_decided``: ids, outcome, operator,
which door), never its reason or a payload. A settlement of a call whose process died
(:func:`settle_invocation`) is told the same way, and logged ``call_settled`` (never its
evidence).
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from eventstore.decisions import (
    MAX_REASON_CHARS,
    Decision,
    DecisionRequest,
    NotAwaitingApproval,
    RequesterCannotApprove,
    checked_text,
)
from eventstore.errors import Refused
from eventstore.logs import get_logger
from eventstore.settlements import (
    CallStillRunning,
    NotInFlight,
    NotSettledNotExecuted,
    RawResponseRecorded,
    Settlement,
    SettlementRequest,
)
from eventstore.store import Store
from machine.ids import invocation_id

log = get_logger("canon.decisions")

#: The most calls one batch decision may list (the approvals page lists at most as many).
MAX_BATCH_CALLS: Final = 100
#: Which door a decision came through, as logged.
Door = Literal["http", "console"]
#: Why a listed call got no decision of this request's.
Problem = Literal["invocation_not_found", "not_awaiting_approval", "requester_cannot_approve"]


class CallDecision(msgspec.Struct, frozen=True, kw_only=True):
    """What one listed call holds after a decision was asked for it.

    Attributes:
        run_id: the call's run.
        tool_call_id: the call, as the harness named it (None when the run has no call of
            the invocation id given).
        invocation_id: the call's invocation id.
        decision: the decision it holds (``made_now`` says whether it is this one), or
            None when ``problem`` says why it holds none.
        problem: invocation_not_found (no such call, or it expired),
            not_awaiting_approval (a call that was never a governed call waiting), or
            requester_cannot_approve (the operator requested the call).
        stage: where a not_awaiting_approval call stands (READY, ERROR ...).

    """

    run_id: str
    tool_call_id: str | None
    invocation_id: str
    decision: Decision | None = None
    problem: Problem | None = None
    stage: str | None = None


def checked_reason(value: str) -> str:
    """A decision's reason when it is printable text of 1 to 1000 characters.

    Raises:
        InvalidArgument: it is not.

    """
    return checked_text(value, MAX_REASON_CHARS, "the reason")


async def decide_call(
    store: Store, run_id: str, tool_call_id: str, request: DecisionRequest, door: Door
) -> CallDecision:
    """Decide one call named by its run and tool call id (both already checked).

    ``request.by`` is the operator ``door`` authenticated.

    Raises:
        InvalidArgument: ``by`` or ``reason`` is empty, not printable or too long.
        StoreUnavailable: Redis failed or timed out.

    """
    inv_id = invocation_id(run_id, tool_call_id)
    found = CallDecision(run_id=run_id, tool_call_id=tool_call_id, invocation_id=inv_id)
    try:
        decision = await store.decisions.decide(run_id, tool_call_id, request)
    except RequesterCannotApprove:
        log.warning("decision_refused", reason="requester", run_id=run_id, door=door)
        return msgspec.structs.replace(found, problem="requester_cannot_approve")
    except NotAwaitingApproval as exc:
        if exc.stage is None:
            return msgspec.structs.replace(found, problem="invocation_not_found")
        return msgspec.structs.replace(
            found, problem="not_awaiting_approval", stage=exc.stage.value
        )
    if decision.made_now:
        log.info(
            "approval_decided",
            run_id=run_id,
            invocation_id=inv_id,
            outcome=decision.outcome,
            decision_id=decision.decision_id,
            operator=request.by,
            door=door,
        )
    return msgspec.structs.replace(found, decision=decision)


async def decide_invocation(
    store: Store, run_id: str, inv_id: str, request: DecisionRequest, door: Door
) -> CallDecision:
    """Decide one call named by its run and invocation id (both already checked).

    The run's own index of its invocations names the call: another run's invocation is
    not found, as for the receipt route. ``request.by`` is the operator ``door``
    authenticated.

    Raises:
        InvalidArgument: ``by`` or ``reason`` is empty, not printable or too long.
        StoreUnavailable: Redis failed or timed out.

    """
    tool_call_id = await store.runs.tool_call_id_of(run_id, inv_id)
    if tool_call_id is None:
        return CallDecision(
            run_id=run_id, tool_call_id=None, invocation_id=inv_id, problem="invocation_not_found"
        )
    return await decide_call(store, run_id, tool_call_id, request, door)


def notice(result: CallDecision, approve: bool) -> str:
    """One line saying what happened to a call, as the console shows it after a decision."""
    name = result.tool_call_id if result.tool_call_id is not None else result.invocation_id
    call = f"{name} (run {result.run_id})"
    decision = result.decision
    if decision is None:
        if result.problem == "not_awaiting_approval":
            return f"{call}: not awaiting approval (it is {result.stage}); nothing decided."
        if result.problem == "requester_cannot_approve":
            return f"{call}: you requested this call, so you cannot approve it; nothing decided."
        return f"{call}: no such call (it may have expired); nothing decided."
    if decision.made_now and decision.outcome == "approval_added":
        return (
            f"{call}: approval {decision.approvals} of {decision.approvals_required} "
            f"recorded, by {decision.decided_by}; it waits for the others."
        )
    if decision.made_now:
        return f"{call}: {decision.outcome} now by {decision.decided_by}."
    if decision.outcome == "approval_added":
        return (
            f"{call}: you already approved it ({decision.approvals} of "
            f"{decision.approvals_required}); it waits for the others."
        )
    asked = "approved" if approve else "denied"
    if decision.outcome == "expired":
        return f"{call}: not {asked} here: its approval had expired undecided."
    return f"{call}: not {asked} here: it was already {decision.outcome} by {decision.decided_by}."


#: Why a call got no settlement of this request's, and what each door says of it.
SettlementProblem = Literal[
    "invocation_not_found",
    "not_in_flight",
    "call_still_running",
    "raw_response_recorded",
    "not_settled_not_executed",
    "request_again_refused",
]
SETTLEMENT_PROBLEMS: Final[dict[SettlementProblem, str]] = {
    "invocation_not_found": "No call with this id in this run (it may have expired).",
    "not_in_flight": "The call is not in flight: nothing to settle.",
    "call_still_running": "The call is still running: its process renews its lease.",
    "raw_response_recorded": "Its raw response is recorded, so it ran: settle it as executed.",
    "not_settled_not_executed": "Only a call settled as not executed is requested again.",
    "request_again_refused": "The run refused the call requested again.",
}


class CallSettlement(msgspec.Struct, frozen=True, kw_only=True):
    """What one call holds after a settlement was asked for it.

    Attributes:
        run_id: the call's run.
        tool_call_id: the call (None when the run has no call of the invocation id).
        invocation_id: the call's invocation id.
        settlement: how it is settled (``made_now`` says whether by this request), or None
            when ``problem`` says why it is not.
        problem: why nothing was settled (:data:`SETTLEMENT_PROBLEMS`).
        stage: where a call not in flight stands.
        lease_until_ms: when the lease of a call still running ends.
        refused_code: the code the run refused a call requested again with.

    """

    run_id: str
    tool_call_id: str | None
    invocation_id: str
    settlement: Settlement | None = None
    problem: SettlementProblem | None = None
    stage: str | None = None
    lease_until_ms: int | None = None
    refused_code: str | None = None


async def settle_invocation(
    store: Store,
    run_id: str,
    inv_id: str,
    request: SettlementRequest,
    request_again: bool,
    door: Door,
) -> CallSettlement:
    """Settle one call named by its run and invocation id, as ``request.by`` (checked).

    ``request_again``: record a call settled as not executed again as a new governed call
    (``<call>.again<n>``) that waits for its own approval.

    Raises:
        InvalidArgument: ``by`` or the evidence is empty, not printable or too long.
        StoreUnavailable: Redis failed or timed out.

    """
    found = CallSettlement(run_id=run_id, tool_call_id=None, invocation_id=inv_id)
    tool_call_id = await store.runs.tool_call_id_of(run_id, inv_id)
    if tool_call_id is None:
        return msgspec.structs.replace(found, problem="invocation_not_found")
    found = msgspec.structs.replace(found, tool_call_id=tool_call_id)
    try:
        done = await store.settlements.settle(run_id, tool_call_id, request)
        if request_again and done.settled_as == "not_executed":
            again = await store.settlements.request_again(run_id, tool_call_id, by=request.by)
            done = msgspec.structs.replace(done, requested_again=again.requested_again)
    except NotInFlight as exc:
        if exc.stage is None:
            return msgspec.structs.replace(found, problem="invocation_not_found")
        return msgspec.structs.replace(found, problem="not_in_flight", stage=exc.stage.value)
    except CallStillRunning as running:
        return msgspec.structs.replace(
            found, problem="call_still_running", lease_until_ms=running.lease_until_ms
        )
    except RawResponseRecorded:
        return msgspec.structs.replace(found, problem="raw_response_recorded")
    except NotSettledNotExecuted:
        return msgspec.structs.replace(found, problem="not_settled_not_executed")
    except Refused as refused:
        return msgspec.structs.replace(
            found, problem="request_again_refused", refused_code=refused.code
        )
    if done.made_now:
        log.info(
            "call_settled",
            run_id=run_id,
            invocation_id=inv_id,
            settled_as=done.settled_as,
            operator=request.by,
            door=door,
        )
    return msgspec.structs.replace(found, settlement=done)


async def again_invocation(
    store: Store, run_id: str, inv_id: str, by: str, door: Door
) -> CallSettlement:
    """Request a call settled as not executed again, as ``by`` (the operator ``door`` named).

    Raises:
        InvalidArgument: ``by`` is not a name an operator may have.
        StoreUnavailable: Redis failed or timed out.

    """
    found = CallSettlement(run_id=run_id, tool_call_id=None, invocation_id=inv_id)
    tool_call_id = await store.runs.tool_call_id_of(run_id, inv_id)
    if tool_call_id is None:
        return msgspec.structs.replace(found, problem="invocation_not_found")
    found = msgspec.structs.replace(found, tool_call_id=tool_call_id)
    try:
        done = await store.settlements.request_again(run_id, tool_call_id, by=by)
    except NotSettledNotExecuted:
        return msgspec.structs.replace(found, problem="not_settled_not_executed")
    except Refused as refused:
        return msgspec.structs.replace(
            found, problem="request_again_refused", refused_code=refused.code
        )
    if done.made_now:
        log.info(
            "call_requested_again", run_id=run_id, invocation_id=inv_id, operator=by, door=door
        )
    return msgspec.structs.replace(found, settlement=done)


def settlement_notice(result: CallSettlement) -> str:
    """One line saying what happened to a call, as the console shows it after a settlement."""
    name = result.tool_call_id if result.tool_call_id is not None else result.invocation_id
    call = f"{name} (run {result.run_id})"
    done = result.settlement
    if done is None:
        assert result.problem is not None
        return f"{call}: {SETTLEMENT_PROBLEMS[result.problem]} Nothing was settled."
    how = done.settled_as.replace("_", " ")
    if done.requested_again and not done.made_now and done.settled_by is not None:
        # Asked to request again: the settlement itself was made before.
        line = f"{call}: settled as {how} by {done.settled_by}."
    elif done.made_now:
        line = f"{call}: settled as {how} now by {done.settled_by}."
    else:
        line = f"{call}: not settled here: it was already settled as {how} by {done.settled_by}."
    if done.requested_again:
        line += f" Requested again as {done.requested_again}, which waits for its own approval."
    return line
