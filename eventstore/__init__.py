"""Everything that talks to Redis for writes and audit: the canonical invocation store."""

from eventstore.errors import CanonError, Refused, StoreUnavailable
from eventstore.reader import InvocationRecord, StoredEvent
from eventstore.runs import OpenedRun, RunInfo
from eventstore.store import Store
from machine.limits import Limits

__all__ = [
    "CanonError",
    "InvocationRecord",
    "Limits",
    "OpenedRun",
    "Refused",
    "RunInfo",
    "Store",
    "StoreUnavailable",
    "StoredEvent",
]
