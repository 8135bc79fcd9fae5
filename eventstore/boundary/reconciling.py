"""Settling the calls that processes left in flight when they died.

A call in flight is held by the lease of the process running it. When that process dies,
nobody renews the lease; once it has passed (and a grace period more) the call is left:

- an **ungoverned** call (a read-only tool's) is *abandoned*: a retry of its id takes it
  over and runs it again (``ToolBoundary``); what nobody retries is ended here, ERROR
  ABANDONED, settled by ``sweep``;
- a **governed** call (dispatched under its one permit) is *attempted*: its tool may have
  run, and nothing dispatches it again. If its raw response was recorded, its journal
  proves that it ran: it is taken on (``Reconciled`` by ``journal``) and projected. Else
  its tool's reconcile hook (``ToolSpec.reconcile``) asks the business system: *executed*
  takes it on with the raw response the hook found (``Reconciled`` by ``hook:<tool>``,
  then the raw response recorded and projected as usual: READY, or ERROR if the
  projection fails); *not executed* ends it ERROR RECONCILED_NOT_EXECUTED (``Settled``);
  *unknown*, a hook that raises or one that times out leaves it for a later reconcile or
  an operator (:mod:`eventstore.settlements`). A tool without a hook (or not registered
  with this boundary) leaves it to an operator.

Every settlement is an event of the call's own chain (who or which hook, when, the
evidence's digest), written by ``lapsed.lua`` only once the lease and the grace have
passed by the server's clock: a process that still renews its lease keeps its call, and
of a reconcile racing an operator (or another reconcile) one settles and the other is
told. A call taken on is held under this reconciler's lease while it is projected; a
reconciler that dies there leaves it in flight again, for the next reconcile.

The calls are found through audit's listing of calls left in flight
(:mod:`eventstore.audit.attempted`): this module is not on the call path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final, Literal

import msgspec

from eventstore.audit.attempted import calls_left
from eventstore.boundary.call_trace import CallTrace
from eventstore.boundary.contracts import (
    MAX_EVIDENCE_CHARS,
    Reconciliation,
    RunContext,
    ToolCall,
    ToolEnvelope,
    ToolResult,
)
from eventstore.boundary.registered_tools import RegisteredTool, call_tool_function
from eventstore.boundary.running import CallRunner
from eventstore.errors import CanonError, RecordExpired, Refused, StoreUnavailable
from eventstore.logs import get_logger
from eventstore.reader import InvocationRecord
from eventstore.store import Store
from eventstore.wire.scripts import LeaseHeld
from eventstore.writer import head_of
from machine.codes import ErrorCode, Stage
from machine.ids import invocation_id

log = get_logger("canon.reconcile")

#: What a reconcile did with one call.
ReconcileOutcome = Literal[
    "executed",
    "not_executed",
    "abandoned",
    "unknown",
    "hook_failed",
    "hook_timed_out",
    "needs_operator",
    "still_running",
    "settled_elsewhere",
]
#: The outcomes that leave the call in flight.
LEFT: Final = frozenset(
    {"unknown", "hook_failed", "hook_timed_out", "needs_operator", "still_running"}
)
#: The evidence of a call taken on because its raw response was recorded.
_RAW_RECORDED: Final = "its raw response was recorded before its process stopped"


class ReconciledCall(msgspec.Struct, frozen=True, kw_only=True):
    """What a reconcile did with one call left in flight.

    Attributes:
        run_id: the call's run.
        tool_call_id: the call.
        tool: its tool.
        governed: a governed call (attempted) or not (abandoned).
        outcome: ``executed`` (taken on and projected: ``status`` READY, or ERROR when the
            projection failed), ``not_executed`` (ended RECONCILED_NOT_EXECUTED),
            ``abandoned`` (an ungoverned call ended ABANDONED), or left in flight:
            ``unknown`` (the hook could not tell), ``hook_failed``, ``hook_timed_out``,
            ``needs_operator`` (no hook), ``still_running`` (its process renewed its
            lease after all); ``settled_elsewhere``: another settled it first.
        status: the call's status after this reconcile, as far as it knows.
        error_code: the code it ended with, if it ended ERROR here.

    """

    run_id: str
    tool_call_id: str
    tool: str
    governed: bool
    outcome: ReconcileOutcome
    status: str
    error_code: str | None = None


class ReconcileReport(msgspec.Struct, frozen=True, kw_only=True):
    """What one reconcile did: each call left in flight it found, in order.

    ``runs_examined`` is how many runs were read; ``complete`` whether every call left in
    flight of those runs was looked at.
    """

    calls: list[ReconciledCall]
    runs_examined: int
    complete: bool

    @property
    def left(self) -> list[ReconciledCall]:
        """The calls still in flight after it (for a later reconcile, or an operator)."""
        return [call for call in self.calls if call.outcome in LEFT]


class _Recorded(RegisteredTool):
    """A registered tool whose "run" hands back a raw response found elsewhere.

    The call's outcome is then recorded and projected exactly as if its executor had
    returned it; the executor itself never runs.
    """

    __slots__ = ("raw",)

    def __init__(self, tool: RegisteredTool, raw: Any) -> None:
        for name in RegisteredTool.__slots__:
            setattr(self, name, getattr(tool, name))
        self.raw = raw

    async def execute(self, arguments: Any, call: ToolCall, task: asyncio.Task[Any]) -> Any:
        """Return the raw response found: the tool does not run."""
        return self.raw


def recorded_raw(raw: bytes) -> Any:
    """A recorded raw response as its projector is given it again.

    JSON as its value, other UTF-8 text as ``str``, other bytes as ``bytes`` (the
    record keeps text and bytes as given, and anything else as JSON).
    """
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        pass
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def evidence_text(text: object, scrub: Any) -> bytes:
    """A hook's evidence as kept: printable, scrubbed of secrets, at most 2,000 characters."""
    shown = text if isinstance(text, str) and text.strip() else "(the hook gave no evidence)"
    shown = "".join(ch if ch.isprintable() else " " for ch in shown)[:MAX_EVIDENCE_CHARS]
    try:
        scrubbed = scrub(shown)
    except Exception:  # the scrubber may be the harness's: keep nothing it was to hide
        scrubbed = "(evidence withheld: the scrubber failed)"
    return str(scrubbed)[:MAX_EVIDENCE_CHARS].encode("utf-8", "replace")


