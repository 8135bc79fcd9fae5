"""Operators' decisions as the HTTP API and the console take them: one call, or a batch.

Both doors end in :meth:`eventstore.store.Store.decide` (the first decision wins); this
module names the calls, keeps a batch to exactly the calls listed, under one decision id,
and says for each call what happened in terms both doors show: decided now, already
decided (what, by whom), not awaiting a decision, or no such call. Each decision made is
logged (``approval_decided``: ids, outcome, which door), never its reason or a payload.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from eventstore.decisions import (
    MAX_APPROVER_CHARS,
    MAX_REASON_CHARS,
    Decision,
    NotAwaitingApproval,
    checked_text,
)
from eventstore.logs import get_logger
from eventstore.store import Store
from machine.ids import invocation_id

log = get_logger("canon.decisions")

#: The most calls one batch decision may list (the approvals page lists at most as many).
MAX_BATCH_CALLS: Final = 100
#: Which door a decision came through, as logged.
Door = Literal["http", "console"]
#: Why a listed call got no decision of this request's.
Problem = Literal["invocation_not_found", "not_awaiting_approval"]


class CallDecision(msgspec.Struct, frozen=True, kw_only=True):
    """What one listed call holds after a decision was asked for it.

    Attributes:
        run_id: the call's run.
        tool_call_id: the call, as the harness named it (None when the run has no call of
            the invocation id given).
        invocation_id: the call's invocation id.
        decision: the decision it holds (``made_now`` says whether it is this one), or
            None when ``problem`` says why it holds none.
        problem: invocation_not_found (no such call, or it expired) or
            not_awaiting_approval (a call that was never a governed call waiting).
        stage: where a not_awaiting_approval call stands (READY, ERROR ...).

    """

    run_id: str
    tool_call_id: str | None
    invocation_id: str
    decision: Decision | None = None
    problem: Problem | None = None
    stage: str | None = None


def checked_by(value: str) -> str:
    """The approver's identity when it is printable text of 1 to 200 characters.

    Raises:
        InvalidArgument: it is not.

    """
    return checked_text(value, MAX_APPROVER_CHARS, "the approver")


def checked_reason(value: str) -> str:
    """A decision's reason when it is printable text of 1 to 1000 characters.

    Raises:
        InvalidArgument: it is not.

    """
    return checked_text(value, MAX_REASON_CHARS, "the reason")


async def decide_call(
    store: Store,
    run_id: str,
    tool_call_id: str,
    *,
    approve: bool,
    by: str,
    reason: str,
    decision_id: str,
    door: Door,
) -> CallDecision:
    """Decide one call named by its run and tool call id (both already checked).

    Raises:
        InvalidArgument: ``by`` or ``reason`` is empty, not printable or too long.
        StoreUnavailable: Redis failed or timed out.

    """
    inv_id = invocation_id(run_id, tool_call_id)
    try:
        decision = await store.decide(
            run_id,
            tool_call_id,
            approve=approve,
            by=by,
            reason=reason,
            decision_id=decision_id,
        )
    except NotAwaitingApproval as exc:
        if exc.stage is None:
            return CallDecision(
                run_id=run_id,
                tool_call_id=tool_call_id,
                invocation_id=inv_id,
                problem="invocation_not_found",
            )
        return CallDecision(
            run_id=run_id,
            tool_call_id=tool_call_id,
            invocation_id=inv_id,
            problem="not_awaiting_approval",
            stage=exc.stage.value,
        )
    if decision.made_now:
        log.info(
            "approval_decided",
            run_id=run_id,
            invocation_id=inv_id,
            outcome=decision.outcome,
            decision_id=decision.decision_id,
            door=door,
        )
    return CallDecision(
        run_id=run_id, tool_call_id=tool_call_id, invocation_id=inv_id, decision=decision
    )


async def decide_invocation(
    store: Store,
    run_id: str,
    inv_id: str,
    *,
    approve: bool,
    by: str,
    reason: str,
    decision_id: str,
    door: Door,
) -> CallDecision:
    """Decide one call named by its run and invocation id (both already checked).

    The run's own index of its invocations names the call: another run's invocation is
    not found, as for the receipt route.

    Raises:
        InvalidArgument: ``by`` or ``reason`` is empty, not printable or too long.
        StoreUnavailable: Redis failed or timed out.

    """
    tool_call_id = await store.runs.tool_call_id_of(run_id, inv_id)
    if tool_call_id is None:
        return CallDecision(
            run_id=run_id, tool_call_id=None, invocation_id=inv_id, problem="invocation_not_found"
        )
    return await decide_call(
        store,
        run_id,
        tool_call_id,
        approve=approve,
        by=by,
        reason=reason,
        decision_id=decision_id,
        door=door,
    )


def notice(result: CallDecision, approve: bool) -> str:
    """One line saying what happened to a call, as the console shows it after a decision."""
    name = result.tool_call_id if result.tool_call_id is not None else result.invocation_id
    call = f"{name} (run {result.run_id})"
    decision = result.decision
    if decision is None:
        if result.problem == "not_awaiting_approval":
            return f"{call}: not awaiting approval (it is {result.stage}); nothing decided."
        return f"{call}: no such call (it may have expired); nothing decided."
    if decision.made_now:
        return f"{call}: {decision.outcome} now by {decision.decided_by}."
    asked = "approved" if approve else "denied"
    if decision.outcome == "expired":
        return f"{call}: not {asked} here: its approval had expired undecided."
    return f"{call}: not {asked} here: it was already {decision.outcome} by {decision.decided_by}."
