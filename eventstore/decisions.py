"""An operator's decision on a governed call, and a run's pause switch: the writes.

A governed call waits in AWAITING_APPROVAL until an operator decides it. :class:`Decisions`
appends that decision (Approved, or Denied: ERROR APPROVAL_DENIED) with the approver's
identity and a bounded reason, through the same atomic script as every other event,
checked by the same transition table. The first decision wins: the script refuses a
second one (the version it expected has moved on, or the stage allows no decision), and
the answer then says what was decided, by whom. A decision after the approval's expiry
records the expiry instead (ApprovalExpired: ERROR APPROVAL_EXPIRED). An operator who
would approve the call with other arguments supersedes it instead: an edit is no
approval, so the original is denied ("superseded") and the edited request becomes a new
governed call, linked both ways (``superseded_by``, ``supersedes``), which waits for an
approval of its own. The run's pause switch is kept here too, with who, when and why.

It works on the store's reader, writer and run registry, so the store offers it as its
own methods (``store.decide``, ``store.pause_run``); the steps that run a call (the
dispatch permit) and the listings across runs are in :mod:`eventstore.approvals`.
"""

from __future__ import annotations

import secrets
from typing import Final, Literal

import msgspec

from eventstore.errors import CanonError, InvalidArgument, Refused
from eventstore.reader import Reader
from eventstore.runs import RunRegistry
from eventstore.writer import Writer, head_of, now_ms
from machine.codes import ErrorCode, Stage
from machine.fold import InvocationState
from machine.ids import is_tool_call_id
from machine.limits import Limits
from machine.requests import InvalidRequest, canonical_request

#: Longest approver identity and reason kept with a decision or a pause (characters).
MAX_APPROVER_CHARS: Final = 200
MAX_REASON_CHARS: Final = 1000
#: What a decision did.
Outcome = Literal["approved", "denied", "expired"]
#: Refusals that mean another writer moved the call on first: read it again.
MOVED_ON: Final = frozenset({"VERSION_CONFLICT", "ILLEGAL_TRANSITION"})


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


