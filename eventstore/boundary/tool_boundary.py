"""``ToolBoundary``: the one way a harness runs a tool.

Order of one call: preflight (nothing executed; a refusal goes on the run's refusal
log, nothing else is stored) → the creation script
(run state, pause, duplicate and budgets, checked atomically with the record's creation)
→ executor → raw response stored complete → projector → bounded result stored → the
agent receives that result, or a stable error code with its fixed message (for a size
error, the one naming the limit that was hit; for a tool that opted in with
``ToolSpec.error_result``, EXECUTION_FAILED with the tool's own error text, scrubbed,
bounded and stored as the failed record's agent result first). Nothing raised by a tool,
a projector, the input or Redis escapes to the agent.

Three concerns live in modules of their own: answering a retried call from its record
(:mod:`eventstore.boundary.duplicates`), closing the record of a call cut short by its
caller (:mod:`eventstore.boundary.interrupts`) and the OpenTelemetry span of each call
(:mod:`eventstore.boundary.tracing`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import math
import time
from collections.abc import Awaitable, Coroutine, Mapping
from types import MappingProxyType
from typing import Any, Final, Literal

import msgspec

from eventstore.approvals import take_permit
from eventstore.boundary.call_stops import (
    CallStop,
    checked_policy,
    error_text_result,
    too_large,
    tool_failed,
)
from eventstore.boundary.call_trace import CallTrace
from eventstore.boundary.contracts import (
    AgentReply,
    ApprovalPending,
    Projection,
    RunContext,
    ToolCall,
    ToolEnvelope,
    ToolError,
    ToolResult,
    ToolSpec,
)
from eventstore.boundary.duplicates import replay_duplicate
from eventstore.boundary.interrupts import Interruptions, caller_cancelled
from eventstore.boundary.registered_tools import (
    RegisteredTool,
    ToolRaised,
    call_tool_function,
    check_tools,
)
from eventstore.boundary.tool_threads import ToolThreads
from eventstore.boundary.tracing import InvocationSpan, tracing
from eventstore.decisions import new_approval_id
from eventstore.errors import (
    CanonError,
    InvalidArgument,
    RecordExpired,
    Refused,
    StoreUnavailable,
)
from eventstore.reader import InvocationRecord
from eventstore.settings import milliseconds
from eventstore.store import Store
from eventstore.wire.deadlines import Deadlines
from eventstore.writer import Head, now_ms, preflighted
from machine.codes import ErrorCode, EvidenceStatus, Stage
from machine.events import payload_digest
from machine.failure_detail import FailureDetailPolicy
from machine.fold import InvocationState
from machine.ids import invocation_id, is_run_id
from machine.limits import LimitHit, LimitName, Limits, utf8_size
from machine.requests import InvalidRequest, canonical_request
from machine.results import decode_result, encode_raw, encode_result

_encoder: Final = msgspec.json.Encoder()
_READY_EVIDENCE: Final = frozenset({EvidenceStatus.EVIDENCE_FOUND, EvidenceStatus.NO_EVIDENCE})


#: What a boundary does with a second call of a (run, tool call id): see ToolBoundary.
OnDuplicate = Literal["refuse", "replay"]
#: Default longest wait of a replayed call for a first call still PROJECTING.
DEFAULT_REPLAY_WAIT_S: Final = 10.0


class ToolBoundary:
    """Runs tools for one store with preflight, limits and safe errors.

    Args:
        store: the canonical store.
        tools: the tools this boundary may run, by name.
        store_timeout_s: the longest one store operation may take before the call
            answers STORE_UNAVAILABLE (default: twice the store's command timeout,
            which leaves room for its retries).
        on_duplicate: what a second call with a used (run, tool call id) gets.
            ``"refuse"`` (default): DUPLICATE_TOOL_CALL. ``"replay"``: the same tool
            with the same canonical request gets the first call's recorded reply
            (see :mod:`eventstore.boundary.duplicates`); the tool is not run again and no
            budget is spent; anything else under that id is still DUPLICATE_TOOL_CALL.
        replay_wait_s: with ``"replay"``, the longest wait for a first call that is
            still PROJECTING (0: do not wait).
        max_tool_threads: how many plain executors and projectors may run at once, in
            this boundary's own threads (see :mod:`eventstore.boundary.tool_threads`; default:
            the event loop's default executor).
        failure_detail: what the record keeps, for the harness only, when an executor
            or projector raises (:mod:`machine.failure_detail`): ``"full"`` (default:
            type, message, traceback), ``"type"`` (the type name) or ``"none"``. A
            payload refused for its size raised nothing: its record keeps the limit that
            was hit and the sizes, under every policy (they hold no payload text).

    Raises:
        InvalidArgument: a tool is registered under a name the store refuses
            (:func:`machine.ids.is_tool_name`), or with a time limit that is not a
            positive number of seconds, or ``on_duplicate`` / ``replay_wait_s`` is not
            one of the accepted values, or ``max_tool_threads`` is below 1, or
            ``failure_detail`` is not a policy, or a tool's ``error_result`` is not
            callable; caught here, not on its first call.

    """

    def __init__(
        self,
        store: Store,
        tools: Mapping[str, ToolSpec],
        *,
        store_timeout_s: float | None = None,
        on_duplicate: OnDuplicate = "refuse",
        replay_wait_s: float = DEFAULT_REPLAY_WAIT_S,
        max_tool_threads: int | None = None,
        failure_detail: FailureDetailPolicy = "full",
    ) -> None:
        check_tools(tools)
        if on_duplicate not in ("refuse", "replay"):
            raise InvalidArgument('on_duplicate must be "refuse" or "replay"')
        if not (isinstance(replay_wait_s, int | float) and 0 <= replay_wait_s < math.inf):
            raise InvalidArgument("replay_wait_s must be a finite number of seconds, 0 or more")
        self._failure_detail = checked_policy(failure_detail)
        self._store = store
        self._threads = ToolThreads(max_tool_threads)
        executor_deadlines: dict[float, Deadlines] = {}
        self._tools = {
            name: RegisteredTool(spec, executor_deadlines, self._threads)
            for name, spec in tools.items()
        }
        self._specs: Mapping[str, ToolSpec] = MappingProxyType(dict(tools))
        self._limits: Limits = store.settings.limits
        self._store_timeout_s = store_timeout_s or store.settings.timeout_s * 2
        self._store_deadlines = Deadlines(self._store_timeout_s)
        self._replay = on_duplicate == "replay"
        self._replay_wait_s = float(replay_wait_s)
        self._interruptions = Interruptions(store.writer, store.reader, self._store_timeout_s)
        # Every code from the start: the keys never change, so a metrics scrape in another
        # thread can copy the dict while calls count into it.
        self._refused: dict[ErrorCode, int] = dict.fromkeys(ErrorCode, 0)

    def close(self, *, wait: bool = False, timeout_s: float | None = None) -> None:
        """Stop this boundary's own tool threads; see :meth:`ToolThreads.close`."""
        self._threads.close(wait=wait, timeout_s=timeout_s)

    @property
    def stuck_tool_threads(self) -> int:
        """Tool threads still running a tool whose call ended (time limit, cancellation).

        When every thread of the pool is stuck, plain tools are refused at once
        (EXECUTION_FAILED) until some return; see :mod:`eventstore.boundary.tool_threads`.
        """
        return self._threads.stuck

    @property
    def refusals(self) -> dict[ErrorCode, int]:
        """Calls this boundary refused before any record existed, by code, since it was built.

        A refusal is decided in preflight, by the creation script (run state, pause,
        duplicate, budgets) or by a duplicate that no record answers: the refusals a
        run's refusal log keeps, here also those naming no run that exists. A copy,
        with every code (0 for those never seen). Counted in memory, only when a call is
        refused: a call that is not refused costs nothing more. A view
        (:meth:`answering_duplicates`) counts into the same counts.
        """
        return dict(self._refused)

    @property
    def store(self) -> Store:
        """The store this boundary records its calls in (to read a call's record)."""
        return self._store

    @property
    def tools(self) -> Mapping[str, ToolSpec]:
        """The tools this boundary runs, by name, as registered (a read-only view).

        For the adapters that build a framework's tool objects from a boundary (which
        calls are governed, what the model is told).
        """
        return self._specs

    @property
    def store_timeout_s(self) -> float:
        """The longest one store operation of a call may take (see ``store_timeout_s``)."""
        return self._store_timeout_s

    def answering_duplicates(self, on_duplicate: OnDuplicate) -> ToolBoundary:
        """This boundary, answering a used (run, tool call id) as ``on_duplicate`` says.

        For a framework whose own resume sends the same calls again (LangGraph re-runs a
        node): the view shares this boundary's store, tools, threads and timers, and
        differs only in what a duplicate gets. Returns this boundary when it already
        answers so.

        Raises:
            InvalidArgument: ``on_duplicate`` is not ``"refuse"`` or ``"replay"``.

        """
        if on_duplicate not in ("refuse", "replay"):
            raise InvalidArgument('on_duplicate must be "refuse" or "replay"')
        replay = on_duplicate == "replay"
        if replay is self._replay:
            return self
        view = copy.copy(self)
        view._replay = replay
        return view

    async def invoke(self, ctx: RunContext, envelope: ToolEnvelope) -> AgentReply:
        """Run one tool call and return what the agent may see.

        Never raises for tool, projector, input or store failures. The caller's own
        cancellation, and a ``KeyboardInterrupt`` or ``SystemExit`` (from the tool or
        the process), propagate once the call's record, if it has one, is ERROR with
        CALLER_CANCELLED (best-effort: see :mod:`eventstore.boundary.interrupts`).

        Raises:
            WrongEventLoop: the store runs in another event loop (a programming error,
                raised before anything is checked or written).

        """
        self._store.check_loop()
        started = time.perf_counter()
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("ToolBoundary.invoke must run in an asyncio task")
        trace = CallTrace(ctx, envelope, task)
        tool = self._tool_of(envelope)
        tool_name = envelope.tool if tool is not None else None
        return await self._traced(trace, tool_name, started, self._invoke(ctx, envelope, trace))

    async def resume(self, ctx: RunContext, tool_call_id: str) -> AgentReply:
        """Go on with a governed call of ``ctx``'s run: run its frozen request once approved.

        What the call's record says decides, never new arguments: waiting for a decision,
        :class:`ApprovalPending` again (or ERROR APPROVAL_EXPIRED once its approval
        expired, recorded now); approved, the one dispatch permit is taken atomically and
        the recorded request, checked against the approved digest, is run, exactly as a
        first call runs; denied or ended, its recorded reply. A resume that loses the
        permit to another (in this process or any other) waits, as a replayed duplicate
        does (``replay_wait_s``), for that one's recorded reply, then answers
        ALREADY_DISPATCHED; a call whose dispatch was taken by a process that died is
        never run again by itself. A paused run (or namespace) gets RUN_PAUSED
        (EXECUTION_PAUSED) and the call stays approved. A call that is not governed gets
        its recorded reply. Never raises for tool, projector or store failures, as
        :meth:`invoke`.

        The same happens when a framework calls the tool again with the same run, tool
        call id and request (every framework resumes so): see :meth:`invoke`.

        Raises:
            WrongEventLoop: the store runs in another event loop.

        """
        self._store.check_loop()
        started = time.perf_counter()
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("ToolBoundary.resume must run in an asyncio task")
        envelope = ToolEnvelope(run_id=ctx.run_id, tool_call_id=tool_call_id, tool="", arguments={})
        trace = CallTrace(ctx, envelope, task)
        return await self._traced(trace, None, started, self._resume(ctx, tool_call_id, trace))

    async def _traced(
        self,
        trace: CallTrace,
        tool_name: str | None,
        started: float,
        work: Coroutine[Any, Any, AgentReply],
    ) -> AgentReply:
        """Await ``work`` within the call's span; log its outcome; no failure escapes."""
        # Without the otel extra or a configured provider, no span is built.
        span = InvocationSpan(tool_name, trace.ids) if tracing() else None
        try:
            reply = await work
        except Exception as exc:  # a bug of ours must still not reach the agent
            trace.logger.error("invocation_crashed", error_type=type(exc).__name__)
            reply = trace.error(ErrorCode.STORE_UNAVAILABLE, recorded=False)
        except BaseException:
            if span is not None:
                span.end(None)
            raise
        trace.finish(reply, tool_name, started)
        if span is not None:
            span.end(reply, replayed=trace.replayed)
        return reply

    def _tool_of(self, envelope: ToolEnvelope) -> RegisteredTool | None:
        """The named tool, or None (also for a name that is not even a string)."""
        return self._tools.get(envelope.tool) if isinstance(envelope.tool, str) else None

    def _preflight(self, ctx: RunContext, envelope: ToolEnvelope) -> tuple[RegisteredTool, bytes]:
        """Checks that need no I/O, in the order the specification lists them."""
        # The namespace's key layout decides (the legacy one holds no ':' in a call id).
        if not self._store.keys.accepts_tool_call_id(envelope.tool_call_id):
            raise CallStop(ErrorCode.INVALID_TOOL_CALL_ID)
        if not is_run_id(ctx.run_id) or envelope.run_id != ctx.run_id:
            raise CallStop(ErrorCode.RUN_MISMATCH)
        limits = self._limits
        try:
            request = canonical_request(
                envelope.arguments,
                max_depth=limits.json_depth,
                max_text_bytes=4 * limits.request_bytes,
            )
        except InvalidRequest:
            raise CallStop(ErrorCode.INVALID_INPUT) from None
        except OverflowError:
            # Too long even to parse: over the limit, by how much was not measured.
            hit = LimitHit(name=LimitName.REQUEST, limit_bytes=limits.request_bytes)
            raise CallStop(hit.code, limit=hit) from None
        if len(request) > limits.request_bytes:
            hit = LimitHit(
                name=LimitName.REQUEST,
                limit_bytes=limits.request_bytes,
                actual_bytes=len(request),
            )
            raise CallStop(hit.code, limit=hit)
        tool = self._tool_of(envelope)
        if tool is None:
            raise CallStop(ErrorCode.UNKNOWN_TOOL)
        if not tool.spec.authorized:
            raise CallStop(ErrorCode.UNAUTHORIZED)
        if not tool.spec.read_only and not tool.governed:
            raise CallStop(ErrorCode.NOT_READ_ONLY)
        return tool, request

    async def _commit(
        self,
        trace: CallTrace,
        event_type: str,
        operation: Awaitable[Head],
        code: ErrorCode | None = None,
    ) -> Head:
        """Write one lifecycle event within the store timeout and note it in ``trace``."""
        try:
            head = await self._store_deadlines.run(operation, trace.task)
        except TimeoutError:
            raise StoreUnavailable("TimeoutError") from None
        return trace.commit(event_type, head, code)

    async def _bounded(self, operation: Awaitable[Any]) -> Any:
        """Await one store read within the store timeout (StoreUnavailable past it)."""
        try:
            return await self._store_deadlines.run(operation)
        except TimeoutError:
            raise StoreUnavailable("TimeoutError") from None

    async def _invoke(
        self, ctx: RunContext, envelope: ToolEnvelope, trace: CallTrace
    ) -> AgentReply:
        try:
            tool, request = self._preflight(ctx, envelope)
        except CallStop as stop:
            await self._record_refusal(ctx.run_id, envelope.tool, envelope.tool_call_id, stop.code)
            return self._refuse(trace, stop.code, "preflight", stop.limit)
        run_id, tool_call_id = ctx.run_id, envelope.tool_call_id
        if tool.governed:
            governed = await self._governed(tool, ctx, envelope, request, trace)
            if governed is not None:
                return governed
        # Built before it is sent, so that an interrupted creation can be sent again.
        creation = preflighted(run_id, tool_call_id, envelope.tool, request)
        writer = self._store.writer
        try:
            head = await self._commit(
                trace,
                "Preflighted",
                writer.append(
                    creation,
                    request,
                    run_id=run_id,
                    tool_call_id=tool_call_id,
                    # A duplicate answered from its record is no refusal; one that nothing
                    # recorded answers is recorded by _duplicate.
                    log_refusals="not_duplicates" if self._replay or tool.governed else "all",
                ),
            )
        except Refused as refused:
            if refused.error_code is None:
                return trace.error(ErrorCode.STORE_UNAVAILABLE, recorded=False)
            if refused.error_code is ErrorCode.DUPLICATE_TOOL_CALL and tool.governed:
                return await self._reenter(trace, run_id, envelope.tool, request)
            if refused.error_code is ErrorCode.DUPLICATE_TOOL_CALL and self._replay:
                return await self._replay_duplicate(trace, run_id, envelope.tool, request)
            return self._refuse(trace, refused.error_code, "create")
        except StoreUnavailable:
            return trace.error(ErrorCode.STORE_UNAVAILABLE, recorded=False)
        except BaseException:
            await self._interruptions.close(None, (creation, request), trace.interrupted)
            raise
        call = ToolCall(
            run_id=run_id,
            tool_call_id=tool_call_id,
            invocation_id=trace.invocation_id or invocation_id(run_id, tool_call_id),
            tool=envelope.tool,
        )
        try:
            return await self._execute(tool, call, request, head, trace)
        except RecordExpired:
            return trace.error(ErrorCode.RECORD_EXPIRED, recorded=True)
        except (StoreUnavailable, Refused):
            return trace.error(ErrorCode.STORE_UNAVAILABLE, recorded=True)

    # Governed calls: recorded frozen, waiting for an operator, run once on resume.

    async def _governed(
        self,
        tool: RegisteredTool,
        ctx: RunContext,
        envelope: ToolEnvelope,
        request: bytes,
        trace: CallTrace,
    ) -> AgentReply | None:
        """A governed tool's call: recorded waiting for approval; None to run it at once.

        The tool's policy (``ToolSpec.approval``) decides; a call it lets through runs as
        any other and its record holds no approval. A used (run, tool call id) is a
        re-entry (:meth:`_reenter`).
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
        waits = min(tool.spec.approval_timeout, self._store.settings.ttl)
        try:
            await self._commit(
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
                ),
            )
        except Refused as refused:
            if refused.error_code is None:
                return trace.error(ErrorCode.STORE_UNAVAILABLE, recorded=False)
            if refused.error_code is ErrorCode.DUPLICATE_TOOL_CALL:
                return await self._reenter(trace, run_id, envelope.tool, request)
            return self._refuse(trace, refused.error_code, "create")
        except StoreUnavailable:
            return trace.error(ErrorCode.STORE_UNAVAILABLE, recorded=False)
        return self._pending(trace, approval_id)

    def _pending(self, trace: CallTrace, approval_id: str) -> ApprovalPending:
        tool_call_id, invocation = trace.ids["tool_call_id"], trace.invocation_id
        assert tool_call_id is not None and invocation is not None  # past preflight
        return ApprovalPending(
            tool_call_id=tool_call_id, invocation_id=invocation, approval_id=approval_id
        )

    async def _reenter(
        self, trace: CallTrace, run_id: str, tool: str, request: bytes
    ) -> AgentReply:
        """A governed tool called again with a used (run, tool call id).

        When the record is a governed call of this tool with this very request, this is
        the framework resuming it: the same as :meth:`resume`. Anything else is a
        duplicate, answered as any other (refused, or replayed with ``"replay"``).
        """
        tool_call_id = trace.ids["tool_call_id"]
        assert tool_call_id is not None  # past preflight: a safe id
        try:
            record = await self._bounded(self._store.reader.get(run_id, tool_call_id))
        except StoreUnavailable:
            return trace.error(ErrorCode.STORE_UNAVAILABLE, recorded=False)
        state = record.state if record is not None else None
        if (
            record is None
            or state is None
            or state.approval_id is None
            or state.tool != tool
            or state.request_sha256 != payload_digest(request)
        ):
            return await self._duplicate(trace, run_id, tool, request)
        return await self._resumed(trace, record)

    async def _duplicate(
        self, trace: CallTrace, run_id: str, tool: str, request: bytes
    ) -> AgentReply:
        """A duplicate the creation script did not log: replayed, or refused and logged."""
        if self._replay:
            return await self._replay_duplicate(trace, run_id, tool, request)
        code = ErrorCode.DUPLICATE_TOOL_CALL
        await self._record_refusal(run_id, tool, trace.ids["tool_call_id"], code)
        return self._refuse(trace, code, "create")

    async def _resume(self, ctx: RunContext, tool_call_id: str, trace: CallTrace) -> AgentReply:
        if not self._store.keys.accepts_tool_call_id(tool_call_id):
            return trace.error(ErrorCode.INVALID_TOOL_CALL_ID, recorded=False)
        if not is_run_id(ctx.run_id):
            return trace.error(ErrorCode.RUN_MISMATCH, recorded=False)
        try:
            record = await self._bounded(self._store.reader.get(ctx.run_id, tool_call_id))
        except StoreUnavailable:
            return trace.error(ErrorCode.STORE_UNAVAILABLE, recorded=False)
        if record is None:
            return trace.error(ErrorCode.RECORD_EXPIRED, recorded=False)
        return await self._resumed(trace, record)

    async def _resumed(
        self, trace: CallTrace, record: InvocationRecord, *, again: bool = True
    ) -> AgentReply:
        """What resuming ``record`` answers: pending, its one dispatch, or its outcome."""
        state = record.state
        try:
            if state.stage is Stage.AWAITING_APPROVAL:
                due = state.approval_expires_at_ms
                if state.approval_id is not None and (due is None or now_ms() < due):
                    return self._pending(trace, state.approval_id)
                expired = await self._bounded(
                    self._store.decisions.expire(state.run_id, state.tool_call_id)
                )
                if not expired and again:  # decided meanwhile: go on from the decision
                    fresh = await self._bounded(
                        self._store.reader.get(state.run_id, state.tool_call_id)
                    )
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
        """Run an approved call once: its recorded request, under the one permit.

        None when another resumer took the permit (or the call moved on): its outcome
        answers.
        """
        state = record.state
        tool = self._tools.get(state.tool)
        if tool is None:
            return trace.error(ErrorCode.UNKNOWN_TOOL, recorded=False)
        if not tool.spec.authorized:
            return trace.error(ErrorCode.UNAUTHORIZED, recorded=False)
        if payload_digest(record.request) != state.request_sha256:
            # The bytes in Redis are not the ones approved: nothing may run them.
            trace.logger.error("approved_request_changed", **trace.ids)
            return trace.error(ErrorCode.APPROVED_REQUEST_CHANGED, recorded=False)
        permit = await self._bounded(take_permit(self._store, state, record.expires_at_ms))
        if permit.head is None:
            if permit.stage is Stage.APPROVED and permit.code is not None:  # paused
                return trace.error(permit.code, recorded=False)
            return None
        head = trace.commit("Dispatched", permit.head)
        call = ToolCall(
            run_id=state.run_id,
            tool_call_id=state.tool_call_id,
            invocation_id=record.invocation_id,
            tool=state.tool,
        )
        try:
            return await self._execute(tool, call, record.request, head, trace)
        except RecordExpired:
            return trace.error(ErrorCode.RECORD_EXPIRED, recorded=True)
        except (StoreUnavailable, Refused):
            return trace.error(ErrorCode.STORE_UNAVAILABLE, recorded=True)

    async def _outcome(
        self, trace: CallTrace, state: InvocationState, request: bytes
    ) -> AgentReply:
        """A governed call's recorded reply, waiting a while for one still running."""
        try:
            reply = await replay_duplicate(
                self._store.reader,
                self._bounded,
                run_id=state.run_id,
                tool_call_id=state.tool_call_id,
                tool=state.tool,
                request=request,
                wait_s=self._replay_wait_s,
            )
        except StoreUnavailable:
            return trace.error(ErrorCode.STORE_UNAVAILABLE, recorded=False)
        if isinstance(reply, ToolError) and reply.error_code is ErrorCode.DUPLICATE_TOOL_CALL:
            # Still running elsewhere past the wait, or taken by a process that died.
            return trace.replay(trace.error(ErrorCode.ALREADY_DISPATCHED, recorded=True))
        return trace.replay(reply)

    def _refuse(
        self, trace: CallTrace, code: ErrorCode, stage: str, limit: LimitHit | None = None
    ) -> ToolError:
        """Count a refusal (see :attr:`refusals`), then log it and return its reply."""
        self._refused[code] += 1
        return trace.refuse(code, stage, limit)

    async def _record_refusal(
        self, run_id: object, tool: object, tool_call_id: object, code: ErrorCode
    ) -> None:
        """Put a refusal decided here on the run's refusal log: one script call, bounded.

        Only for a valid run id of a run that exists (the script checks); the refusal is
        answered whatever happens to this write: an unavailable store loses the entry,
        never the answer.
        """
        if not isinstance(run_id, str) or not is_run_id(run_id):
            return
        # Unavailable, or an ACL user not allowed the log: the answer stays the refusal.
        with contextlib.suppress(CanonError):
            await self._bounded(self._store.writer.record_refusal(run_id, tool, tool_call_id, code))

    async def _replay_duplicate(
        self, trace: CallTrace, run_id: str, tool: str, request: bytes
    ) -> AgentReply:
        """Answer a duplicate from the first call's record (``on_duplicate="replay"``)."""
        tool_call_id = trace.ids["tool_call_id"]
        assert tool_call_id is not None  # past preflight: a safe id
        try:
            reply = await replay_duplicate(
                self._store.reader,
                self._bounded,
                run_id=run_id,
                tool_call_id=tool_call_id,
                tool=tool,
                request=request,
                wait_s=self._replay_wait_s,
            )
        except StoreUnavailable:
            return trace.error(ErrorCode.STORE_UNAVAILABLE, recorded=False)
        if isinstance(reply, ToolError) and reply.invocation_id is None:
            # Nothing recorded answers it (another request, or the record is gone).
            await self._record_refusal(run_id, tool, tool_call_id, reply.error_code)
            return self._refuse(trace, reply.error_code, "replay")
        return trace.replay(reply)

    async def _execute(
        self, tool: RegisteredTool, call: ToolCall, request: bytes, head: Head, trace: CallTrace
    ) -> AgentReply:
        """Executor, raw storage, projector, result storage; failures end in ERROR."""
        limits = self._limits
        arguments = msgspec.json.decode(request)
        try:
            try:
                raw_value = await tool.execute(arguments, call, trace.task)
            except ToolRaised as raised:
                raise self._tool_raised(tool, raised.error, len(request), trace) from None
            except Exception as exc:
                raise self._failed(ErrorCode.EXECUTION_FAILED, exc, len(request)) from None
            except asyncio.CancelledError as exc:
                if caller_cancelled(trace.task):
                    raise
                # The tool's own CancelledError, not its caller's: a tool failure.
                raise self._failed(ErrorCode.EXECUTION_FAILED, exc, len(request)) from None
            try:
                raw = encode_raw(raw_value)
            except (TypeError, ValueError, OverflowError):
                raise CallStop(ErrorCode.SERIALIZATION_FAILED) from None
            if len(raw) > limits.raw_bytes or len(request) + len(raw) > limits.record_bytes:
                over_raw = len(raw) > limits.raw_bytes
                raise too_large(
                    LimitName.RAW if over_raw else LimitName.RECORD,
                    len(raw) if over_raw else len(request) + len(raw),
                    limits,
                    rejected_bytes=len(raw),
                    stored_bytes=len(request),
                )
            head = await self._commit(
                trace, "ProjectingStarted", self._store.writer.start_projecting(head, raw)
            )

            stored = len(request) + len(raw)
            projection, evidence = await self._project(tool, raw_value, call, trace.task, stored)
            try:
                # NaN and Infinity are refused: stored as null, the agent would be shown
                # a value the record does not hold.
                result = encode_result(projection.result)
            except (TypeError, ValueError, OverflowError):
                raise CallStop(ErrorCode.SERIALIZATION_FAILED) from None
            scope_bytes = utf8_size(projection.scope)
            total = len(request) + len(raw) + len(result) + scope_bytes
            if (
                len(result) > limits.result_bytes
                or scope_bytes > limits.scope_bytes
                or total > limits.record_bytes
            ):
                # Which limit, found only once one was hit: a call within them pays nothing.
                name, measured = next(
                    (name, measured)
                    for name, measured in (
                        (LimitName.RESULT, len(result)),
                        (LimitName.SCOPE, scope_bytes),
                        (LimitName.RECORD, total),
                    )
                    if measured > getattr(limits, name.value)
                )
                raise too_large(
                    name, measured, limits, rejected_bytes=len(result), stored_bytes=stored
                )
            await self._commit(
                trace,
                "Completed",
                self._store.writer.complete(head, result, evidence, projection.scope),
            )
        except CallStop as stop:
            failing = self._store.writer.fail(
                head, stop.code, stop.rejected_bytes, stop.detail, stop.result
            )
            await self._closing_if_cut(
                trace, head, self._commit(trace, "Failed", failing, stop.code)
            )
            # Answered once the record holds it: the agent, a replay and a receipt agree
            # on the tool's text; a size error's message names the limit it hit.
            return trace.error(stop.code, recorded=True, limit=stop.limit, message=stop.message)
        except Exception:
            raise  # store failures: answered by _invoke
        except BaseException:
            # The caller's cancellation, KeyboardInterrupt, SystemExit: close, then go on.
            await self._interruptions.close(head, None, trace.interrupted)
            raise
        return ToolResult(
            # What the record holds, decoded: the agent, a replay and a receipt agree.
            result=decode_result(result),
            evidence_status=evidence,
            scope=projection.scope,
            tool_call_id=call.tool_call_id,
            invocation_id=call.invocation_id,
        )

    async def _closing_if_cut(self, trace: CallTrace, head: Head, step: Awaitable[Head]) -> Head:
        """Await ``step``; if the call is cut short meanwhile, close its record, then go on."""
        try:
            return await step
        except Exception:
            raise
        except BaseException:
            await self._interruptions.close(head, None, trace.interrupted)
            raise

    def _failed(
        self,
        code: ErrorCode,
        exc: BaseException,
        stored_bytes: int,
        result: bytes | None = None,
    ) -> CallStop:
        """The stop of a raising executor or projector, with its failure detail."""
        scrub = self._store.settings.scrub
        return tool_failed(
            code, exc, self._failure_detail, self._limits, stored_bytes, scrub, result
        )

    def _tool_raised(
        self, tool: RegisteredTool, error: Exception, stored_bytes: int, trace: CallTrace
    ) -> CallStop:
        """The stop of an executor that raised ``error``: EXECUTION_FAILED.

        The agent is shown the tool's own text of ``error`` when its ToolSpec opted in
        (``error_result``) and that text can be kept (:func:`error_text_result`).
        """
        error_result = tool.spec.error_result
        if error_result is None:
            return self._failed(ErrorCode.EXECUTION_FAILED, error, stored_bytes)
        try:
            text: object = error_result(error)
        except Exception as exc:  # the harness's callable: the agent gets the fixed message
            trace.logger.warning("error_result_failed", **trace.ids, error_type=type(exc).__name__)
            text = None
        scrub = self._store.settings.scrub
        result = error_text_result(text, self._limits, stored_bytes, scrub)
        return self._failed(ErrorCode.EXECUTION_FAILED, error, stored_bytes, result)

    async def _project(
        self,
        tool: RegisteredTool,
        raw_value: Any,
        call: ToolCall,
        task: asyncio.Task[Any],
        stored_bytes: int,
    ) -> tuple[Projection, EvidenceStatus]:
        """Run the projector; its answer, checked in shape, and its evidence status."""
        try:
            projection = await call_tool_function(
                tool.spec.projector, raw_value, call, threads=tool.projector_threads
            )
        except Exception as exc:
            raise self._failed(ErrorCode.PROJECTION_FAILED, exc, stored_bytes) from None
        except asyncio.CancelledError as exc:
            if caller_cancelled(task):
                raise
            raise self._failed(ErrorCode.PROJECTION_FAILED, exc, stored_bytes) from None
        if not isinstance(projection, Projection) or not isinstance(projection.scope, str):
            raise CallStop(ErrorCode.PROJECTION_FAILED)
        try:
            evidence = EvidenceStatus(projection.evidence_status)
        except ValueError:
            raise CallStop(ErrorCode.INVALID_EVIDENCE_STATUS) from None
        if evidence not in _READY_EVIDENCE:
            raise CallStop(ErrorCode.INVALID_EVIDENCE_STATUS)
        try:
            projection.scope.encode("utf-8")
        except UnicodeEncodeError:
            raise CallStop(ErrorCode.SERIALIZATION_FAILED) from None
        return projection, evidence
