"""Governed calls: an operator's decision, the one dispatch permit, and a run's pause.

A governed call (a side-effecting tool that needs an operator's approval) is recorded
frozen by :meth:`~eventstore.writer.Writer.request_approval` and waits in
AWAITING_APPROVAL. Here are the steps after that, each one event appended by the same
atomic script as every other, checked by the same transition table:

- :func:`decide`: approve (Approved) or deny (Denied: ERROR APPROVAL_DENIED) with the
  approver's identity and a bounded reason. The first decision wins: the script refuses
  a second one (the version it expected has moved on, or the stage allows no decision),
  and the answer then says what was decided, by whom. A decision after the approval's
  expiry records the expiry instead (ApprovalExpired: ERROR APPROVAL_EXPIRED).
- :func:`take_permit`: the approved -> EXECUTING step (Dispatched), the only dispatch
  permit. The script refuses it while the run or the namespace is paused, past the
  expiry, or once another resumer took it; only its winner may run the tool.
- :func:`pause_run` / :func:`unpause_run`: the run's pause switch, with who, when and
  why; creation and the permit read it in the script that writes them.
- :func:`pending_approvals`: the calls waiting for a decision across the latest runs,
  from the run index and each run's count of its waiting calls (kept by the scripts);
  :func:`sweep_expired` records the expiry of those past it (``canon approvals
  --sweep``, from cron or a timer), so an expired call shows as such without anyone
  touching it. It writes records, so it runs with the writer's credentials, never a
  projection worker's.

Nothing here runs a tool; reading a decision never consumes it.
"""

from __future__ import annotations

import secrets
from typing import Final, Literal

import msgspec

from eventstore.audit.run_calls import CallRow, run_calls
from eventstore.audit.run_index import MAX_LIMIT, RunFilter, list_runs
from eventstore.errors import CanonError, InvalidArgument, Refused
from eventstore.store import Store
from eventstore.writer import Head, head_of, now_ms
from machine.codes import ErrorCode, Stage
from machine.fold import InvocationState

#: Longest approver identity and reason kept with a decision or a pause (characters).
MAX_APPROVER_CHARS: Final = 200
MAX_REASON_CHARS: Final = 1000
#: What a decision did.
Outcome = Literal["approved", "denied", "expired"]
#: Refusals that mean another writer moved the call on first: read it again.
_MOVED_ON: Final = frozenset({"VERSION_CONFLICT", "ILLEGAL_TRANSITION"})


class NotAwaitingApproval(CanonError):
    """Raised when a decision names a call that is not a governed call awaiting a decision.

    ``stage`` is where the call stands (None: no such call, or it expired).
    """

    def __init__(self, stage: Stage | None) -> None:
        where = "no such call" if stage is None else f"the call is {stage.value}"
        super().__init__(f"nothing to decide: {where}")
        self.stage = stage


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """The decision a governed call holds, and whether this request made it.

    Attributes:
        run_id: the call's run.
        tool_call_id: the call.
        approval_id: the approval it decided.
        outcome: approved, denied, or expired (no operator decided in time).
        decided_by: who decided (None for an expiry).
        reason: why (None for an expiry).
        decision_id: the decision's id (one decision may cover several calls).
        made_now: True when this request's decision is the one recorded; False when an
            earlier one was (the first decision wins).

    """

    run_id: str
    tool_call_id: str
    approval_id: str
    outcome: Outcome
    decided_by: str | None
    reason: str | None
    decision_id: str | None
    made_now: bool


def new_approval_id() -> str:
    """A fresh approval id (128 random bits, hex)."""
    return secrets.token_hex(16)


def checked_text(value: str, limit: int, name: str) -> str:
    """Return ``value`` when it is printable text of 1 to ``limit`` characters.

    An approver or a reason is checked so, by every caller.

    Raises:
        InvalidArgument: it is not, naming ``name``.

    """
    if not isinstance(value, str) or not value.strip() or not value.isprintable():
        raise InvalidArgument(f"{name} must be printable text")
    if len(value) > limit:
        raise InvalidArgument(f"{name} must be at most {limit} characters")
    return value


async def _state(store: Store, run_id: str, tool_call_id: str) -> tuple[InvocationState, int]:
    record = await store.reader.get(run_id, tool_call_id)
    if record is None or record.state.approval_id is None:
        raise NotAwaitingApproval(None if record is None else record.state.stage)
    return record.state, record.expires_at_ms


