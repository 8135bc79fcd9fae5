"""Pure domain of the canonical tool-invocation store: events, lifecycle, fold, rules.

Nothing here does I/O.
"""

from machine.codes import SAFE_MESSAGES, ErrorCode, EvidenceStatus, Stage, Status
from machine.events import (
    ApprovalAdded,
    ApprovalExpired,
    ApprovalRequested,
    Approved,
    Completed,
    Denied,
    Dispatched,
    Event,
    Failed,
    Preflighted,
    ProjectingStarted,
    Reconciled,
    Settled,
    TakenOver,
    decode_event,
    encode_event,
)
from machine.fold import FoldError, InvocationState, fold, fold_all
from machine.limits import Limits

__all__ = [
    "SAFE_MESSAGES",
    "ApprovalAdded",
    "ApprovalExpired",
    "ApprovalRequested",
    "Approved",
    "Completed",
    "Denied",
    "Dispatched",
    "ErrorCode",
    "Event",
    "EvidenceStatus",
    "Failed",
    "FoldError",
    "InvocationState",
    "Limits",
    "Preflighted",
    "ProjectingStarted",
    "Reconciled",
    "Settled",
    "Stage",
    "Status",
    "TakenOver",
    "decode_event",
    "encode_event",
    "fold",
    "fold_all",
]
