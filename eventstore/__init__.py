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
from eventstore.errors import CanonError, Refused, StoreUnavailable
from eventstore.reader import InvocationRecord, StoredEvent
from eventstore.replication import ReplicationTimeout
from eventstore.runs import OpenedRun, RunInfo
from eventstore.store import Store
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
    "StoreUnavailable",
    "StoredEvent",
    "ToolBoundary",
    "ToolCall",
    "ToolEnvelope",
    "ToolError",
    "ToolResult",
    "ToolSpec",
    "reply_to_builtins",
]
