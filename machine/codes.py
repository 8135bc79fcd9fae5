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
}

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
