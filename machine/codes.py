"""Statuses, evidence statuses and the stable error codes, with their agent-safe messages."""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """Public lifecycle status of a canonical record."""

    PROJECTING = "PROJECTING"
    READY = "READY"
    ERROR = "ERROR"


class Stage(StrEnum):
    """Machine state of an invocation: the public status refined by where it stands.

    ``EXECUTING`` and ``PROJECTING`` both show ``Status.PROJECTING`` to readers.
    """

    NEW = "NEW"
    #: A governed call, recorded with its frozen request, waiting for an operator.
    AWAITING_APPROVAL = "AWAITING_APPROVAL"
    #: An operator approved it; it runs when it is resumed (one dispatch).
    APPROVED = "APPROVED"
    EXECUTING = "EXECUTING"
    PROJECTING = "PROJECTING"
    READY = "READY"
    ERROR = "ERROR"


class EvidenceStatus(StrEnum):
    """What a finished projection says about evidence.

    ``PENDING`` belongs to records that have not finished. ``NO_EVIDENCE`` is a scoped
    negative observation: never upgraded to success and never retried.
    """

    PENDING = "PENDING"
    EVIDENCE_FOUND = "EVIDENCE_FOUND"
    NO_EVIDENCE = "NO_EVIDENCE"
    ERROR = "ERROR"


class ErrorCode(StrEnum):
    """Stable, agent-safe error codes. Values never change once published."""

    # Preflight: nothing was executed and no record exists.
    INVALID_TOOL_CALL_ID = "INVALID_TOOL_CALL_ID"
    RUN_MISMATCH = "RUN_MISMATCH"
    INVALID_INPUT = "INVALID_INPUT"
    REQUEST_TOO_LARGE = "REQUEST_TOO_LARGE"
    UNAUTHORIZED = "UNAUTHORIZED"
    NOT_READ_ONLY = "NOT_READ_ONLY"
    UNKNOWN_TOOL = "UNKNOWN_TOOL"
    RUN_INACTIVE = "RUN_INACTIVE"
    RUN_DEADLINE_EXPIRED = "RUN_DEADLINE_EXPIRED"
    EXECUTION_PAUSED = "EXECUTION_PAUSED"
    DUPLICATE_TOOL_CALL = "DUPLICATE_TOOL_CALL"
    TOOL_BUDGET_EXHAUSTED = "TOOL_BUDGET_EXHAUSTED"
    RUN_BUDGET_EXHAUSTED = "RUN_BUDGET_EXHAUSTED"
    # After the record exists.
    EXECUTION_FAILED = "EXECUTION_FAILED"
    RESULT_TOO_LARGE = "RESULT_TOO_LARGE"
    PROJECTION_FAILED = "PROJECTION_FAILED"
    INVALID_EVIDENCE_STATUS = "INVALID_EVIDENCE_STATUS"
    RECORD_EXPIRED = "RECORD_EXPIRED"
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
    SERIALIZATION_FAILED = "SERIALIZATION_FAILED"
    #: The caller cancelled the call, or the process was asked to exit, while it ran.
    CALLER_CANCELLED = "CALLER_CANCELLED"
    # A governed call: never dispatched.
    APPROVAL_DENIED = "APPROVAL_DENIED"
    APPROVAL_EXPIRED = "APPROVAL_EXPIRED"
    #: The run is paused: no call is recorded and no approved call dispatched until it
    #: is unpaused.
    RUN_PAUSED = "RUN_PAUSED"
    #: A resumed governed call whose one dispatch was taken by another resumer (or by a
    #: process that died running it): its outcome is not recorded yet, and it never runs
    #: again.
    ALREADY_DISPATCHED = "ALREADY_DISPATCHED"
    #: The stored request of an approved call no longer has the approved digest: nothing
    #: ran.
    APPROVED_REQUEST_CHANGED = "APPROVED_REQUEST_CHANGED"
    #: A governed call's record disagrees with its journal (its tool, its stage, its
    #: decisions or its chain): nothing ran.
    JOURNAL_MISMATCH = "JOURNAL_MISMATCH"
    #: The run's payloads were erased (``canon erase``): a governed call of it, whose
    #: frozen request is gone, never runs.
    RUN_ERASED = "RUN_ERASED"
    # A call whose process died while it was in flight, settled afterwards.
    #: Found not to have run (by the tool's reconcile hook or an operator): it is never
    #: run again by itself.
    RECONCILED_NOT_EXECUTED = "RECONCILED_NOT_EXECUTED"
    #: Found to have run (by an operator) with its result unknown: never run again.
    RECONCILED_EXECUTED = "RECONCILED_EXECUTED"
    #: An ungoverned call left by a process that died, which no retry took over in time.
    ABANDONED = "ABANDONED"


