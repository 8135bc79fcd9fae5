"""Everything that talks to Redis for writes and audit: the canonical invocation store."""

from eventstore.boundary import (
    AgentReply,
    ApprovalPending,
    Projection,
    ReconcileReport,
    Reconciliation,
    RunContext,
    ToolBoundary,
    ToolCall,
    ToolEnvelope,
    ToolError,
    ToolResult,
    ToolSpec,
    reply_to_builtins,
)
from eventstore.errors import CanonError, Refused, StoreClosed, StoreUnavailable, WrongEventLoop
from eventstore.keyring import Keyring
from eventstore.reader import InvocationRecord, StoredEvent
from eventstore.runs import OpenedRun, Refusal, RunInfo
from eventstore.server.durability import DurabilityError
from eventstore.settings import StoreSettings
from eventstore.settlements import Settlement
from eventstore.store import Store
from eventstore.sync import SyncBoundary, SyncStore
from eventstore.wire.replication import ReplicationTimeout
from machine.limits import Limits

__all__ = [
    "AgentReply",
    "ApprovalPending",
    "CanonError",
    "DurabilityError",
    "InvocationRecord",
    "Keyring",
    "Limits",
    "OpenedRun",
    "Projection",
    "ReconcileReport",
    "Reconciliation",
    "Refusal",
    "Refused",
    "ReplicationTimeout",
    "RunContext",
    "RunInfo",
    "Settlement",
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
