"""An operator's settlement of a call whose process died, and a call requested again.

A call in flight is held by the lease of the process running it. When that process dies
after a governed call's dispatch, the call is *attempted*: its tool may have run, and
nothing runs it again by itself. A reconcile asks the tool's hook
(:mod:`eventstore.boundary.reconciling`); an operator who learned what happened settles
it by hand: :meth:`Settlements.settle` writes ``Settled`` (ERROR RECONCILED_EXECUTED: it
ran, its result is not recorded; or RECONCILED_NOT_EXECUTED: it did not run) with who
settled it and the digest of their evidence, in the call's own chain, only once the
call's lease has lapsed (a process that still renews it keeps its call). The first
settlement wins: a later one, or one racing a reconcile, is answered with what was
recorded.

A governed call settled as not executed may be requested again by an operator
(:meth:`Settlements.request_again`): a new governed call ``<call>.again<n>`` of the same
run, tool and frozen request, under the original's policy (its requester may not approve
it), linked to the original (``retry_of``), which waits for an approval of its own and
runs only when its harness resumes it. Nothing else ever dispatches the original again.

``by`` is the operator a door authenticated (the console's session, the HTTP API's
Bearer token, the CLI's token), as for decisions (:mod:`eventstore.decisions`).
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from eventstore.decisions import checked_approver, new_approval_id
from eventstore.errors import CanonError, InvalidArgument, Refused
from eventstore.reader import Reader
from eventstore.wire.scripts import LeaseHeld
from eventstore.writer import Writer, head_of, now_ms
from machine.codes import ErrorCode, Stage
from machine.events import ApprovalRequested
from machine.fold import InvocationState
from machine.governance import run_identity, tally
from machine.ids import is_tool_call_id

#: Longest evidence an operator or a hook gives with a settlement (characters).
MAX_EVIDENCE_CHARS: Final = 2000
#: Refusals that mean another writer moved the call on first: read it again.
_MOVED_ON: Final = frozenset({"VERSION_CONFLICT", "ILLEGAL_TRANSITION", "CHAIN_BROKEN"})
_ATTEMPTS: Final = 5
#: How a settled call was settled, as the doors show it.
SettledAs = Literal["executed", "not_executed", "abandoned", "reconciled"]
_SETTLED_AS: Final[dict[ErrorCode | None, SettledAs]] = {
    ErrorCode.RECONCILED_EXECUTED: "executed",
    ErrorCode.RECONCILED_NOT_EXECUTED: "not_executed",
    ErrorCode.ABANDONED: "abandoned",
}


class NotInFlight(CanonError):
    """Raised when a settlement names a call that is not in flight (nor settled already).

    ``stage`` is where the call stands (None: no such call, or it expired).
    """

    def __init__(self, stage: Stage | None) -> None:
        where = "no such call" if stage is None else f"the call is {stage.value}"
        super().__init__(f"nothing to settle: {where}")
        self.stage = stage


class CallStillRunning(CanonError):
    """Raised when a settlement names a call whose process still holds its lease.

    ``lease_until_ms`` is when that lease ends unless renewed (the server's clock).
    """

    def __init__(self, lease_until_ms: int) -> None:
        super().__init__("the call is still running: its process renews its lease")
        self.lease_until_ms = lease_until_ms


class RawResponseRecorded(CanonError):
    """Raised when a call whose raw response is recorded would be settled as not executed.

    Its journal proves that its tool returned: it ran.
    """

    def __init__(self) -> None:
        super().__init__("its raw response is recorded: the call ran")


class NotSettledNotExecuted(CanonError):
    """Raised when a call is requested again that is not a governed call found not to have run.

    ``stage`` and ``error_code`` say where the call stands (None: no such call).
    """

    def __init__(self, stage: Stage | None, error_code: ErrorCode | None = None) -> None:
        where = "no such call" if stage is None else f"the call is {stage.value}"
        if error_code is not None:
            where += f" {error_code.value}"
        super().__init__(
            f"only a governed call settled as not executed is requested again: {where}"
        )
        self.stage = stage
        self.error_code = error_code


class SettlementRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One operator's settlement of a call whose process died: the one shape every door fills.

    Attributes:
        executed: True: it ran (its result is not recorded); False: it did not run.
        by: the operator the door authenticated (printable, 1 to 200 characters).
        evidence: what the operator's answer rests on (printable, 1 to 2,000 characters).

    """

    executed: bool
    by: str
    evidence: str


class Settlement(msgspec.Struct, frozen=True, kw_only=True):
    """How a call was settled, and whether this request settled it.

    Attributes:
        run_id: the call's run.
        tool_call_id: the call.
        settled_as: executed, not_executed, abandoned (ended by the sweep) or reconciled
            (found to have run by a hook or its journal: its outcome was recorded).
        settled_by: who settled it (an operator, ``hook:<tool>``, ``journal``, ``sweep``).
        error_code: the code it ended with (None for a reconciled call that ended READY).
        made_now: True when this request's settlement is the one recorded.
        requested_again: the call an operator requested again in its place, if any.

    """

    run_id: str
    tool_call_id: str
    settled_as: SettledAs
    settled_by: str | None
    error_code: str | None
    made_now: bool
    requested_again: str | None = None


def checked_evidence(value: str) -> str:
    """Return ``value`` when it is printable text of 1 to 2,000 characters.

    Raises:
        InvalidArgument: it is not.

    """
    if not isinstance(value, str) or not value.strip() or not value.isprintable():
        raise InvalidArgument("the evidence must be printable text")
    if len(value) > MAX_EVIDENCE_CHARS:
        raise InvalidArgument(f"the evidence must be at most {MAX_EVIDENCE_CHARS} characters")
    return value


def settlement_of(state: InvocationState, made_now: bool = False) -> Settlement | None:
    """How ``state``'s call was settled, or None when no settlement ended it."""
    if state.settled_by is None or state.stage not in (Stage.READY, Stage.ERROR):
        return None
    code = state.error_code
    return Settlement(
        run_id=state.run_id,
        tool_call_id=state.tool_call_id,
        settled_as=_SETTLED_AS.get(code, "reconciled"),
        settled_by=state.settled_by,
        error_code=code.value if code is not None else None,
        made_now=made_now,
    )


class Settlements:
    """Operators' settlements of calls whose process died, and calls requested again.

    Args:
        reader: reads a call's record and journal.
        writer: writes the settlement (``lapsed.lua``) and a call requested again.
        ttl_ms: the record TTL, which a call requested again waits within.

    """

    def __init__(self, reader: Reader, writer: Writer, ttl_ms: int) -> None:
        self._reader = reader
        self._writer = writer
        self._ttl_ms = ttl_ms

    async def settle(
        self, run_id: str, tool_call_id: str, request: SettlementRequest
    ) -> Settlement:
        """Settle a call in flight whose process died: ran (result unknown) or did not run.

        Ends the call ERROR RECONCILED_EXECUTED or RECONCILED_NOT_EXECUTED (``Settled``:
        who, when, the evidence's digest), once its lease has lapsed. The first
        settlement wins: a call settled already is answered with that settlement
        (``made_now`` False).

        Raises:
            InvalidArgument: ``by`` or ``evidence`` is empty, not printable or too long.
            NotInFlight: no such call, or it is not in flight (waiting, or ended without a
                settlement).
            CallStillRunning: its process still holds its lease.
            RawResponseRecorded: ``executed`` is False, but its raw response is recorded.
            StoreUnavailable: Redis failed or timed out.

        """
        by = checked_approver(request.by, "who settles")
        evidence = checked_evidence(request.evidence).encode()
        code = (
            ErrorCode.RECONCILED_EXECUTED if request.executed else ErrorCode.RECONCILED_NOT_EXECUTED
        )
        for _ in range(_ATTEMPTS):
            record = await self._reader.get(run_id, tool_call_id)
            state = record.state if record is not None else None
            if record is None or state is None:
                raise NotInFlight(None)
            settled = settlement_of(state)
            if settled is not None:
                return settled
            if state.stage not in (Stage.EXECUTING, Stage.PROJECTING):
                raise NotInFlight(state.stage)
            if not request.executed and state.stage is Stage.PROJECTING:
                raise RawResponseRecorded()
            try:
                await self._writer.settle(head_of(state, record.expires_at_ms), code, by, evidence)
            except LeaseHeld as held:
                raise CallStillRunning(held.lease_until_ms) from None
            except Refused as refused:
                if refused.code not in _MOVED_ON:
                    raise
                continue  # moved on (another settled it, or its holder wrote): read again
            done = await self._reader.get(run_id, tool_call_id)
            if done is not None and (made := settlement_of(done.state, made_now=True)):
                return made
        raise NotInFlight(None)

    async def request_again(self, run_id: str, tool_call_id: str, *, by: str) -> Settlement:
        """Request a governed call settled as not executed again, as a new linked call.

        The new call, ``<call>.again<n>``, has the original's tool and frozen request,
        its policy (requester, approvals required) and the length of its approval window;
        it waits for an approval of its own (the run's authority and budgets apply as to
        any new call). Asked again for a call already requested again, the call made
        then is answered (``made_now`` False).

        Raises:
            InvalidArgument: ``by`` is empty, not printable or too long, or the call id
                is too long to name a call after it.
            NotSettledNotExecuted: the call is not a governed call settled as not executed.
            Refused: the run refused the new call (RUN_INACTIVE, RUN_PAUSED, budgets ...).
            StoreUnavailable: Redis failed or timed out.

        """
        by = checked_approver(by, "who requests it again")
        record = await self._reader.get(run_id, tool_call_id)
        if record is None:
            raise NotSettledNotExecuted(None)
        state = record.state
        if state.approval_id is None or state.error_code is not ErrorCode.RECONCILED_NOT_EXECUTED:
            raise NotSettledNotExecuted(state.stage, state.error_code)
        events = [stored.event for stored in await self._reader.events(run_id, tool_call_id)]
        opened = events[0] if events else None
        votes = tally(event for event in events if event is not None)
        if not isinstance(opened, ApprovalRequested) or votes is None:
            raise NotSettledNotExecuted(state.stage, state.error_code)
        window = max(opened.approval_expires_at_ms - opened.at_ms, 60_000)
        for n in range(1, 100):
            again = f"{tool_call_id}.again{n}"
            if not is_tool_call_id(again) or len(again) > 512:
                raise InvalidArgument("the call id is too long to name a call after it")
            existing = await self._reader.get(run_id, again)
            if existing is not None:
                if existing.state.retry_of == tool_call_id:
                    return _again(state, again, made_now=False)
                continue
            try:
                await self._writer.request_approval(
                    run_id,
                    again,
                    state.tool,
                    record.request,
                    approval_id=new_approval_id(),
                    approval_expires_at_ms=now_ms() + min(window, self._ttl_ms),
                    requested_by=votes.requested_by or run_identity(run_id),
                    approvals_required=votes.approvals_required,
                    retry_of=tool_call_id,
                    retried_by=by,
                    log_refusals="not_duplicates",
                )
            except Refused as refused:
                if refused.code == ErrorCode.DUPLICATE_TOOL_CALL.value:
                    continue  # that name is taken (another asked at the same time, ...)
                raise
            return _again(state, again, made_now=True)
        raise InvalidArgument("this call was requested again too many times")


def _again(state: InvocationState, again: str, *, made_now: bool) -> Settlement:
    """The settlement of ``state`` with the call requested again in its place."""
    settled = settlement_of(state)
    assert settled is not None
    return msgspec.structs.replace(settled, made_now=made_now, requested_again=again)
