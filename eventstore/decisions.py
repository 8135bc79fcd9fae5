"""An operator's decision on a governed call, and a run's pause switch: the writes.

A governed call waits in AWAITING_APPROVAL until operators decide it. :class:`Decisions`
appends each decision, as asked by a :class:`DecisionRequest`, through the same atomic
scripts as every other event, checked by the same transition table, and judges it by the
call's journal (:mod:`machine.governance`), never by the mutable record: the identity
that requested the call never approves it, and a policy asking for several approvals
gets them from distinct operators, each its own event (ApprovalAdded, then Approved for
the one that completes them). A denial by any one ends the call (Denied: ERROR
APPROVAL_DENIED). The first decision wins: the scripts refuse a second one (the version
it expected has moved on, or the stage allows no decision), and the answer then says
what was decided, by whom. A decision after the approval's expiry records the expiry
instead (ApprovalExpired: ERROR APPROVAL_EXPIRED).

An operator who would approve the call with other arguments supersedes it instead: an
edit is no approval. One script denies the original ("superseded") and records the
edited request as a new governed call, linked both ways (``superseded_by``,
``supersedes``), which waits for approvals of its own; or writes nothing when the
original was decided first. The run's pause switch is kept here too, with who, when and
why.

``by`` is whoever the caller authenticated: the operator doors (console, HTTP API, CLI)
pass the operator their credential names; ``store.decide`` takes the name a harness
that authenticates its own users gives. It works on the store's reader, writer and run
registry, so the store offers it as its own methods (``store.decide``,
``store.pause_run``); the dispatch permit is the boundary's
(:mod:`eventstore.boundary.governed`) and the listings across runs are audit's
(:mod:`eventstore.audit.waiting`).
"""

from __future__ import annotations

import secrets
from typing import Final, Literal

import msgspec

from eventstore.errors import CanonError, InvalidArgument, Refused
from eventstore.reader import Reader
from eventstore.runs import PauseOutcome, RunRegistry
from eventstore.writer import Writer, approval_requested, head_of, now_ms
from machine.codes import ErrorCode, Stage
from machine.fold import InvocationState
from machine.governance import RUN_IDENTITY_PREFIX, Tally, tally
from machine.ids import is_tool_call_id
from machine.limits import Limits
from machine.requests import DUPLICATE_MEMBER, InvalidRequest, canonical_request

#: Longest approver identity and reason kept with a decision or a pause (characters).
MAX_APPROVER_CHARS: Final = 200
MAX_REASON_CHARS: Final = 1000
#: What a decision did: the call approved (every approval it needs given), one approval
#: of several added (it still waits), denied, or expired.
Outcome = Literal["approved", "approval_added", "denied", "expired"]
#: Refusals that mean another writer moved the call on first: read it again.
MOVED_ON: Final = frozenset({"VERSION_CONFLICT", "ILLEGAL_TRANSITION", "CHAIN_BROKEN"})
#: How often a decision reads the call again after another writer moved it on first.
_ATTEMPTS: Final = 5


class NotAwaitingApproval(CanonError):
    """Raised when a decision names a call that is not a governed call awaiting a decision.

    ``stage`` is where the call stands (None: no such call, or it expired).
    """

    def __init__(self, stage: Stage | None) -> None:
        where = "no such call" if stage is None else f"the call is {stage.value}"
        super().__init__(f"nothing to decide: {where}")
        self.stage = stage


class RequesterCannotApprove(CanonError):
    """Raised when an approval names the identity that requested the call, or its run.

    Four eyes: whoever asked for a side effect never approves it alone. The requester
    may still deny (withdraw) it.
    """

    def __init__(self) -> None:
        super().__init__("the identity that requested a call cannot approve it")


class DecisionRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One decision an approver makes: of one governed call, or of each call of a batch.

    The one shape every door fills (``store.decide``, the console, the HTTP API, the
    CLI): ``by`` is the identity the door authenticated, never a field its caller fills.

    Attributes:
        approve: True to approve, False to deny.
        by: who decides (printable, 1 to 200 characters, never ``run:...``).
        reason: why (printable, 1 to 1000 characters).
        decision_id: ties the calls of one batch decision together (a new id when None;
            a batch gives every call the same one).

    """

    approve: bool
    by: str
    reason: str
    decision_id: str | None = None


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """The decision a governed call holds, and whether this request made it.

    Attributes:
        run_id: the call's run.
        tool_call_id: the call.
        approval_id: the approval it decided.
        outcome: approved, approval_added (one of several approvals; it still waits),
            denied, or expired (no operator decided in time).
        decided_by: who decided last (None for an expiry).
        reason: why (None for an expiry).
        decision_id: the decision's id (one decision may cover several calls).
        made_now: True when this request's decision is the one recorded; False when an
            earlier one was (the first decision wins).
        approvals: how many approvals the call holds.
        approvals_required: how many it needs.

    """

    run_id: str
    tool_call_id: str
    approval_id: str
    outcome: Outcome
    decided_by: str | None
    reason: str | None
    decision_id: str | None
    made_now: bool
    approvals: int = 0
    approvals_required: int = 1


def new_approval_id() -> str:
    """A fresh approval id (128 random bits, hex)."""
    return secrets.token_hex(16)


def checked_text(value: str, limit: int, name: str) -> str:
    """Return ``value`` when it is printable text of 1 to ``limit`` characters.

    A reason is checked so, by every caller.

    Raises:
        InvalidArgument: it is not, naming ``name``.

    """
    if not isinstance(value, str) or not value.strip() or not value.isprintable():
        raise InvalidArgument(f"{name} must be printable text")
    if len(value) > limit:
        raise InvalidArgument(f"{name} must be at most {limit} characters")
    return value


def checked_approver(value: str, name: str = "the approver") -> str:
    """Return ``value`` when it may name an approver: as :func:`checked_text`, not ``run:``.

    ``run:<run id>`` is a run's own identity (:func:`machine.governance.run_identity`),
    which never decides.

    Raises:
        InvalidArgument: it may not.

    """
    checked = checked_text(value, MAX_APPROVER_CHARS, name)
    if checked.startswith(RUN_IDENTITY_PREFIX):
        raise InvalidArgument(f"{name} may not start with {RUN_IDENTITY_PREFIX!r}: a run's own")
    return checked


class Decisions:
    """Operators' decisions and runs' pause switches, written through the store's parts.

    Args:
        reader: reads a call's record and journal.
        writer: appends the decision's event.
        runs: keeps each run's pause switch.
        limits: the store's size limits, which an edited request is held to.

    """

    def __init__(self, reader: Reader, writer: Writer, runs: RunRegistry, limits: Limits) -> None:
        self._reader = reader
        self._writer = writer
        self._runs = runs
        self._limits = limits

    async def decide(self, run_id: str, tool_call_id: str, request: DecisionRequest) -> Decision:
        """Approve or deny one governed call awaiting approval; the first decision wins.

        An approval by the identity that requested the call (or by its run) is refused;
        one by an operator who already approved it changes nothing. The approval that
        completes what the call's policy asks (one, or several from distinct operators)
        authorizes exactly one dispatch of the frozen request (a resume takes it); each
        before it is recorded and the call still waits. A denial ends the call ERROR with
        APPROVAL_DENIED, never dispatched. Past the approval's expiry the expiry is
        recorded instead. When another decision came first, it is returned with
        ``made_now`` False.

        Raises:
            InvalidArgument: ``by`` or ``reason`` is empty, not printable or too long, or
                ``by`` is a run's identity.
            RequesterCannotApprove: the approval names the call's requester.
            NotAwaitingApproval: no such governed call (or it expired), or it was never
                awaiting a decision.
            StoreUnavailable: Redis failed or timed out.

        """
        by = checked_approver(request.by)
        reason = checked_text(request.reason, MAX_REASON_CHARS, "the reason")
        decision_id = request.decision_id or new_approval_id()
        for _ in range(_ATTEMPTS):
            state, expires_at_ms, votes = await self._read(run_id, tool_call_id)
            if state.stage is not Stage.AWAITING_APPROVAL:
                return _recorded(state, votes, made_now=False)
            if request.approve and by in (votes.requested_by, f"{RUN_IDENTITY_PREFIX}{run_id}"):
                raise RequesterCannotApprove()
            if request.approve and by in votes.approvers:
                return _recorded(state, votes, made_now=False)
            head = head_of(state, expires_at_ms)
            try:
                if request.approve:
                    await self._writer.approve(
                        head,
                        by,
                        reason,
                        decision_id,
                        approval_count=len(votes.approvers) + 1,
                        approvals_required=votes.approvals_required,
                    )
                else:
                    await self._writer.deny(head, by, reason, decision_id)
            except Refused as refused:
                if refused.code == ErrorCode.APPROVAL_EXPIRED.value:
                    await self.expire(run_id, tool_call_id)
                elif refused.code not in MOVED_ON:
                    raise
                continue  # moved on: read it again (another approval may leave it waiting)
            state, _, votes = await self._read(run_id, tool_call_id)
            return _recorded(state, votes, made_now=True)
        state, _, votes = await self._read(run_id, tool_call_id)
        return _recorded(state, votes, made_now=False)

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

        The edited request (``arguments``: a JSON object, or its text, each member named
        once) becomes a new governed call of the same run and tool, ``<tool call
        id>.edit<n>``, under the original's policy (its requester, its approvals required,
        its approval expiry), while the original is denied with the reason ``superseded:
        <reason>``, linked to it: one script writes both, or nothing when another
        decision on the original came first (that decision is then returned as
        ``original``, and no edited call exists). The edited call waits for approvals of
        its own: an edit is no approval. It takes the original's place: no budget is
        spent on it, and it is recorded in a paused run too.

        Raises:
            InvalidArgument: ``by`` or ``reason`` is empty, not printable or too long;
                ``arguments`` is not a JSON object within the request limit, or names a
                member twice; the call id is too long to derive the new one.
            NotAwaitingApproval: no such governed call, or it never awaited a decision.
            Refused: the run refused the edited call (inactive, past its deadline, the
                tool revoked).
            StoreUnavailable: Redis failed or timed out.

        """
        by = checked_approver(by)
        reason = checked_text(reason, MAX_REASON_CHARS, "the reason")
        request = self._edited_request(arguments)
        for _ in range(_ATTEMPTS):
            state, expires_at_ms, votes = await self._read(run_id, tool_call_id)
            if state.stage is not Stage.AWAITING_APPROVAL:
                return Superseded(original=_recorded(state, votes, made_now=False), edited=None)
            assert state.approval_expires_at_ms is not None  # a governed call's
            try:
                edited = await self._write_edit(
                    state, expires_at_ms, votes, request, by=by, reason=reason
                )
            except Refused as refused:
                if refused.code == ErrorCode.APPROVAL_EXPIRED.value:
                    await self.expire(run_id, tool_call_id)
                elif refused.code not in MOVED_ON:
                    raise
                continue
            state, _, votes = await self._read(run_id, tool_call_id)
            return Superseded(original=_recorded(state, votes, made_now=True), edited=edited)
        state, _, votes = await self._read(run_id, tool_call_id)
        return Superseded(original=_recorded(state, votes, made_now=False), edited=None)

    def _edited_request(self, arguments: object) -> bytes:
        """The canonical bytes of an operator's edited arguments, within the request limit."""
        try:
            request = canonical_request(
                arguments,
                max_depth=self._limits.json_depth,
                max_text_bytes=4 * self._limits.request_bytes,
                unique_members=True,
            )
        except InvalidRequest as exc:
            if str(exc) == DUPLICATE_MEMBER:
                raise InvalidArgument(f"the edited arguments: {DUPLICATE_MEMBER}") from None
            raise InvalidArgument("the edited arguments must be a JSON object") from None
        except OverflowError:
            raise InvalidArgument("the edited arguments must be a JSON object") from None
        if len(request) > self._limits.request_bytes:
            raise InvalidArgument(
                f"the edited request is over the {self._limits.request_bytes} byte request limit"
            )
        return request

    async def _write_edit(
        self,
        original: InvocationState,
        expires_at_ms: int,
        votes: Tally,
        request: bytes,
        *,
        by: str,
        reason: str,
    ) -> str:
        """Deny ``original`` as superseded and record the edit, in one script; its call id."""
        assert original.approval_expires_at_ms is not None
        for n in range(1, 100):
            edited_id = f"{original.tool_call_id}.edit{n}"
            if not is_tool_call_id(edited_id):
                raise InvalidArgument("the call id is too long to name an edited call after it")
            edited = approval_requested(
                original.run_id,
                edited_id,
                original.tool,
                request,
                approval_id=new_approval_id(),
                approval_expires_at_ms=original.approval_expires_at_ms,
                requested_by=votes.requested_by or f"{RUN_IDENTITY_PREFIX}{original.run_id}",
                approvals_required=votes.approvals_required,
                supersedes=original.tool_call_id,
                # Keyed like every digest of its run when payloads are encrypted.
                request_sha256=(await self._writer.digest_for(original.run_id))(request),
            )
            try:
                await self._writer.supersede(
                    head_of(original, expires_at_ms),
                    edited,
                    request,
                    decided_by=by,
                    reason=f"superseded: {reason}",
                    decision_id=new_approval_id(),
                )
            except Refused as refused:
                if refused.code == ErrorCode.DUPLICATE_TOOL_CALL.value:
                    continue  # an earlier edit holds this name
                raise
            return edited_id
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
        record = await self._reader.get(run_id, tool_call_id)
        if record is None or record.state.approval_id is None:
            raise NotAwaitingApproval(None if record is None else record.state.stage)
        state = record.state
        due = state.approval_expires_at_ms
        if state.stage not in (Stage.AWAITING_APPROVAL, Stage.APPROVED) or due is None:
            return False
        if now_ms() < due:
            return False
        try:
            await self._writer.expire_approval(head_of(state, record.expires_at_ms))
        except Refused as refused:
            if refused.code not in MOVED_ON:
                raise
            return False
        return True

    async def set_run_paused(
        self, run_id: str, paused: bool, *, by: str, reason: str
    ) -> PauseOutcome | None:
        """Pause or unpause one run, keeping who, when and why. None: no such run.

        A run paused already stays as it was paused (``changed`` False, with its original
        who, why and when); likewise unpausing a run that is not paused.

        Raises:
            InvalidArgument: ``by`` or ``reason`` is empty, not printable or too long.
            RunClosed: pausing a run that is closed or past its deadline.
            StoreUnavailable: Redis failed or timed out.

        """
        by = checked_text(by, MAX_APPROVER_CHARS, "who pauses or unpauses")
        reason = checked_text(reason, MAX_REASON_CHARS, "the reason")
        return await self._runs.set_paused(run_id, paused, by=by, reason=reason, at_ms=now_ms())

    async def _read(self, run_id: str, tool_call_id: str) -> tuple[InvocationState, int, Tally]:
        """The call's record state and expiry, and its approval as its journal holds it."""
        record = await self._reader.get(run_id, tool_call_id)
        if record is None or record.state.approval_id is None:
            raise NotAwaitingApproval(None if record is None else record.state.stage)
        events = await self._reader.events(run_id, tool_call_id)
        votes = tally(event.event for event in events if event.event is not None)
        if votes is None:  # a record that claims an approval its journal never asked for
            raise NotAwaitingApproval(record.state.stage)
        return record.state, record.expires_at_ms, votes


class Superseded(msgspec.Struct, frozen=True, kw_only=True):
    """What an edit did: the original's decision, and the edited call's id.

    ``edited`` is None when the original was decided first (``original.made_now`` is
    then False, and no edited call waits).
    """

    original: Decision
    edited: str | None


def _recorded(state: InvocationState, votes: Tally, made_now: bool) -> Decision:
    """The decision ``state`` holds (its approvals counted from the journal)."""
    approvals = len(votes.approvers)
    outcome: Outcome
    if state.error_code is ErrorCode.APPROVAL_EXPIRED:
        outcome = "expired"
    elif state.error_code is ErrorCode.APPROVAL_DENIED:
        outcome = "denied"
    elif votes.approved:
        outcome = "approved"
    elif state.stage is Stage.AWAITING_APPROVAL and approvals:
        outcome = "approval_added"
    else:  # no decision yet, or the call ended without one
        raise NotAwaitingApproval(state.stage)
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
        approvals=approvals,
        approvals_required=votes.approvals_required,
    )
