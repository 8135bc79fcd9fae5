"""``ToolBoundary``: the one way a harness runs a tool.

Order of one call: preflight (nothing executed, nothing stored) → the creation script
(run state, pause, duplicate and budgets, checked atomically with the record's creation)
→ executor → raw response stored complete → projector → bounded result stored → the
agent receives that result, or a stable error code with its fixed message. Nothing raised
by a tool, a projector, the input or Redis escapes to the agent.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import msgspec
import structlog

from eventstore.contracts import (
    AgentReply,
    Projection,
    RunContext,
    ToolCall,
    ToolEnvelope,
    ToolError,
    ToolResult,
    ToolSpec,
)
from eventstore.deadlines import Deadlines
from eventstore.errors import InvalidArgument, RecordExpired, Refused, StoreUnavailable
from eventstore.store import Store
from eventstore.writer import Head
from machine.codes import ErrorCode, EvidenceStatus
from machine.ids import invocation_id, is_run_id, is_tool_call_id, is_tool_name
from machine.limits import Limits, utf8_size
from machine.requests import InvalidRequest, canonical_request

log = structlog.get_logger("canon.boundary")

_encoder: Final = msgspec.json.Encoder()
_READY_EVIDENCE: Final = frozenset({EvidenceStatus.EVIDENCE_FOUND, EvidenceStatus.NO_EVIDENCE})


def _valid_time_limit(seconds: float | None) -> bool:
    return seconds is None or (isinstance(seconds, int | float) and 0 < seconds < math.inf)


class _Stop(Exception):
    """Ends a call early with an error code (internal control flow)."""

    def __init__(self, code: ErrorCode, rejected_bytes: int | None = None) -> None:
        super().__init__(code.value)
        self.code = code
        self.rejected_bytes = rejected_bytes


def encode_raw(value: Any) -> bytes:
    """Return a raw response's stored bytes: bytes as given, text as UTF-8, else JSON."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return _encoder.encode(value)


class _Trace:
    """One call's decisions so far and the logger that reports them: ids, never payloads.

    Decisions are logged as they are taken: ``invocation_refused`` (INFO) when a call is
    turned away before any record exists, ``event_committed`` (DEBUG) for each lifecycle
    event written, and one ``invocation_finished`` per call, INFO unless a call that got
    past its refusals ended in ERROR (WARNING).
    """

    __slots__ = (
        "debug",
        "event_type",
        "ids",
        "invocation_id",
        "logger",
        "refused",
        "task",
        "version",
    )

    def __init__(self, ctx: RunContext, envelope: ToolEnvelope, task: asyncio.Task[Any]) -> None:
        # The task that runs the call: its time limits cancel it (eventstore.deadlines).
        self.task = task
        # One concrete logger per call: the lazy proxy would rebuild one per line.
        self.logger: Any = log.bind()
        is_enabled_for = getattr(self.logger, "is_enabled_for", None)
        # The benchmark logs at INFO with little margin: with DEBUG off, no per-event
        # line is even built.
        self.debug: bool = is_enabled_for is None or bool(is_enabled_for(logging.DEBUG))
        # Unsafe ids are never logged: they may carry anything the agent sent.
        run_id = ctx.run_id if is_run_id(ctx.run_id) else None
        tool_call_id = envelope.tool_call_id if is_tool_call_id(envelope.tool_call_id) else None
        self.invocation_id = (
            invocation_id(run_id, tool_call_id) if run_id and tool_call_id else None
        )
        # The ids every line of the call carries.
        self.ids = {
            "run_id": run_id,
            "tool_call_id": tool_call_id,
            "invocation_id": self.invocation_id,
        }
        self.version = 0
        self.event_type: str | None = None
        self.refused = False

    def refuse(self, code: ErrorCode, stage: str) -> ToolError:
        """Log a refusal at ``stage`` (nothing was written, so no version) and return it."""
        self.refused = True
        self.logger.info(
            "invocation_refused",
            **self.ids,
            stage=stage,
            error_code=code.value,
        )
        return ToolError.of(code)

    def commit(self, event_type: str, head: Head, code: ErrorCode | None = None) -> Head:
        """Note that ``event_type`` was written at ``head.version``; log it at DEBUG."""
        self.version, self.event_type = head.version, event_type
        if self.debug:
            self.logger.debug(
                "event_committed",
                **self.ids,
                event_type=event_type,
                version=head.version,
                error_code=code.value if code is not None else None,
            )
        return head

    def finish(self, reply: AgentReply, tool: str | None, started: float) -> None:
        """Log the call's outcome, its last lifecycle event and its duration."""
        failed = isinstance(reply, ToolError)
        (self.logger.warning if failed and not self.refused else self.logger.info)(
            "invocation_finished",
            **self.ids,
            tool=tool,
            status="ERROR" if failed else "READY",
            error_code=reply.error_code.value if isinstance(reply, ToolError) else None,
            event_type=self.event_type,
            version=self.version,
            duration_ms=round((time.perf_counter() - started) * 1000, 3),
        )