#: One fixed message per code. These are the only words an agent ever reads about a failure,
#: but for a payload refused for its size, whose reply names the limit that was hit and its
#: configured size instead (:meth:`machine.limits.LimitHit.message`), and for EXECUTION_FAILED
#: of a tool that opted in (``ToolSpec.error_result``), whose reply is the tool's own error
#: text, scrubbed, bounded and recorded. Receipts keep these, but for that recorded text.
SAFE_MESSAGES: dict[ErrorCode, str] = {
    ErrorCode.INVALID_TOOL_CALL_ID: "The tool call id is missing or not allowed.",
    ErrorCode.RUN_MISMATCH: "The tool call does not belong to the current run.",
    ErrorCode.INVALID_INPUT: "The tool input must be a JSON object.",
    ErrorCode.REQUEST_TOO_LARGE: "The tool request is larger than allowed.",
    ErrorCode.UNAUTHORIZED: "The tool is not authorized for this run.",
    ErrorCode.NOT_READ_ONLY: "Only read-only tools may be called.",
    ErrorCode.UNKNOWN_TOOL: "The tool is not known.",
    ErrorCode.RUN_INACTIVE: "The run is not active.",
    ErrorCode.RUN_DEADLINE_EXPIRED: "The run has passed its deadline.",
    ErrorCode.EXECUTION_PAUSED: "Tool execution is paused.",
    ErrorCode.DUPLICATE_TOOL_CALL: "This tool call id was already used in this run.",
    ErrorCode.TOOL_BUDGET_EXHAUSTED: "The budget for this tool is exhausted.",
    ErrorCode.RUN_BUDGET_EXHAUSTED: "The tool budget of this run is exhausted.",
    ErrorCode.EXECUTION_FAILED: "The tool failed while executing.",
    ErrorCode.RESULT_TOO_LARGE: "The tool result is larger than allowed.",
    ErrorCode.PROJECTION_FAILED: "The tool result could not be prepared.",
    ErrorCode.INVALID_EVIDENCE_STATUS: "The tool result had an invalid evidence status.",
    ErrorCode.RECORD_EXPIRED: "The tool call record is no longer available.",
    ErrorCode.STORE_UNAVAILABLE: "The invocation store is unavailable.",
    ErrorCode.SERIALIZATION_FAILED: "The tool result could not be serialized.",
    ErrorCode.CALLER_CANCELLED: "The tool call was cancelled before it finished.",
    ErrorCode.APPROVAL_DENIED: "The tool call was denied by an operator and did not run.",
    ErrorCode.APPROVAL_EXPIRED: "The tool call was not approved in time and did not run.",
    ErrorCode.RUN_PAUSED: "Tool execution is paused for this run.",
    ErrorCode.ALREADY_DISPATCHED: (
        "The tool call was already dispatched; its outcome is not recorded yet."
    ),
    ErrorCode.APPROVED_REQUEST_CHANGED: (
        "The stored request no longer matches the approved one; the tool call did not run."
    ),
    ErrorCode.JOURNAL_MISMATCH: (
        "The tool call's record does not match its journal; the tool call did not run."
    ),
    ErrorCode.RUN_ERASED: "The run's data was erased; the tool call did not run.",
    ErrorCode.RECONCILED_NOT_EXECUTED: (
        "The tool call was found not to have run after its process stopped; it is not run again."
    ),
    ErrorCode.RECONCILED_EXECUTED: (
        "The tool call ran, but its result was not recorded. Do not repeat it."
    ),
    ErrorCode.ABANDONED: (
        "The tool call was left unfinished by a process that stopped, and nobody retried it."
    ),
}

#: Codes of a call ended by a settlement after its process died (a Settled event).
SETTLEMENT_CODES: frozenset[ErrorCode] = frozenset(
    {ErrorCode.RECONCILED_NOT_EXECUTED, ErrorCode.RECONCILED_EXECUTED, ErrorCode.ABANDONED}
)

#: Codes that refuse a call before any record exists.
PREFLIGHT_CODES: frozenset[ErrorCode] = frozenset(
    {
        ErrorCode.INVALID_TOOL_CALL_ID,
        ErrorCode.RUN_MISMATCH,
        ErrorCode.INVALID_INPUT,
        ErrorCode.REQUEST_TOO_LARGE,
        ErrorCode.UNAUTHORIZED,
        ErrorCode.NOT_READ_ONLY,
        ErrorCode.UNKNOWN_TOOL,
        ErrorCode.RUN_INACTIVE,
        ErrorCode.RUN_DEADLINE_EXPIRED,
        ErrorCode.EXECUTION_PAUSED,
        ErrorCode.RUN_PAUSED,
        ErrorCode.DUPLICATE_TOOL_CALL,
        ErrorCode.TOOL_BUDGET_EXHAUSTED,
        ErrorCode.RUN_BUDGET_EXHAUSTED,
    }
)
