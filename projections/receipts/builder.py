"""Read-only invocation receipts: one pure function from a record and its journal.

:func:`build_receipt` does no I/O. It reads the record's lifecycle fields and its bounded
agent result, never the request or the raw response, and it never turns missing or
disagreeing evidence into a success. The rules are written down in ``docs/receipts.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from functools import lru_cache
from typing import Any, Final

import msgspec
from msgspec import UNSET, UnsetType

from eventstore.errors import InvalidArgument
from eventstore.reader import InvocationRecord, StoredEvent
from machine.codes import SAFE_MESSAGES, ErrorCode, EvidenceStatus, Stage, Status
from machine.events import ApprovalRequested, Preflighted, payload_digest
from machine.fold import InvocationState
from machine.ids import invocation_id as invocation_id_of
from machine.limits import Limits
from projections.receipts.journal import (
    DEFAULT_STALE_AFTER_MS,
    JournalState,
    RecordView,
    journal_state,
    record_view,
)

RECEIPT_SCHEMA: Final = "canon.invocation-receipt.v1"
CAPABILITIES_SCHEMA: Final = "canon.invocation-inspection-capabilities.v1"

#: The one text of every unresolved result; it never quotes the journal or the record.
RECONCILIATION_TEXT: Final = (
    "The invocation's journal does not confirm a completed outcome. "
    "Inspect the original invocation; do not repeat the call."
)
#: The one text of a governed call's saved result before its dispatch.
AWAITING_APPROVAL_TEXT: Final = "The governed tool invocation is awaiting approval."


class ResultSource(StrEnum):
    """Where the receipt's ``result`` comes from."""

    RECORD = "record"
    JOURNAL = "journal"
    NONE = "none"


class DispatchState(StrEnum):
    """Whether the tool may have run (``attempted`` is not proof that it did)."""

    NOT_DISPATCHED = "not_dispatched"
    ATTEMPTED = "attempted"
    UNKNOWN = "unknown"


class Approval(msgspec.Struct, frozen=True):
    """The approval observation of a receipt.

    ``none`` for a call that needed none, else ``pending``, ``approved`` or ``denied`` (an
    approval that expired undecided reads ``denied``: the call was refused before
    dispatch) with its ``approval_id``. Approved is not succeeded: the result and
    ``dispatch_state`` say what happened since.
    """

    status: str = "none"
    approval_id: str | UnsetType = UNSET


class ReceiptSettlement(msgspec.Struct, frozen=True, kw_only=True):
    """How a call whose process died was settled, as its receipt says.

    ``outcome`` is ``executed`` (it ran: its raw response was projected, or an operator
    said so), ``not_executed`` (it did not run) or ``abandoned`` (an ungoverned call
    nobody retried); ``settled_by`` an operator's name, ``hook:<tool>``, ``journal`` (its
    raw response was recorded) or ``sweep``; ``evidence_sha256`` the digest of the
    evidence kept beside it (never the evidence itself).
    """

    settled_by: str
    outcome: str
    evidence_sha256: str | None = None


class Receipt(msgspec.Struct, frozen=True, kw_only=True):
    """A read-only observation of one invocation (schema ``canon.invocation-receipt.v1``).

    ``business_operation_performed`` describes the read that produced the receipt, which
    never runs anything; it does not claim that the original call never ran.
    ``settlement`` is there only for a call settled after its process died.
    """

    schema_version: str = RECEIPT_SCHEMA
    read_only: bool = True
    business_operation_performed: bool = False
    invocation_id: str
    run_id: str
    tool_call_id: str
    tool: str
    observed_at: str
    result: dict[str, Any] | None
    result_source: ResultSource
    dispatch_state: DispatchState
    approval: Approval = Approval()
    journal_state: JournalState
    evidence_status: EvidenceStatus
    expires_at: str | None
    settlement: ReceiptSettlement | UnsetType = UNSET


_encoder: Final = msgspec.json.Encoder()
_decoder: Final = msgspec.json.Decoder(Receipt)


def encode_receipt(receipt: Receipt) -> bytes:
    """Return the receipt's JSON bytes (fields in schema order)."""
    return _encoder.encode(receipt)


def decode_receipt(data: bytes) -> Receipt:
    """Decode receipt JSON written by :func:`encode_receipt`; raises msgspec errors."""
    return _decoder.decode(data)