def _recorded(state: InvocationState, made_now: bool) -> Decision:
    """The decision ``state`` holds."""
    if state.stage is Stage.AWAITING_APPROVAL:
        raise NotAwaitingApproval(state.stage)  # no decision yet: never reached
    if state.error_code is ErrorCode.APPROVAL_EXPIRED:
        outcome: Outcome = "expired"
    elif state.error_code is ErrorCode.APPROVAL_DENIED:
        outcome = "denied"
    else:
        outcome = "approved"
    assert state.approval_id is not None
    return Decision(
        run_id=state.run_id,
        tool_call_id=state.tool_call_id,
        approval_id=state.approval_id,
        outcome=outcome,
        decided_by=state.decided_by,
        reason=state.decision_reason,
        decision_id=state.decision_id,
        made_now=made_now,
    )


async def decide(
    store: Store,
    run_id: str,
    tool_call_id: str,
    *,
    approve: bool,
    by: str,
    reason: str,
    decision_id: str | None = None,
) -> Decision:
    """Approve or deny one governed call awaiting approval; the first decision wins.

    An approval authorizes exactly one dispatch of the frozen request (a resume takes
    it); a denial ends the call ERROR with APPROVAL_DENIED, never dispatched. Past the
    approval's expiry the expiry is recorded instead. When another decision came first,
    it is returned with ``made_now`` False. ``decision_id`` ties the calls of one batch
    decision together (a new id when None).

    Raises:
        InvalidArgument: ``by`` or ``reason`` is empty, not printable or too long.
        NotAwaitingApproval: no such governed call (or it expired), or it was never
            awaiting a decision.
        StoreUnavailable: Redis failed or timed out.

    """
    by = checked_text(by, MAX_APPROVER_CHARS, "the approver")
    reason = checked_text(reason, MAX_REASON_CHARS, "the reason")
    decision_id = decision_id or new_approval_id()
    state, expires_at_ms = await _state(store, run_id, tool_call_id)
    if state.stage is not Stage.AWAITING_APPROVAL:
        return _recorded(state, made_now=False)
    head = head_of(state, expires_at_ms)
    try:
        if approve:
            await store.writer.approve(head, by, reason, decision_id)
        else:
            await store.writer.deny(head, by, reason, decision_id)
    except Refused as refused:
        if refused.code == ErrorCode.APPROVAL_EXPIRED.value:
            await expire(store, run_id, tool_call_id)
        elif refused.code not in _MOVED_ON:
            raise
        state, _ = await _state(store, run_id, tool_call_id)
        return _recorded(state, made_now=False)
    state, _ = await _state(store, run_id, tool_call_id)
    return _recorded(state, made_now=True)


async def expire(store: Store, run_id: str, tool_call_id: str) -> bool:
    """Record that a governed call's approval expired before its dispatch, if it did.

    True when this call wrote ApprovalExpired; False when the call is not awaiting a
    decision or a dispatch, or its approval has not expired (by this machine's clock; the
    scripts judge a decision or a permit by the server's).

    Raises:
        NotAwaitingApproval: no such governed call (or it expired).
        StoreUnavailable: Redis failed or timed out.

    """
    state, expires_at_ms = await _state(store, run_id, tool_call_id)
    due = state.approval_expires_at_ms
    if state.stage not in (Stage.AWAITING_APPROVAL, Stage.APPROVED) or due is None:
        return False
    if now_ms() < due:
        return False
    try:
        await store.writer.expire_approval(head_of(state, expires_at_ms))
    except Refused as refused:
        if refused.code not in _MOVED_ON:
            raise
        return False
    return True


