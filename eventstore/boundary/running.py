"""Running one call's tool: executor, raw response stored, projector, result stored.

The steps every call that runs takes, plain or governed, once its record exists and it
may run: :meth:`CallRunner.execute` runs the executor (with its time limit), stores the
complete raw response (ProjectingStarted), runs the projector, checks the result and
stores it (Completed), or ends the record ERROR (Failed) with a stable code, the
harness-only failure detail and, for a tool that opted in, its own error text. Each
store operation is bounded by the boundary's store timeout (:meth:`CallRunner.commit`,
:meth:`CallRunner.bounded`); a call cut short by its caller is closed
(:mod:`eventstore.boundary.interrupts`) before the cancellation goes on. While it runs,
the call's lease is kept (:mod:`eventstore.boundary.leases`), so no one takes it over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, Final

import msgspec

from eventstore.boundary.call_stops import CallStop, error_text_result, too_large, tool_failed
from eventstore.boundary.call_trace import CallTrace
from eventstore.boundary.contracts import AgentReply, Projection, ToolCall, ToolResult
from eventstore.boundary.interrupts import Interruptions, caller_cancelled
from eventstore.boundary.leases import Leases
from eventstore.boundary.registered_tools import RegisteredTool, ToolRaised, call_tool_function
from eventstore.errors import StoreUnavailable
from eventstore.store import Store
from eventstore.wire.deadlines import Deadlines
from eventstore.writer import Head, Pending, now_ms
from machine.codes import ErrorCode, EvidenceStatus
from machine.failure_detail import FailureDetailPolicy
from machine.limits import LimitName, utf8_size
from machine.results import decode_result, encode_raw, encode_result

_READY_EVIDENCE: Final = frozenset({EvidenceStatus.EVIDENCE_FOUND, EvidenceStatus.NO_EVIDENCE})


class CallRunner:
    """Runs a call's tool and records what happens, within the store timeout.

    Args:
        store: the store the call's record is in.
        store_timeout_s: the longest one store operation may take (past it, the call
            answers STORE_UNAVAILABLE).
        failure_detail: what a record keeps when an executor or projector raises.

    """

    def __init__(
        self, store: Store, store_timeout_s: float, failure_detail: FailureDetailPolicy
    ) -> None:
        self._store = store
        self._limits = store.settings.limits
        self._failure_detail = failure_detail
        self._store_deadlines = Deadlines(store_timeout_s)
        self._store_timeout_ms = int(store_timeout_s * 1000)
        self._interruptions = Interruptions(
            store.writer, store.reader, store_timeout_s, store.finish_before_closing
        )
        self._leases = Leases(store.writer, store.settings.lease_ms)

    @property
    def interruptions(self) -> Interruptions:
        """What closes the record of a call cut short by its caller."""
        return self._interruptions

    async def commit(
        self,
        trace: CallTrace,
        event_type: str,
        operation: Awaitable[Head],
        code: ErrorCode | None = None,
        after: Pending | None = None,
    ) -> Head:
        """Write one lifecycle event within the store timeout and note it in ``trace``.

        ``after``: the ProjectingStarted the event follows, written ahead of its answer and
        answered with it (noted first, if it was committed).
        """
        try:
            head = await self._store_deadlines.run(operation, trace.task)
        except TimeoutError:
            raise StoreUnavailable("TimeoutError") from None
        finally:
            if after is not None and after.committed is not None:
                trace.commit("ProjectingStarted", after.committed)
        return trace.commit(event_type, head, code)

    async def _send_projecting(self, trace: CallTrace, head: Head, raw: bytes) -> Pending:
        """Write ProjectingStarted ahead of its answer, within the store timeout.

        Its answer comes with the outcome's: the projector runs meanwhile, once the raw
        response is in the kernel's hands (see :meth:`Writer.send_projecting`). A record
        whose expiry is this close is answered first: a projector never runs for a
        record that is gone.
        """
        writer = self._store.writer
        try:
            if now_ms() + self._store_timeout_ms >= head.expires_at_ms:
                done = await self._store_deadlines.run(
                    writer.start_projecting(head, raw), trace.task
                )
                return Pending(head, done, None, done)  # noted with the outcome
            return await self._store_deadlines.run(writer.send_projecting(head, raw), trace.task)
        except TimeoutError:
            raise StoreUnavailable("TimeoutError") from None

    async def bounded(self, operation: Awaitable[Any]) -> Any:
        """Await one store read within the store timeout (StoreUnavailable past it)."""
        try:
            return await self._store_deadlines.run(operation)
        except TimeoutError:
            raise StoreUnavailable("TimeoutError") from None

    async def execute(
        self, tool: RegisteredTool, call: ToolCall, request: bytes, head: Head, trace: CallTrace
    ) -> AgentReply:
        """Executor, raw storage, projector, result storage; failures end in ERROR.

        ``head`` is the event that let this writer run the call (Preflighted, Dispatched,
        TakenOver or Reconciled): its lease is kept until the call's outcome is written.
        """
        held = self._leases.hold(head)
        try:
            return await self._execute(tool, call, request, head, trace)
        finally:
            self._leases.release(held)

    async def _execute(
        self, tool: RegisteredTool, call: ToolCall, request: bytes, head: Head, trace: CallTrace
    ) -> AgentReply:
        limits = self._limits
        arguments = msgspec.json.decode(request)
        pending: Pending | None = None  # ProjectingStarted, once written
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
            pending = await self._send_projecting(trace, head, raw)

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
            completing = self._store.writer.complete(
                pending.head, result, evidence, projection.scope, after=pending, raw=raw
            )
            await self.commit(trace, "Completed", completing, after=pending)
        except CallStop as stop:
            if pending is not None:
                head = pending.head
            failing = self._store.writer.fail(
                head, stop.code, stop.rejected_bytes, stop.detail, stop.result, after=pending
            )
            await self._closing_if_cut(
                trace, pending or head, self.commit(trace, "Failed", failing, stop.code, pending)
            )
            # Answered once the record holds it: the agent, a replay and a receipt agree
            # on the tool's text; a size error's message names the limit it hit.
            return trace.error(stop.code, recorded=True, limit=stop.limit, message=stop.message)
        except Exception:
            raise  # store failures: answered by _invoke
        except BaseException:
            # The caller's cancellation, KeyboardInterrupt, SystemExit: close, then go on.
            await self._interruptions.close(pending or head, None, trace.interrupted)
            raise
        finally:
            if pending is not None and pending.sent is not None:
                # Left by a failure of ours before the outcome: answered, nothing lost.
                await self._interruptions.settle(pending)
        return ToolResult(
            # What the record holds, decoded: the agent, a replay and a receipt agree.
            result=decode_result(result),
            evidence_status=evidence,
            scope=projection.scope,
            tool_call_id=call.tool_call_id,
            invocation_id=call.invocation_id,
        )

    async def _closing_if_cut(
        self, trace: CallTrace, head: Head | Pending, step: Awaitable[Head]
    ) -> Head:
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