@lru_cache(maxsize=1024)
def _iso_second(epoch_s: int) -> str:
    # Receipts built together mostly share their second; formatting one costs more.
    return f"{datetime.fromtimestamp(epoch_s, UTC):%Y-%m-%dT%H:%M:%S}"


def iso_ms(epoch_ms: int) -> str:
    """Format milliseconds since the epoch as ISO-8601 UTC with milliseconds and ``Z``."""
    return f"{_iso_second(epoch_ms // 1000)}.{epoch_ms % 1000:03d}Z"


def _coordinates(view: RecordView | None, events: Sequence[StoredEvent]) -> tuple[str, str, str]:
    if view is not None and view.state is not None:
        return view.state.run_id, view.state.tool_call_id, view.state.tool
    names = ("run_id", "tool_call_id", "tool")
    if view is not None and all(name in view.fields for name in names):
        run_id, tool_call_id, tool = (
            view.fields[name].decode("utf-8", "replace") for name in names
        )
        return run_id, tool_call_id, tool
    first = events[0].event if events else None
    if isinstance(first, Preflighted | ApprovalRequested):
        return first.run_id, first.tool_call_id, first.tool
    raise InvalidArgument("neither the record nor the journal names the invocation")


def _agent_result(view: RecordView, state: InvocationState, limit_bytes: int) -> tuple[bool, Any]:
    """Decode the stored bounded result; (False, None) when it is missing or malformed."""
    payload = view.result
    if payload is None or len(payload) > limit_bytes or len(payload) != state.result_bytes:
        return False, None
    if payload_digest(payload) != state.result_sha256:
        return False, None
    try:
        return True, msgspec.json.decode(payload)
    except msgspec.DecodeError:
        return False, None


def approval_of(state: InvocationState | None) -> Approval:
    """The approval a record's state shows (``none`` for a call that needed none)."""
    if state is None or state.approval_id is None:
        return Approval()
    if state.stage is Stage.AWAITING_APPROVAL:
        status = "pending"
    elif state.error_code is ErrorCode.APPROVAL_DENIED or (
        state.error_code is ErrorCode.APPROVAL_EXPIRED and state.decided_by is None
    ):
        status = "denied"
    else:
        status = "approved"
    return Approval(status=status, approval_id=state.approval_id)


def settlement_of(state: InvocationState | None) -> ReceiptSettlement | UnsetType:
    """How a call whose process died was settled (``UNSET`` for any other call)."""
    if state is None or state.settled_by is None:
        return UNSET
    code = state.error_code
    outcome = (
        "not_executed"
        if code is ErrorCode.RECONCILED_NOT_EXECUTED
        else "abandoned"
        if code is ErrorCode.ABANDONED
        else "executed"
    )
    return ReceiptSettlement(
        settled_by=state.settled_by,
        outcome=outcome,
        evidence_sha256=state.settlement_evidence_sha256,
    )


def _awaiting(state: InvocationState) -> dict[str, Any]:
    """The saved result of a governed call not yet dispatched (approved or not)."""
    return {
        "state": "awaiting_approval",
        "ok": False,
        "auto_retry_allowed": False,
        "text": AWAITING_APPROVAL_TEXT,
        "approval_id": state.approval_id,
    }


def _reconciliation() -> dict[str, Any]:
    return {
        "state": "reconciliation_required",
        "ok": False,
        "auto_retry_allowed": False,
        "text": RECONCILIATION_TEXT,
    }


def _completed_result(
    view: RecordView, state: InvocationState, limit_bytes: int
) -> tuple[dict[str, Any] | None, ResultSource]:
    if state.status is Status.ERROR:
        assert state.error_code is not None  # the fold refuses ERROR without a code
        message = SAFE_MESSAGES[state.error_code]
        if state.result_sha256 is not None:
            # The agent was shown the tool's own error text: the receipt shows what it saw.
            valid, text = _agent_result(view, state, limit_bytes)
            if not valid or not isinstance(text, str):
                return None, ResultSource.NONE
            message = text
        return {
            "state": "error",
            "ok": False,
            "error_code": state.error_code.value,
            "message": message,
            "auto_retry_allowed": False,
        }, ResultSource.RECORD
    valid, agent_result = _agent_result(view, state, limit_bytes)
    if not valid:
        # The journal holds only the result's digest, so it cannot stand in for it.
        return None, ResultSource.NONE
    return {
        "state": "ready",
        "ok": True,
        "evidence_status": state.evidence_status.value,
        "scope": state.scope or "",
        "agent_result": agent_result,
        "auto_retry_allowed": False,
    }, ResultSource.RECORD