class Reconciler:
    """Settles the calls left in flight by processes that died, with a boundary's tools.

    Args:
        store: the store the calls are recorded in.
        tools: the boundary's registered tools, by name.
        runner: records and projects the raw response of a call taken on.

    """

    def __init__(
        self, store: Store, tools: Mapping[str, RegisteredTool], runner: CallRunner
    ) -> None:
        self._store = store
        self._tools = tools
        self._runner = runner

    async def reconcile(
        self, run_id: str | None, *, grace_ms: int, runs: int = 200
    ) -> ReconcileReport:
        """Settle what can be settled of the calls left in flight (see the module).

        Raises:
            InvalidArgument: ``run_id`` is not a run id, or ``runs`` is out of range.
            StoreUnavailable: Redis failed or timed out while they were listed.

        """
        left = await calls_left(self._store, run_id, grace_ms=grace_ms, runs=runs)
        done: list[ReconciledCall] = []
        for item in left.calls:
            try:
                outcome = await self.reconcile_call(item.run_id, item.call.tool_call_id, grace_ms)
            except StoreUnavailable as exc:
                log.warning("reconcile_failed", run_id=item.run_id, error_type=type(exc).__name__)
                continue
            if outcome is not None:
                done.append(outcome)
        return ReconcileReport(calls=done, runs_examined=left.runs_examined, complete=left.complete)

    async def reconcile_call(
        self, run_id: str, tool_call_id: str, grace_ms: int
    ) -> ReconciledCall | None:
        """Settle one call left in flight; None when it is no longer in flight.

        Raises:
            StoreUnavailable: Redis failed or timed out.

        """
        record = await self._runner.bounded(self._store.reader.get(run_id, tool_call_id))
        if record is None or record.state.stage not in (Stage.EXECUTING, Stage.PROJECTING):
            return None
        state = record.state
        tool = self._tools.get(state.tool)
        governed = state.approval_id is not None or (tool is not None and not tool.spec.read_only)
        result = ReconciledCall(
            run_id=run_id,
            tool_call_id=tool_call_id,
            tool=state.tool,
            governed=governed,
            outcome="needs_operator",
            status=state.status.value,
        )
        if not governed:
            evidence = b"its process stopped and no retry took it over in time"
            return await self._settle(
                record, result, ErrorCode.ABANDONED, "sweep", evidence, grace_ms
            )
        if state.stage is Stage.PROJECTING and tool is not None and record.raw is not None:
            by, raw = "journal", recorded_raw(record.raw)
            return await self._take_on(
                record, tool, raw, result, by, _RAW_RECORDED.encode(), grace_ms
            )
        if tool is None or tool.spec.reconcile is None:
            return result
        answer = await self._ask(record, tool, result)
        if not isinstance(answer, Reconciliation):
            return answer
        evidence = evidence_text(answer.evidence, self._store.settings.scrub)
        by = f"hook:{state.tool}"
        if answer.outcome == "not_executed" and state.stage is Stage.EXECUTING:
            code = ErrorCode.RECONCILED_NOT_EXECUTED
            return await self._settle(record, result, code, by, evidence, grace_ms)
        if answer.outcome == "executed":
            return await self._take_on(record, tool, answer.raw, result, by, evidence, grace_ms)
        return msgspec.structs.replace(result, outcome="unknown")

    async def _ask(
        self, record: InvocationRecord, tool: RegisteredTool, result: ReconciledCall
    ) -> Reconciliation | ReconciledCall:
        """The hook's answer, or what the call is left as when it has none."""
        state = record.state
        hook = tool.spec.reconcile
        assert hook is not None
        call = _call_of(record)
        try:
            arguments = msgspec.json.decode(record.request)
            answer = await asyncio.wait_for(
                call_tool_function(hook, arguments, call, threads=tool.executor_threads),
                tool.spec.reconcile_timeout_s,
            )
        except TimeoutError:
            log.warning("reconcile_hook_timed_out", run_id=state.run_id, tool=state.tool)
            return msgspec.structs.replace(result, outcome="hook_timed_out")
        except Exception as exc:
            log.warning(
                "reconcile_hook_failed",
                run_id=state.run_id,
                tool=state.tool,
                error_type=type(exc).__name__,
            )
            return msgspec.structs.replace(result, outcome="hook_failed")
        if not isinstance(answer, Reconciliation) or answer.outcome not in (
            "executed",
            "not_executed",
            "unknown",
        ):
            log.warning(
                "reconcile_hook_failed",
                run_id=state.run_id,
                tool=state.tool,
                error_type="NotAReconciliation",
            )
            return msgspec.structs.replace(result, outcome="hook_failed")
        return answer

    async def _settle(
        self,
        record: InvocationRecord,
        result: ReconciledCall,
        code: ErrorCode,
        by: str,
        evidence: bytes,
        grace_ms: int,
    ) -> ReconciledCall:
        """End the call with ``code`` (Settled), unless someone else moved it first."""
        head = head_of(record.state, record.expires_at_ms)
        try:
            await self._runner.bounded(
                self._store.writer.settle(head, code, by, evidence, grace_ms=grace_ms)
            )
        except CanonError as exc:
            return self._not_written(result, exc)
        log.info(
            "call_settled",
            run_id=result.run_id,
            invocation_id=invocation_id(result.run_id, result.tool_call_id),
            settled_by=by,
            error_code=code.value,
        )
        outcome: ReconcileOutcome = "abandoned" if code is ErrorCode.ABANDONED else "not_executed"
        return msgspec.structs.replace(
            result, outcome=outcome, status="ERROR", error_code=code.value
        )

    async def _take_on(
        self,
        record: InvocationRecord,
        tool: RegisteredTool,
        raw: Any,
        result: ReconciledCall,
        by: str,
        evidence: bytes,
        grace_ms: int,
    ) -> ReconciledCall:
        """Take on a call that ran (Reconciled), then record and project its raw response."""
        state = record.state
        head = head_of(state, record.expires_at_ms)
        call = _call_of(record)
        task = asyncio.current_task()
        assert task is not None
        envelope = ToolEnvelope(
            run_id=state.run_id, tool_call_id=state.tool_call_id, tool=state.tool, arguments={}
        )
        trace = CallTrace(RunContext(state.run_id), envelope, task)
        try:
            head = await self._runner.commit(
                trace,
                "Reconciled",
                self._store.writer.reconcile(head, by, evidence, grace_ms=grace_ms),
            )
        except CanonError as exc:
            return self._not_written(result, exc)
        log.info(
            "call_reconciled",
            run_id=state.run_id,
            invocation_id=call.invocation_id,
            settled_by=by,
        )
        try:
            reply = await self._runner.execute(
                _Recorded(tool, raw), call, record.request, head, trace
            )
        except (RecordExpired, StoreUnavailable, Refused) as exc:
            # Taken on, not yet projected: left in flight for the next reconcile.
            log.warning("reconcile_failed", run_id=state.run_id, error_type=type(exc).__name__)
            return msgspec.structs.replace(result, outcome="still_running")
        if isinstance(reply, ToolResult):
            return msgspec.structs.replace(result, outcome="executed", status="READY")
        code = getattr(reply, "error_code", None)
        return msgspec.structs.replace(
            result,
            outcome="executed",
            status="ERROR",
            error_code=code.value if code is not None else None,
        )

    def _not_written(self, result: ReconciledCall, exc: CanonError) -> ReconciledCall:
        """What a settlement the script refused leaves: its holder lives, or another won."""
        if isinstance(exc, LeaseHeld):
            return msgspec.structs.replace(result, outcome="still_running")
        if isinstance(exc, Refused):
            return msgspec.structs.replace(result, outcome="settled_elsewhere")
        raise exc


def _call_of(record: InvocationRecord) -> ToolCall:
    """What the hook, the executor and the projector learn about the call."""
    state = record.state
    return ToolCall(
        run_id=state.run_id,
        tool_call_id=state.tool_call_id,
        invocation_id=record.invocation_id,
        tool=state.tool,
    )
