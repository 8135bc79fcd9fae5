"""The governed path: a side-effecting call recorded frozen, decided, and run once.

A governed tool's call passes the same preflight as any other; then its record is
created with the complete request frozen (ApprovalRequested, with the policy it waits
under: its requester and how many approvals it needs) and the agent is answered
:class:`~eventstore.boundary.contracts.ApprovalPending`: the tool has not run. Operators
decide (:mod:`eventstore.decisions`). A resume (``ToolBoundary.resume``, or the framework
calling the tool again with the same run, id and request) goes on from what the call's
journal says:

- waiting: pending again (or, past its expiry, APPROVAL_EXPIRED, recorded now);
- approved: the one dispatch permit (:meth:`~eventstore.writer.Writer.dispatch`). The
  permit script judges the journal, not the record: its chain, its decisions, the tool
  and the request digest frozen in ApprovalRequested, the approval's expiry, the run's
  authority (active, the tool granted, the deadline) and the pauses. The stored request
  it hands back runs only if its bytes have the journal's digest. A record that
  disagrees with its journal runs nothing and ends ERROR JOURNAL_MISMATCH (or
  APPROVED_REQUEST_CHANGED), the reason in its failure detail; a run that lost its
  authority ends it with the code a new call would get (RUN_INACTIVE, UNAUTHORIZED,
  RUN_DEADLINE_EXPIRED); a pause leaves it approved (RUN_PAUSED, EXECUTION_PAUSED);
- anything else: its recorded outcome, waiting a while for a permit another resumer holds.

Round trips of a resume that runs the call: one read of the record, one permit script,
then the call's own writes (:mod:`eventstore.boundary.running`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Final

import msgspec

from eventstore.boundary.call_trace import CallTrace
from eventstore.boundary.contracts import (
    AgentReply,
    ApprovalPending,
    RunContext,
    ToolCall,
    ToolEnvelope,
    ToolError,
)
from eventstore.boundary.duplicates import Abandoned, replay_duplicate
from eventstore.boundary.registered_tools import RegisteredTool
from eventstore.boundary.running import CallRunner
from eventstore.decisions import new_approval_id
from eventstore.errors import CanonError, RecordExpired, Refused, StoreUnavailable
from eventstore.reader import InvocationRecord
from eventstore.sealing import SealBroken
from eventstore.settings import milliseconds
from eventstore.store import Store
from eventstore.wire.scripts import PermitRefused
from eventstore.writer import Head, Permit, head_of, now_ms
from machine.codes import ErrorCode, Stage
from machine.failure_detail import governance_detail
from machine.fold import InvocationState
from machine.governance import run_identity
from machine.ids import invocation_id, is_run_id

#: Permit refusals after which the call never runs: it is ended with the code.
_ENDS_THE_CALL: Final = frozenset(
    {
        ErrorCode.JOURNAL_MISMATCH,
        ErrorCode.RUN_ERASED,
        ErrorCode.APPROVED_REQUEST_CHANGED,
        ErrorCode.RUN_INACTIVE,
        ErrorCode.UNAUTHORIZED,
        ErrorCode.RUN_DEADLINE_EXPIRED,
    }
)
#: Stages of a governed call that has not run yet (an erased run's never will).
_NOT_RUN: Final = frozenset({Stage.AWAITING_APPROVAL, Stage.APPROVED})
#: Permit refusals that leave the call approved, to run once resumed later.
_HOLDS_THE_CALL: Final = frozenset({ErrorCode.RUN_PAUSED, ErrorCode.EXECUTION_PAUSED})
#: Why a call ended at its permit, as its failure detail says (the journal's own words
#: for a JOURNAL_MISMATCH come from the permit script).
_WHY: Final = {
    ErrorCode.APPROVED_REQUEST_CHANGED: "the stored request does not have the digest approved",
    ErrorCode.RUN_ERASED: "the run's payloads were erased before the call was dispatched",
    ErrorCode.RUN_INACTIVE: "the run was closed before the call was dispatched",
    ErrorCode.UNAUTHORIZED: "the tool was revoked from the run before the call was dispatched",
    ErrorCode.RUN_DEADLINE_EXPIRED: "the run passed its deadline before the call was dispatched",
}

#: The duplicate answer of the boundary (or its view) a re-entry falls back to.
Duplicate = Callable[[CallTrace, str, str, bytes], Coroutine[Any, Any, AgentReply]]
#: The boundary's refusal counter and log line.
Refuse = Callable[[CallTrace, ErrorCode, str], ToolError]


class GovernedCalls:
    """A boundary's governed path: requesting an approval, resuming, the one dispatch.

    Args:
        store: the store the calls are recorded in.
        tools: the boundary's registered tools, by name.
        runner: runs an approved call's tool (the steps every call that runs takes).
        replay_wait_s: the longest wait for the outcome of a permit another resumer holds.

    """

    def __init__(
        self,
        store: Store,
        tools: Mapping[str, RegisteredTool],
        runner: CallRunner,
        replay_wait_s: float,
    ) -> None:
        self._store = store
        self._tools = tools
        self._runner = runner
        self._replay_wait_s = replay_wait_s

    async def request(
        self,
        tool: RegisteredTool,
        ctx: RunContext,
        envelope: ToolEnvelope,
        request: bytes,
        trace: CallTrace,
        *,
        refuse: Refuse,
        duplicate: Duplicate,
    ) -> AgentReply | None:
        """A governed tool's call: recorded waiting for approval; None to run it at once.

        The tool's policy (``ToolSpec.approval``) decides; a call it lets through runs as
        any other and its record holds no approval. A used (run, tool call id) is a
        re-entry (:meth:`reenter`).
        """
        run_id, tool_call_id = ctx.run_id, envelope.tool_call_id
        call = ToolCall(
            run_id=run_id,
            tool_call_id=tool_call_id,
            invocation_id=invocation_id(run_id, tool_call_id),
            tool=envelope.tool,
        )
        if not tool.needs_approval(msgspec.json.decode(request), call):
            return None
        approval_id = new_approval_id()
        spec = tool.spec
        waits = min(spec.approval_timeout, self._store.settings.ttl)
        try:
            await self._runner.commit(
                trace,
                "ApprovalRequested",
                self._store.writer.request_approval(
                    run_id,
                    tool_call_id,
                    envelope.tool,
                    request,
                    approval_id=approval_id,
                    approval_expires_at_ms=now_ms() + milliseconds(waits),
                    log_refusals="not_duplicates",
                    requested_by=ctx.requester or run_identity(run_id),
                    approvals_required=spec.approvals_required,
                ),
            )
        except Refused as refused:
            if refused.error_code is None:
                return trace.error(ErrorCode.STORE_UNAVAILABLE, recorded=False)
            if refused.error_code is ErrorCode.DUPLICATE_TOOL_CALL:
                return await self.reenter(trace, run_id, envelope.tool, request, duplicate)
            return refuse(trace, refused.error_code, "create")
        except RecordExpired:  # a creation resent by the client's retry found it expired
            return trace.error(ErrorCode.RECORD_EXPIRED, recorded=True)
        except StoreUnavailable:
            return trace.error(ErrorCode.STORE_UNAVAILABLE, recorded=False)
        return _pending(trace, approval_id)

    async def reenter(
        self, trace: CallTrace, run_id: str, tool: str, request: bytes, duplicate: Duplicate
    ) -> AgentReply:
        """A governed tool called again with a used (run, tool call id).

        When the record is a governed call of this tool with this very request, this is
        the framework resuming it: the same as :meth:`resume`. Anything else is a
        duplicate, answered by ``duplicate`` (refused, or replayed with ``"replay"``).
        """
        tool_call_id = trace.ids["tool_call_id"]
        assert tool_call_id is not None  # past preflight: a safe id
        try:
            record = await self._runner.bounded(self._store.reader.get(run_id, tool_call_id))
        except StoreUnavailable:
            return trace.error(ErrorCode.STORE_UNAVAILABLE, recorded=False)
        except SealBroken:  # its sealed request was altered or moved: it never runs
            return trace.error(ErrorCode.APPROVED_REQUEST_CHANGED, recorded=False)
        state = record.state if record is not None else None
        if (
            record is None
            or state is None
            or state.approval_id is None
            or state.tool != tool
            or state.request_sha256 != (await self._store.reader.digest_of(run_id))(request)
        ):
            return await duplicate(trace, run_id, tool, request)
        return await self._resumed(trace, record)

    async def resume(self, ctx: RunContext, tool_call_id: str, trace: CallTrace) -> AgentReply:
        """Go on with a governed call of ``ctx``'s run (see ``ToolBoundary.resume``)."""
        if not self._store.keys.accepts_tool_call_id(tool_call_id):
            return trace.error(ErrorCode.INVALID_TOOL_CALL_ID, recorded=False)
        if not is_run_id(ctx.run_id):
            return trace.error(ErrorCode.RUN_MISMATCH, recorded=False)
        try:
            record = await self._runner.bounded(self._store.reader.get(ctx.run_id, tool_call_id))
        except StoreUnavailable:
            return trace.error(ErrorCode.STORE_UNAVAILABLE, recorded=False)
        except SealBroken:  # its sealed request was altered or moved: it never runs
            return trace.error(ErrorCode.APPROVED_REQUEST_CHANGED, recorded=False)
        if record is None:
            return trace.error(ErrorCode.RECORD_EXPIRED, recorded=False)
        return await self._resumed(trace, record)

    async def _resumed(
        self, trace: CallTrace, record: InvocationRecord, *, again: bool = True
    ) -> AgentReply:
        """What resuming ``record`` answers: pending, its one dispatch, or its outcome."""
        state = record.state
        if record.erased_at_ms is not None and state.stage in _NOT_RUN:
            # An erased run's governed call never runs: its frozen request is gone.
            return trace.error(ErrorCode.RUN_ERASED, recorded=False)
        bounded = self._runner.bounded
        try:
            if state.stage is Stage.AWAITING_APPROVAL:
                due = state.approval_expires_at_ms
                if state.approval_id is not None and (due is None or now_ms() < due):
                    return _pending(trace, state.approval_id)
                expired = await bounded(
                    self._store.decisions.expire(state.run_id, state.tool_call_id)
                )
                if not expired and again:  # decided meanwhile: go on from the decision
                    fresh = await bounded(self._store.reader.get(state.run_id, state.tool_call_id))
                    if fresh is not None:
                        return await self._resumed(trace, fresh, again=False)
            elif state.stage is Stage.APPROVED:
                dispatched = await self._dispatch(trace, record)
                if dispatched is not None:
                    return dispatched
        except StoreUnavailable:
            return trace.error(ErrorCode.STORE_UNAVAILABLE, recorded=False)
        except CanonError:  # the record went (NotAwaitingApproval): its outcome says so
            pass
        return await self._outcome(trace, state, record.request)

    async def _dispatch(self, trace: CallTrace, record: InvocationRecord) -> AgentReply | None:
        """Run an approved call once, under the one permit its journal grants.

        None when another resumer took the permit (or the call moved on): its outcome
        answers.
        """
        state = record.state
        tool = self._tools.get(state.tool)
        if tool is None:
            return trace.error(ErrorCode.UNKNOWN_TOOL, recorded=False)
        if not tool.spec.authorized:
            return trace.error(ErrorCode.UNAUTHORIZED, recorded=False)
        head = head_of(state, record.expires_at_ms)
        digest_of = await self._store.reader.digest_of(state.run_id)
        digest = digest_of(record.request)
        try:
            permit: Permit = await self._runner.bounded(
                self._store.writer.dispatch(head, state.tool, digest)
            )
        except PermitRefused as refused:
            return await self._refused(trace, head, refused)
        head = trace.commit("Dispatched", permit.head)
        call = ToolCall(
            run_id=state.run_id,
            tool_call_id=state.tool_call_id,
            invocation_id=record.invocation_id,
            tool=state.tool,
        )
        try:
            request = permit.request
            if request is None or digest_of(request) != digest:
                # Swapped between the read and the permit: the permit covers the digest
                # the journal froze, and these bytes do not have it. Nothing runs.
                return await self._end(trace, head, ErrorCode.APPROVED_REQUEST_CHANGED)
            return await self._runner.execute(tool, call, request, head, trace)
        except RecordExpired:
            return trace.error(ErrorCode.RECORD_EXPIRED, recorded=True)
        except (StoreUnavailable, Refused):
            return trace.error(ErrorCode.STORE_UNAVAILABLE, recorded=True)

    async def _refused(
        self, trace: CallTrace, head: Head, refused: PermitRefused
    ) -> AgentReply | None:
        """What a refused permit answers; None when the call moved on (its outcome does)."""
        code = refused.error_code
        if code is ErrorCode.APPROVAL_EXPIRED:
            with contextlib.suppress(CanonError):
                await self._runner.bounded(
                    self._store.decisions.expire(head.run_id, head.tool_call_id)
                )
            return None
        if code in _HOLDS_THE_CALL:
            return trace.error(code, recorded=False)
        if code in _ENDS_THE_CALL:
            assert code is not None
            trace.logger.error(
                "dispatch_refused", **trace.ids, error_code=code.value, where=refused.why
            )
            return await self._end(trace, head, code, refused.why)
        return None

    async def _end(
        self, trace: CallTrace, head: Head, code: ErrorCode, why: str = ""
    ) -> AgentReply:
        """End a call that may not run with ``code``, its reason in its failure detail.

        Best effort: a record so altered that the append is refused too is left as it
        is (nothing ran, and ``canon verify`` shows it).
        """
        reason = _WHY.get(code) or f"the record disagrees with its journal ({why or 'record'})"
        limit = self._store.settings.limits.failure_detail_bytes
        detail = governance_detail(reason, limit)
        try:
            await self._runner.commit(
                trace, "Failed", self._store.writer.fail(head, code, failure_detail=detail), code
            )
        except (Refused, StoreUnavailable):
            return trace.error(code, recorded=False)
        return trace.error(code, recorded=True)

    async def _outcome(
        self, trace: CallTrace, state: InvocationState, request: bytes
    ) -> AgentReply:
        """A governed call's recorded reply, waiting a while for one still running."""
        try:
            reply = await replay_duplicate(
                self._store.reader,
                self._runner.bounded,
                run_id=state.run_id,
                tool_call_id=state.tool_call_id,
                tool=state.tool,
                request=request,
                wait_s=self._replay_wait_s,
                # Taken by a process that died: answered at once, never run again.
                on_lapsed="answer",
            )
        except StoreUnavailable:
            return trace.error(ErrorCode.STORE_UNAVAILABLE, recorded=False)
        if isinstance(reply, Abandoned) or (
            isinstance(reply, ToolError) and reply.error_code is ErrorCode.DUPLICATE_TOOL_CALL
        ):
            # Still running elsewhere past the wait, or taken by a process that died.
            return trace.replay(trace.error(ErrorCode.ALREADY_DISPATCHED, recorded=True))
        return trace.replay(reply)


def _pending(trace: CallTrace, approval_id: str) -> ApprovalPending:
    """The reply to a call waiting for a decision."""
    tool_call_id, invocation = trace.ids["tool_call_id"], trace.invocation_id
    assert tool_call_id is not None and invocation is not None  # past preflight
    return ApprovalPending(
        tool_call_id=tool_call_id, invocation_id=invocation, approval_id=approval_id
    )