class Decisions:
    """Operators' decisions and runs' pause switches, written through the store's parts.

    Args:
        reader: reads a call's record.
        writer: appends the decision's event.
        runs: keeps each run's pause switch.
        limits: the store's size limits, which an edited request is held to.

    """

    def __init__(self, reader: Reader, writer: Writer, runs: RunRegistry, limits: Limits) -> None:
        self._reader = reader
        self._writer = writer
        self._runs = runs
        self._limits = limits

    async def decide(
        self,
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
        approval's expiry the expiry is recorded instead. When another decision came
        first, it is returned with ``made_now`` False. ``decision_id`` ties the calls of
        one batch decision together (a new id when None).

        Raises:
            InvalidArgument: ``by`` or ``reason`` is empty, not printable or too long.
            NotAwaitingApproval: no such governed call (or it expired), or it was never
                awaiting a decision.
            StoreUnavailable: Redis failed or timed out.

        """
        by = checked_text(by, MAX_APPROVER_CHARS, "the approver")
        reason = checked_text(reason, MAX_REASON_CHARS, "the reason")
        decision_id = decision_id or new_approval_id()
        state, expires_at_ms = await self._state(run_id, tool_call_id)
        if state.stage is not Stage.AWAITING_APPROVAL:
            return _recorded(state, made_now=False)
        head = head_of(state, expires_at_ms)
        try:
            if approve:
                await self._writer.approve(head, by, reason, decision_id)
            else:
                await self._writer.deny(head, by, reason, decision_id)
        except Refused as refused:
            if refused.code == ErrorCode.APPROVAL_EXPIRED.value:
                await self.expire(run_id, tool_call_id)
            elif refused.code not in MOVED_ON:
                raise
            state, _ = await self._state(run_id, tool_call_id)
            return _recorded(state, made_now=False)
        state, _ = await self._state(run_id, tool_call_id)
        return _recorded(state, made_now=True)

    async def supersede(
        self,
        run_id: str,
        tool_call_id: str,
        arguments: object,
        *,
        by: str,
        reason: str,
    ) -> Superseded:
        """Replace a governed call waiting for a decision by an edited one; approve neither.

        The edited request (``arguments``: a JSON object, or its text) becomes a new
        governed call of the same run and tool, ``<tool call id>.edit<n>``, with the same
        approval expiry, recorded first (its run's checks and budgets apply, as to any
        call); then the original is denied with the reason ``superseded: <reason>``,
        linked to it. The new call waits for its own approval: an edit is no approval.
        When another decision on the original came first, the new call is denied too
        (``the original was decided first``) and that decision is returned as
        ``original``.

        Raises:
            InvalidArgument: ``by`` or ``reason`` is empty, not printable or too long;
                ``arguments`` is not a JSON object within the request limit; the call id
                is too long to derive the new one.
            NotAwaitingApproval: no such governed call, or it never awaited a decision.
            Refused: the run refused the new call (inactive, paused, budget spent...).
            StoreUnavailable: Redis failed or timed out.

        """
        by = checked_text(by, MAX_APPROVER_CHARS, "the approver")
        reason = checked_text(reason, MAX_REASON_CHARS, "the reason")
        try:
            request = canonical_request(
                arguments,
                max_depth=self._limits.json_depth,
                max_text_bytes=4 * self._limits.request_bytes,
            )
        except (InvalidRequest, OverflowError):
            raise InvalidArgument("the edited arguments must be a JSON object") from None
        if len(request) > self._limits.request_bytes:
            raise InvalidArgument(
                f"the edited request is over the {self._limits.request_bytes} byte request limit"
            )
        state, expires_at_ms = await self._state(run_id, tool_call_id)
        if state.stage is not Stage.AWAITING_APPROVAL:
            return Superseded(original=_recorded(state, made_now=False), edited=None)
        assert state.approval_expires_at_ms is not None  # a governed call's
        edited = await self._edited_call(state, request)
        decision_id = new_approval_id()
        try:
            await self._writer.deny(
                head_of(state, expires_at_ms),
                by,
                f"superseded: {reason}",
                decision_id,
                superseded_by=edited,
            )
        except Refused as refused:
            if refused.code not in MOVED_ON and refused.code != ErrorCode.APPROVAL_EXPIRED.value:
                raise
            if refused.code == ErrorCode.APPROVAL_EXPIRED.value:
                await self.expire(run_id, tool_call_id)
            await self.decide(
                run_id, edited, approve=False, by=by, reason="the original was decided first"
            )
            state, _ = await self._state(run_id, tool_call_id)
            return Superseded(original=_recorded(state, made_now=False), edited=None)
        state, _ = await self._state(run_id, tool_call_id)
        return Superseded(original=_recorded(state, made_now=True), edited=edited)

    async def _edited_call(self, original: InvocationState, request: bytes) -> str:
        """Record the edited call waiting for approval; its tool call id."""
        assert original.approval_expires_at_ms is not None
        for n in range(1, 100):
            edited = f"{original.tool_call_id}.edit{n}"
            if not is_tool_call_id(edited):
                raise InvalidArgument("the call id is too long to name an edited call after it")
            try:
                await self._writer.request_approval(
                    original.run_id,
                    edited,
                    original.tool,
                    request,
                    approval_id=new_approval_id(),
                    approval_expires_at_ms=original.approval_expires_at_ms,
                    log_refusals="not_duplicates",
                    supersedes=original.tool_call_id,
                )
            except Refused as refused:
                if refused.error_code is ErrorCode.DUPLICATE_TOOL_CALL:
                    continue  # an earlier edit holds this name
                raise
            return edited
        raise InvalidArgument("this call was edited too many times")

    async def expire(self, run_id: str, tool_call_id: str) -> bool:
        """Record that a governed call's approval expired before its dispatch, if it did.

        True when this call wrote ApprovalExpired; False when the call is not awaiting a
        decision or a dispatch, or its approval has not expired (by this machine's clock;
        the scripts judge a decision or a permit by the server's).

        Raises:
            NotAwaitingApproval: no such governed call (or it expired).
            StoreUnavailable: Redis failed or timed out.

        """
        state, expires_at_ms = await self._state(run_id, tool_call_id)
        due = state.approval_expires_at_ms
        if state.stage not in (Stage.AWAITING_APPROVAL, Stage.APPROVED) or due is None:
            return False
        if now_ms() < due:
            return False
        try:
            await self._writer.expire_approval(head_of(state, expires_at_ms))
        except Refused as refused:
            if refused.code not in MOVED_ON:
                raise
            return False
        return True

    async def set_run_paused(self, run_id: str, paused: bool, *, by: str, reason: str) -> bool:
        """Pause or unpause one run, keeping who, when and why. False: no such run.

        Raises:
            InvalidArgument: ``by`` or ``reason`` is empty, not printable or too long.
            StoreUnavailable: Redis failed or timed out.

        """
        by = checked_text(by, MAX_APPROVER_CHARS, "who pauses or unpauses")
        reason = checked_text(reason, MAX_REASON_CHARS, "the reason")
        return await self._runs.set_paused(run_id, paused, by=by, reason=reason, at_ms=now_ms())

    async def _state(self, run_id: str, tool_call_id: str) -> tuple[InvocationState, int]:
        record = await self._reader.get(run_id, tool_call_id)
        if record is None or record.state.approval_id is None:
            raise NotAwaitingApproval(None if record is None else record.state.stage)
        return record.state, record.expires_at_ms


class Superseded(msgspec.Struct, frozen=True, kw_only=True):
    """What an edit did: the original's decision, and the edited call's id.

    ``edited`` is None when the original was decided first (``original.made_now`` is
    then False, and no edited call waits).
    """

    original: Decision
    edited: str | None


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