class Permit(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of asking for a governed call's dispatch permit.

    ``head`` is set only for the one caller that took the permit: it may run the tool,
    once, and goes on from there. Otherwise ``stage`` (and ``code`` for an ERROR or a
    refusal) says why not: not approved yet, already dispatched, ended, paused.
    """

    head: Head | None
    stage: Stage
    code: ErrorCode | None = None


async def take_permit(store: Store, state: InvocationState, expires_at_ms: int) -> Permit:
    """Take the one dispatch permit of an approved call whose request ``state`` describes.

    The caller has read the request back and checked its digest (``state`` holds the
    approved one); the permit records that digest. Only the caller that gets a head may
    run the tool.

    Raises:
        StoreUnavailable: Redis failed or timed out.

    """
    if state.stage is not Stage.APPROVED:
        return Permit(head=None, stage=state.stage, code=state.error_code)
    try:
        head = await store.writer.dispatch(head_of(state, expires_at_ms), state.request_sha256)
    except Refused as refused:
        if refused.code == ErrorCode.APPROVAL_EXPIRED.value:
            await expire(store, state.run_id, state.tool_call_id)
            return Permit(head=None, stage=Stage.ERROR, code=ErrorCode.APPROVAL_EXPIRED)
        if refused.code in (ErrorCode.RUN_PAUSED.value, ErrorCode.EXECUTION_PAUSED.value):
            return Permit(head=None, stage=Stage.APPROVED, code=ErrorCode(refused.code))
        if refused.code not in _MOVED_ON:
            raise
        record = await store.reader.get(state.run_id, state.tool_call_id)
        if record is None:
            return Permit(head=None, stage=Stage.ERROR, code=ErrorCode.RECORD_EXPIRED)
        return Permit(head=None, stage=record.state.stage, code=record.state.error_code)
    return Permit(head=head, stage=Stage.EXECUTING)


class Waiting(msgspec.Struct, frozen=True, kw_only=True):
    """A governed call waiting for an operator's decision, and its run."""

    run_id: str
    call: CallRow


class WaitingCalls(msgspec.Struct, frozen=True, kw_only=True):
    """The governed calls waiting across runs.

    ``runs_examined`` is how many runs were read; ``complete`` whether every waiting call
    of the latest runs is listed.
    """

    calls: list[Waiting]
    runs_examined: int
    complete: bool


async def pending_approvals(store: Store, *, runs: int = 200, limit: int = 100) -> WaitingCalls:
    """The governed calls waiting for a decision in the latest ``runs`` runs, oldest first.

    Served from the run index and each run's count of its waiting calls: only a run that
    has some has its calls read (lifecycle fields, never a payload); never a SCAN. At most
    ``limit`` calls, the oldest.

    Raises:
        InvalidArgument: ``runs`` or ``limit`` out of range (see :func:`list_runs`).
        StoreUnavailable: Redis failed or timed out.

    """
    if not 1 <= limit <= 1000:
        raise InvalidArgument("limit must be between 1 and 1000")
    page = await list_runs(
        store,
        limit=min(runs, MAX_LIMIT),
        where=RunFilter(status="awaiting_approval"),
        examine=runs,
    )
    found = [
        Waiting(run_id=run.run_id, call=call)
        for run in page.runs
        for call in await run_calls(store, run.run_id)
        if call.stage == Stage.AWAITING_APPROVAL.value
    ]
    found.sort(key=lambda waiting: (waiting.call.created_at_ms, waiting.run_id))
    return WaitingCalls(
        calls=found[:limit],
        runs_examined=page.examined,
        complete=len(found) <= limit and page.cursor is None,
    )


async def sweep_expired(store: Store, *, runs: int = 200) -> int:
    """Record the expiry of every call of the latest ``runs`` runs waiting past it.

    Returns how many expiries this sweep recorded. Idempotent and safe beside any other
    writer: each expiry is one append checked against the call's version, so a decision
    or a resume that came first wins.

    Raises:
        StoreUnavailable: Redis failed or timed out.

    """
    waiting = await pending_approvals(store, runs=runs, limit=1000)
    recorded = 0
    for entry in waiting.calls:
        try:
            recorded += await expire(store, entry.run_id, entry.call.tool_call_id)
        except NotAwaitingApproval:
            continue  # its record expired meanwhile
    return recorded


async def pause_run(store: Store, run_id: str, *, by: str, reason: str) -> bool:
    """Pause one run: no call of it is recorded or dispatched until it is unpaused.

    Decisions, receipts, replay, export and the console keep working. Who, when and why
    are kept on the run. False when the run is unknown or expired.

    Raises:
        InvalidArgument: ``by`` or ``reason`` is empty, not printable or too long.
        StoreUnavailable: Redis failed or timed out.

    """
    return await _switch(store, run_id, True, by=by, reason=reason)


async def unpause_run(store: Store, run_id: str, *, by: str, reason: str) -> bool:
    """Lift a run's pause (who, when and why are kept). False when the run is unknown."""
    return await _switch(store, run_id, False, by=by, reason=reason)


async def _switch(store: Store, run_id: str, paused: bool, *, by: str, reason: str) -> bool:
    by = checked_text(by, MAX_APPROVER_CHARS, "who pauses or unpauses")
    reason = checked_text(reason, MAX_REASON_CHARS, "the reason")
    return await store.runs.set_paused(run_id, paused, by=by, reason=reason, at_ms=now_ms())
