"""The tools of a harness, as ``canon reconcile --tools tests.support.reconcile_tools:TOOLS``
loads them: a governed refund tool whose reconcile hook asks a "bank" what happened (a
file listing the invocation ids it paid, one a line, named by ``CANON_TEST_BANK``).
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

from eventstore import Reconciliation, ToolSpec
from eventstore.boundary.contracts import Projection, ToolCall
from machine.codes import EvidenceStatus

#: The environment variable naming the bank's file.
BANK = "CANON_TEST_BANK"


def refund(arguments: dict[str, Any], call: ToolCall) -> Any:
    """Never run by a reconcile: the hook only looks the refund up."""
    raise AssertionError("a reconcile never runs the tool")


def project(raw: Any, call: ToolCall) -> Projection:
    """The bank's answer, as the agent sees it."""
    return Projection(result=raw, evidence_status=EvidenceStatus.EVIDENCE_FOUND, scope="bank")


def look_up(arguments: dict[str, Any], call: ToolCall) -> Reconciliation:
    """Paid: executed, with the bank's record of it; else not executed."""
    paid = pathlib.Path(os.environ[BANK]).read_text().split()
    if call.invocation_id in paid:
        return Reconciliation.executed({"refunded": arguments["amount"]}, evidence="bank: paid")
    return Reconciliation.not_executed(evidence="bank: no refund under this key")


TOOLS = {
    "refund": ToolSpec(
        executor=refund, projector=project, read_only=False, approval=True, reconcile=look_up
    )
}
