"""Everything that talks to Redis for writes and audit: the canonical invocation store."""

from eventstore.boundary import ToolBoundary
from eventstore.contracts import (
    AgentReply,
    Projection,
    RunContext,
    ToolCall,
    ToolEnvelope,
    ToolError,
    ToolResult,
    ToolSpec,
    reply_to_builtins,
)
from eventstore.durability import DurabilityError
from eventstore.errors import CanonError, Refused, StoreClosed, StoreUnavailable, WrongEventLoop
from eventstore.reader import InvocationRecord, StoredEvent
from eventstore.replication import ReplicationTimeout
from eventstore.runs import OpenedRun, RunInfo
from eventstore.settings import StoreSettings
from eventstore.store import Store
from eventstore.sync import SyncBoundary, SyncStore
from machine.limits import Limits

__all__ = [
    "AgentReply",
    "CanonError",
    "DurabilityError",
    "InvocationRecord",
    "Limits",
    "OpenedRun",
    "Projection",
    "Refused",
    "ReplicationTimeout",
    "RunContext",
    "RunInfo",
    "Store",
    "StoreClosed",
    "StoreSettings",
    "StoreUnavailable",
    "StoredEvent",
    "SyncBoundary",
    "SyncStore",
    "ToolBoundary",
    "ToolCall",
    "ToolEnvelope",
    "ToolError",
    "ToolResult",
    "ToolSpec",
    "WrongEventLoop",
    "reply_to_builtins",
]