async def _call(fn: Callable[..., Any], *args: Any, thread: bool) -> Any:
    """Call a plain or async callable; ``thread`` runs a plain one in a worker thread."""
    result = await asyncio.to_thread(fn, *args) if thread else fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


class _Tool:
    """A registered tool with what its calls need decided once, not per call."""

    __slots__ = ("executor_deadlines", "executor_in_thread", "spec")

    def __init__(self, spec: ToolSpec, deadlines: dict[float, Deadlines]) -> None:
        self.spec = spec
        self.executor_in_thread = spec.thread and not inspect.iscoroutinefunction(spec.executor)
        # Tools with the same time limit share one timer (see eventstore.deadlines).
        self.executor_deadlines = (
            deadlines.setdefault(spec.timeout_s, Deadlines(spec.timeout_s))
            if spec.timeout_s is not None
            else None
        )

    async def execute(self, arguments: Any, call: ToolCall, task: asyncio.Task[Any]) -> Any:
        """Run the executor in ``task`` within the tool's time limit (TimeoutError past it)."""
        running = _call(self.spec.executor, arguments, call, thread=self.executor_in_thread)
        if self.executor_deadlines is None:
            return await running
        return await self.executor_deadlines.run(running, task)


class ToolBoundary:
    """Runs tools for one store with preflight, limits and safe errors.

    Args:
        store: the canonical store.
        tools: the tools this boundary may run, by name.
        store_timeout_s: the longest one store operation may take before the call
            answers STORE_UNAVAILABLE (default: twice the store's command timeout,
            which leaves room for its retries).

    Raises:
        InvalidArgument: a tool is registered under a name the store refuses
            (:func:`machine.ids.is_tool_name`), or with a time limit that is not a
            positive number of seconds; caught here, not on its first call.

    """

    def __init__(
        self,
        store: Store,
        tools: Mapping[str, ToolSpec],
        *,
        store_timeout_s: float | None = None,
    ) -> None:
        refused = [name for name in tools if not is_tool_name(name)]
        if refused:
            shown = ", ".join(repr(name) for name in refused[:5])
            raise InvalidArgument(f"tool names not allowed (letters, digits, _ . -): {shown}")
        slow = [name for name, spec in tools.items() if not _valid_time_limit(spec.timeout_s)]
        if slow:
            shown = ", ".join(repr(name) for name in slow[:5])
            raise InvalidArgument(f"tool time limits must be positive seconds: {shown}")
        self._store = store
        executor_deadlines: dict[float, Deadlines] = {}
        self._tools = {name: _Tool(spec, executor_deadlines) for name, spec in tools.items()}
        self._limits: Limits = store.limits
        self._store_timeout_s = store_timeout_s or store.timeout_s * 2
        self._store_deadlines = Deadlines(self._store_timeout_s)

    async def invoke(self, ctx: RunContext, envelope: ToolEnvelope) -> AgentReply:
        """Run one tool call and return what the agent may see.

        Never raises for tool, projector, input or store failures; only cancellation
        propagates.
        """
        started = time.perf_counter()
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("ToolBoundary.invoke must run in an asyncio task")
        trace = _Trace(ctx, envelope, task)
        try:
            reply = await self._invoke(ctx, envelope, trace)
        except Exception as exc:  # a bug of ours must still not reach the agent
            trace.logger.error("invocation_crashed", error_type=type(exc).__name__)
            reply = ToolError.of(ErrorCode.STORE_UNAVAILABLE)
        trace.finish(reply, envelope.tool if self._tool_of(envelope) is not None else None, started)
        return reply

    def _tool_of(self, envelope: ToolEnvelope) -> _Tool | None:
        """The named tool, or None (also for a name that is not even a string)."""
        return self._tools.get(envelope.tool) if isinstance(envelope.tool, str) else None

    def _preflight(self, ctx: RunContext, envelope: ToolEnvelope) -> tuple[_Tool, bytes]:
        """Checks that need no I/O, in the order the specification lists them."""
        # The namespace's key layout decides (the legacy one holds no ':' in a call id).
        if not self._store.keys.accepts_tool_call_id(envelope.tool_call_id):
            raise _Stop(ErrorCode.INVALID_TOOL_CALL_ID)
        if not is_run_id(ctx.run_id) or envelope.run_id != ctx.run_id:
            raise _Stop(ErrorCode.RUN_MISMATCH)
        limits = self._limits
        try:
            request = canonical_request(
                envelope.arguments,
                max_depth=limits.json_depth,
                max_text_bytes=4 * limits.request_bytes,
            )
        except InvalidRequest:
            raise _Stop(ErrorCode.INVALID_INPUT) from None
        except OverflowError:
            raise _Stop(ErrorCode.REQUEST_TOO_LARGE) from None
        if len(request) > limits.request_bytes:
            raise _Stop(ErrorCode.REQUEST_TOO_LARGE)
        tool = self._tool_of(envelope)
        if tool is None:
            raise _Stop(ErrorCode.UNKNOWN_TOOL)
        if not tool.spec.authorized:
            raise _Stop(ErrorCode.UNAUTHORIZED)
        if not tool.spec.read_only:
            raise _Stop(ErrorCode.NOT_READ_ONLY)
        return tool, request

    async def _commit(
        self,
        trace: _Trace,
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

    async def _invoke(self, ctx: RunContext, envelope: ToolEnvelope, trace: _Trace) -> AgentReply:
        try:
            tool, request = self._preflight(ctx, envelope)
        except _Stop as stop:
            return trace.refuse(stop.code, "preflight")
        run_id, tool_call_id = ctx.run_id, envelope.tool_call_id
        try:
            head = await self._commit(
                trace,
                "Preflighted",
                self._store.writer.create(run_id, tool_call_id, envelope.tool, request),
            )
        except Refused as refused:
            if refused.error_code is None:
                return ToolError.of(ErrorCode.STORE_UNAVAILABLE)
            return trace.refuse(refused.error_code, "create")
        except StoreUnavailable:
            return ToolError.of(ErrorCode.STORE_UNAVAILABLE)
        call = ToolCall(
            run_id=run_id,
            tool_call_id=tool_call_id,
            invocation_id=trace.invocation_id or invocation_id(run_id, tool_call_id),
            tool=envelope.tool,
        )
        try:
            return await self._execute(tool, call, request, head, trace)
        except RecordExpired:
            return ToolError.of(ErrorCode.RECORD_EXPIRED)
        except (StoreUnavailable, Refused):
            return ToolError.of(ErrorCode.STORE_UNAVAILABLE)

    async def _execute(
        self, tool: _Tool, call: ToolCall, request: bytes, head: Head, trace: _Trace
    ) -> AgentReply:
        """Executor, raw storage, projector, result storage; failures end in ERROR."""
        limits = self._limits
        arguments = msgspec.json.decode(request)
        try:
            try:
                raw_value = await tool.execute(arguments, call, trace.task)
            except Exception:
                raise _Stop(ErrorCode.EXECUTION_FAILED) from None
            try:
                raw = encode_raw(raw_value)
            except (TypeError, ValueError, OverflowError):
                raise _Stop(ErrorCode.SERIALIZATION_FAILED) from None
            if len(raw) > limits.raw_bytes or len(request) + len(raw) > limits.record_bytes:
                raise _Stop(ErrorCode.RESULT_TOO_LARGE, len(raw))
            head = await self._commit(
                trace, "ProjectingStarted", self._store.writer.start_projecting(head, raw)
            )

            projection = await self._project(tool.spec, raw_value, call)
            evidence = EvidenceStatus(projection.evidence_status)
            try:
                result = _encoder.encode(projection.result)
            except (TypeError, ValueError, OverflowError):
                raise _Stop(ErrorCode.SERIALIZATION_FAILED) from None
            scope_bytes = utf8_size(projection.scope)
            total = len(request) + len(raw) + len(result) + scope_bytes
            if (
                len(result) > limits.result_bytes
                or scope_bytes > limits.scope_bytes
                or total > limits.record_bytes
            ):
                raise _Stop(ErrorCode.RESULT_TOO_LARGE, len(result))
            await self._commit(
                trace,
                "Completed",
                self._store.writer.complete(head, result, evidence, projection.scope),
            )
        except _Stop as stop:
            await self._commit(
                trace,
                "Failed",
                self._store.writer.fail(head, stop.code, stop.rejected_bytes),
                stop.code,
            )
            return ToolError.of(stop.code)
        return ToolResult(
            result=projection.result,
            evidence_status=evidence,
            scope=projection.scope,
            invocation_id=call.invocation_id,
        )

    async def _project(self, spec: ToolSpec, raw_value: Any, call: ToolCall) -> Projection:
        """Run the projector and check its answer's shape and evidence status."""
        try:
            projection = await _call(spec.projector, raw_value, call, thread=False)
        except Exception:
            raise _Stop(ErrorCode.PROJECTION_FAILED) from None
        if not isinstance(projection, Projection) or not isinstance(projection.scope, str):
            raise _Stop(ErrorCode.PROJECTION_FAILED)
        try:
            evidence = EvidenceStatus(projection.evidence_status)
        except ValueError:
            raise _Stop(ErrorCode.INVALID_EVIDENCE_STATUS) from None
        if evidence not in _READY_EVIDENCE:
            raise _Stop(ErrorCode.INVALID_EVIDENCE_STATUS)
        try:
            projection.scope.encode("utf-8")
        except UnicodeEncodeError:
            raise _Stop(ErrorCode.SERIALIZATION_FAILED) from None
        return projection
