"""Read-only audit tooling: replay one invocation, verify a namespace, export a run, status.

Nothing in this package writes to Redis or touches an expiry; the stores it opens are
opened with :func:`open_read_only`.
"""

from eventstore.audit_tools.export import export_run
from eventstore.audit_tools.readonly import Snapshot, open_read_only, read_snapshot
from eventstore.audit_tools.replay import InvocationReplay, Verdict, replay_invocation, replay_run
from eventstore.audit_tools.status import NamespaceStatus, namespace_status
from eventstore.audit_tools.timeline import TimelineStep
from eventstore.audit_tools.verify import NamespaceVerifier, VerifyProblem, VerifySummary

__all__ = [
    "InvocationReplay",
    "NamespaceStatus",
    "NamespaceVerifier",
    "Snapshot",
    "TimelineStep",
    "Verdict",
    "VerifyProblem",
    "VerifySummary",
    "export_run",
    "namespace_status",
    "open_read_only",
    "read_snapshot",
    "replay_invocation",
    "replay_run",
]