def _only_the_stored_result_disagrees(
    view: RecordView | None,
    events: Sequence[StoredEvent],
    journal: JournalState,
    observed_at_ms: int,
) -> bool:
    """Whether a record that has a result is ``evidence_degraded`` only by its bytes.

    READY, or ERROR whose ``Failed`` event names the agent result the agent was shown (the
    tool's own error text). An ERROR record that names none keeps none: a result written
    into it is a disagreement like any other.
    """
    state = view.state if view is not None else None
    return (
        journal is JournalState.EVIDENCE_DEGRADED
        and state is not None
        and (
            state.status is Status.READY
            or (state.status is Status.ERROR and state.result_sha256 is not None)
        )
        and journal_state(view, events, observed_at_ms=observed_at_ms, stored_result=False)
        is JournalState.COMPLETED
    )


def build_receipt(
    record: Mapping[str, str | bytes]
    | Mapping[bytes, bytes]
    | InvocationRecord
    | RecordView
    | None,
    events: Sequence[StoredEvent],
    *,
    observed_at_ms: int,
    stale_after_ms: int = DEFAULT_STALE_AFTER_MS,
    result_limit_bytes: int = Limits().result_bytes,
) -> Receipt:
    """Build the receipt of one invocation from its record and its journal. Pure.

    Args:
        record: the record's hash fields (HGETALL/HMGET output, bytes or text), an
            :class:`InvocationRecord`, its :class:`RecordView`, or None when the record
            is absent.
        events: the invocation's stream as read back (possibly empty).
        observed_at_ms: when the record and stream were read.
        stale_after_ms: a non-terminal journal unchanged for longer is ``uncertain``.
        result_limit_bytes: a stored agent result larger than this is malformed.

    Raises:
        InvalidArgument: neither the record nor the journal identifies an invocation.

    """
    view = record if isinstance(record, RecordView) else record_view(record, events)
    run_id, tool_call_id, tool = _coordinates(view, events)
    journal = journal_state(
        view, events, observed_at_ms=observed_at_ms, stale_after_ms=stale_after_ms
    )
    result: dict[str, Any] | None
    evidence = EvidenceStatus.PENDING
    if journal is JournalState.COMPLETED:
        assert view is not None and view.state is not None
        result, source = _completed_result(view, view.state, result_limit_bytes)
        evidence = view.state.evidence_status
    elif (
        journal is JournalState.ABSENT
        and view is not None
        and view.state is not None
        and view.state.stage in (Stage.AWAITING_APPROVAL, Stage.APPROVED)
    ):
        result, source = _awaiting(view.state), ResultSource.RECORD
    elif _only_the_stored_result_disagrees(view, events, journal, observed_at_ms):
        # The journal confirms the call completed; the bytes stored as its result are not
        # the ones it names, and it holds only their digest: no result, not a guess (nor,
        # for an ERROR, the fixed message in place of the text the agent was shown).
        result, source = None, ResultSource.NONE
    else:
        result, source = _reconciliation(), ResultSource.JOURNAL
    state = view.state if view is not None else None
    if journal is JournalState.UNKNOWN or view is None or not events:
        dispatch = DispatchState.UNKNOWN
    elif state is not None and state.approval_id is not None:
        # A governed call ran only from its one dispatch permit on.
        dispatch = (
            DispatchState.ATTEMPTED
            if state.dispatched_request_sha256 is not None
            else DispatchState.NOT_DISPATCHED
        )
    else:
        # A record exists only once preflight passed, so the executor may have run.
        dispatch = DispatchState.ATTEMPTED
    return Receipt(
        invocation_id=invocation_id_of(run_id, tool_call_id),
        run_id=run_id,
        tool_call_id=tool_call_id,
        tool=tool,
        observed_at=iso_ms(observed_at_ms),
        result=result,
        result_source=source,
        dispatch_state=dispatch,
        approval=approval_of(state),
        journal_state=journal,
        evidence_status=evidence,
        expires_at=iso_ms(view.expires_at_ms)
        if view is not None and view.expires_at_ms is not None
        else None,
        settlement=settlement_of(state) if journal is not JournalState.UNKNOWN else UNSET,
    )
