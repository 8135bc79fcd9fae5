"""Audit: does a record match its journal, and the read-only tools built on that answer.

``journal`` checks a record against the events it was folded from; ``checks`` adds what
only the key space shows; ``timeline`` folds a journal step by step; ``replay``,
``verify``, ``export`` and ``status`` are the tools behind ``canon replay|verify|export|
status``; ``readonly`` opens a store for them without writing a byte and reads one
invocation consistently; ``namespaces`` finds the other namespaces that hold runs when a
command found nothing in its own. Nothing in this package writes to Redis or touches an
expiry.
"""

from eventstore.audit.export import export_run
from eventstore.audit.journal import verify_against_events, verify_fields
from eventstore.audit.readonly import Snapshot, open_read_only, read_snapshot
from eventstore.audit.replay import InvocationReplay, Verdict, replay_invocation, replay_run
from eventstore.audit.status import NamespaceStatus, namespace_status
from eventstore.audit.timeline import TimelineStep
from eventstore.audit.verify import NamespaceVerifier, VerifyProblem, VerifySummary

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
    "verify_against_events",
    "verify_fields",
]
