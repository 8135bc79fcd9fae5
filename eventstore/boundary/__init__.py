"""The harness-facing call path: how one tool call is checked, run and recorded.

:class:`ToolBoundary` (:mod:`.tool_boundary`) is the one way a harness runs a tool; the
types it speaks are in :mod:`.contracts`. The rest of this folder is how a call is run:
:mod:`.registered_tools` (what each tool needs, decided once at registration),
:mod:`.tool_threads` (plain executors and projectors on worker threads),
:mod:`.call_trace` (one call's decisions and the log lines that report them),
:mod:`.call_stops` (ending a call early with a stable code), :mod:`.interrupts`
(closing the record of a call cut short), :mod:`.duplicates` (answering a retried call
from its record) and :mod:`.tracing` (OpenTelemetry spans).
"""

from eventstore.boundary.contracts import (
    AgentReply,
    ApprovalPending,
    ApprovalPolicy,
    ErrorResult,
    Executor,
    Projection,
    Projector,
    Reconcile,
    Reconciliation,
    RunContext,
    ToolCall,
    ToolEnvelope,
    ToolError,
    ToolResult,
    ToolSpec,
    reply_status,
    reply_to_builtins,
)
from eventstore.boundary.reconciling import ReconciledCall, ReconcileReport
from eventstore.boundary.tool_boundary import ToolBoundary

__all__ = [
    "AgentReply",
    "ApprovalPending",
    "ApprovalPolicy",
    "ErrorResult",
    "Executor",
    "Projection",
    "Projector",
    "Reconcile",
    "ReconcileReport",
    "ReconciledCall",
    "Reconciliation",
    "RunContext",
    "ToolBoundary",
    "ToolCall",
    "ToolEnvelope",
    "ToolError",
    "ToolResult",
    "ToolSpec",
    "reply_status",
    "reply_to_builtins",
]
