"""Pure domain of the canonical tool-invocation store: events, lifecycle, fold, rules.

Nothing here does I/O.
"""

from machine.codes import SAFE_MESSAGES, ErrorCode, EvidenceStatus, Stage, Status
from machine.events import (
    Completed,
    Event,
    Failed,
    Preflighted,
    ProjectingStarted,
    decode_event,
    encode_event,
)
from machine.fold import FoldError, InvocationState, fold, fold_all
from machine.limits import Limits

__all__ = [
    "SAFE_MESSAGES",
    "Completed",
    "ErrorCode",
    "Event",
    "EvidenceStatus",
    "Failed",
    "FoldError",
    "InvocationState",
    "Limits",
    "Preflighted",
    "ProjectingStarted",
    "Stage",
    "Status",
    "decode_event",
    "encode_event",
    "fold",
    "fold_all",
]
