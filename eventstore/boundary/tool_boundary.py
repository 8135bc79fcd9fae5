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
(:mod:`eventstore.boundary.tracing`). A retried read-only call whose first process died
(its lease lapsed) is taken over and run again (:meth:`ToolBoundary._take_over`); the
calls such processes left are settled by :meth:`ToolBoundary.reconcile`
(:mod:`eventstore.boundary.reconciling`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import math
import time
from collections.abc import Coroutine, Mapping
from datetime import timedelta
from types import MappingProxyType
from typing import Any, Final, Literal

from eventstore.boundary.call_stops import CallStop, checked_policy
from eventstore.boundary.call_trace import CallTrace
from eventstore.boundary.contracts import (
    AgentReply,
    RunContext,
    ToolCall,
    ToolEnvelope,
    ToolError,
    ToolSpec,
)
from eventstore.boundary.duplicates import Abandoned, replay_duplicate
from eventstore.boundary.governed import GovernedCalls
from eventstore.boundary.reconciling import Reconciler, ReconcileReport
from eventstore.boundary.registered_tools import RegisteredTool, check_tools
from eventstore.boundary.running import CallRunner
from eventstore.boundary.tool_threads import ToolThreads
from eventstore.boundary.tracing import InvocationSpan, tracing
from eventstore.errors import CanonError, InvalidArgument, RecordExpired, Refused, StoreUnavailable
from eventstore.settings import milliseconds
from eventstore.store import Store
from eventstore.wire.deadlines import Deadlines
from eventstore.writer import preflighted
from machine.codes import ErrorCode
from machine.failure_detail import FailureDetailPolicy
from machine.ids import invocation_id, is_run_id
from machine.limits import LimitHit, LimitName, Limits
from machine.requests import InvalidRequest, canonical_request

#: What a boundary does with a second call of a (run, tool call id): see ToolBoundary.
OnDuplicate = Literal["refuse", "replay"]
#: Default longest wait of a replayed call for a first call still PROJECTING.
DEFAULT_REPLAY_WAIT_S: Final = 10.0
#: How long past its lease a call left in flight waits before a reconcile settles it.
DEFAULT_RECONCILE_GRACE: Final = timedelta(minutes=5)


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
        self._replay = on_duplicate == "replay"
        self._replay_wait_s = float(replay_wait_s)
        self._runner = CallRunner(store, self._store_timeout_s, self._failure_detail)
        self._governed = GovernedCalls(store, self._tools, self._runner, self._replay_wait_s)
        self._reconciler = Reconciler(store, self._tools, self._runner)
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
        return await self._traced(
            trace, None, started, self._governed.resume(ctx, tool_call_id, trace)
        )

    async def reconcile(
        self,
        run_id: str | None = None,
        *,
        grace: timedelta = DEFAULT_RECONCILE_GRACE,
        runs: int = 200,
    ) -> ReconcileReport:
        """Settle the calls of ``run_id`` (else of the latest ``runs`` runs) left in flight.

        A call is left in flight when the process running it died: its lease lapsed,
        ``grace`` ago at least (default 5 minutes). With this boundary's tools, a governed
        call (attempted: its tool may have run) is taken on when its raw response was
        recorded, or settled as its tool's reconcile hook answers (executed: its raw
        response projected; not executed: ERROR RECONCILED_NOT_EXECUTED; unknown, or a
        hook that raises or times out: left); an ungoverned call nobody retried ends
        ERROR ABANDONED. A call its tool cannot settle is left to an operator
        (``store.settle``). Nothing is ever dispatched again; each settlement is an event
        of the call's chain. See :mod:`eventstore.boundary.reconciling`.

        Raises:
            InvalidArgument: ``run_id`` is not a run id, or ``runs`` is not 1 to 2,000.
            StoreUnavailable: Redis failed or timed out while the calls were listed.
            WrongEventLoop: the store runs in another event loop.

        """
        self._store.check_loop()
        if not (isinstance(grace, timedelta) and grace >= timedelta(0)):
            raise InvalidArgument("grace must be a timedelta, 0 or more")
        if not (isinstance(runs, int) and 1 <= runs <= 2000):
            raise InvalidArgument("runs must be a whole number from 1 to 2000")
        return await self._reconciler.reconcile(run_id, grace_ms=milliseconds(grace), runs=runs)

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
            governed = await self._governed.request(
                tool, ctx, envelope, request, trace, refuse=self._refuse, duplicate=self._duplicate
            )
            if governed is not None:
                return governed
        # Built before it is sent, so that an interrupted creation can be sent again.
        creation = preflighted(
            run_id,
            tool_call_id,
            envelope.tool,
            request,
            # Keyed when payloads are encrypted; no await at all on the plain path.
            None
            if self._store.seals is None
            else (await self._store.writer.digest_for(run_id))(request),
        )
        writer = self._store.writer
        try:
            head = await self._runner.commit(
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
                return await self._governed.reenter(
                    trace, run_id, envelope.tool, request, self._duplicate
                )
            if refused.error_code is ErrorCode.DUPLICATE_TOOL_CALL and self._replay:
                return await self._replay_duplicate(trace, run_id, envelope.tool, request)
            return self._refuse(trace, refused.error_code, "create")
        except RecordExpired:  # a creation resent by the client's retry found it expired
            return trace.error(ErrorCode.RECORD_EXPIRED, recorded=True)
        except StoreUnavailable:
            return trace.error(ErrorCode.STORE_UNAVAILABLE, recorded=False)
        except BaseException:
            await self._runner.interruptions.close(None, (creation, request), trace.interrupted)
            raise
        call = ToolCall(
            run_id=run_id,
            tool_call_id=tool_call_id,
            invocation_id=trace.invocation_id or invocation_id(run_id, tool_call_id),
            tool=envelope.tool,
        )
        try:
            return await self._runner.execute(tool, call, request, head, trace)
        except RecordExpired:
            return trace.error(ErrorCode.RECORD_EXPIRED, recorded=True)
        except (StoreUnavailable, Refused):
            return trace.error(ErrorCode.STORE_UNAVAILABLE, recorded=True)

    async def _duplicate(
        self, trace: CallTrace, run_id: str, tool: str, request: bytes
    ) -> AgentReply:
        """A duplicate the creation script did not log: replayed, or refused and logged."""
        if self._replay:
            return await self._replay_duplicate(trace, run_id, tool, request)
        code = ErrorCode.DUPLICATE_TOOL_CALL
        await self._record_refusal(run_id, tool, trace.ids["tool_call_id"], code)
        return self._refuse(trace, code, "create")

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
            await self._runner.bounded(
                self._store.writer.record_refusal(run_id, tool, tool_call_id, code)
            )

    def _may_take_over(self, tool: str) -> bool:
        """Whether a retried call of ``tool`` left by a dead process may run again here.

        Only a registered read-only tool's: running a read-only tool twice changes
        nothing. A side-effecting call is never run again by itself.
        """
        registered = self._tools.get(tool)
        return registered is not None and registered.spec.read_only

    async def _take_over(
        self, trace: CallTrace, tool: str, request: bytes, abandoned: Abandoned
    ) -> AgentReply:
        """Take over a call whose first process died (its lease lapsed) and run it again.

        One record, one outcome: TakenOver joins the call's chain (``lapsed.lua`` judges
        the lease by the server's clock), then the tool runs under this boundary's lease
        as a first call does. A holder still alive (LEASE_HELD) or another retry that took
        it first (a conflict) leaves it theirs: the retry is then answered from the record
        as any replayed duplicate; a run that lost its authority answers its code.
        """
        head = abandoned.head
        try:
            head = await self._runner.commit(
                trace,
                "TakenOver",
                self._store.writer.take_over(
                    head, attempt=abandoned.attempt, lapsed_at_ms=abandoned.lapsed_at_ms
                ),
            )
        except RecordExpired:
            return trace.error(ErrorCode.RECORD_EXPIRED, recorded=False)
        except Refused as refused:
            code = refused.error_code
            if code is not None and code is not ErrorCode.RECORD_EXPIRED:
                return trace.error(code, recorded=False)
            return await self._replay_duplicate(trace, head.run_id, tool, request, again=False)
        except StoreUnavailable:
            return trace.error(ErrorCode.STORE_UNAVAILABLE, recorded=False)
        trace.logger.warning("call_taken_over", **trace.ids, attempt=abandoned.attempt)
        call = ToolCall(
            run_id=head.run_id,
            tool_call_id=head.tool_call_id,
            invocation_id=invocation_id(head.run_id, head.tool_call_id),
            tool=tool,
        )
        try:
            return await self._runner.execute(self._tools[tool], call, request, head, trace)
        except RecordExpired:
            return trace.error(ErrorCode.RECORD_EXPIRED, recorded=True)
        except (StoreUnavailable, Refused):
            return trace.error(ErrorCode.STORE_UNAVAILABLE, recorded=True)

    async def _replay_duplicate(
        self, trace: CallTrace, run_id: str, tool: str, request: bytes, *, again: bool = True
    ) -> AgentReply:
        """Answer a duplicate from the first call's record (``on_duplicate="replay"``)."""
        tool_call_id = trace.ids["tool_call_id"]
        assert tool_call_id is not None  # past preflight: a safe id
        try:
            reply = await replay_duplicate(
                self._store.reader,
                self._runner.bounded,
                run_id=run_id,
                tool_call_id=tool_call_id,
                tool=tool,
                request=request,
                wait_s=self._replay_wait_s,
                on_lapsed="take_over" if again and self._may_take_over(tool) else "wait",
            )
        except StoreUnavailable:
            return trace.error(ErrorCode.STORE_UNAVAILABLE, recorded=False)
        if isinstance(reply, Abandoned):
            return await self._take_over(trace, tool, request, reply)
        if isinstance(reply, ToolError) and reply.invocation_id is None:
            # Nothing recorded answers it (another request, or the record is gone).
            await self._record_refusal(run_id, tool, tool_call_id, reply.error_code)
            return self._refuse(trace, reply.error_code, "replay")
        return trace.replay(reply)
