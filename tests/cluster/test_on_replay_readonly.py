"""On the cluster: the audit commands only read.

The tests of ``tests/integration/test_replay_readonly.py``, collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_replay_readonly as single_server

EXCLUDED = {
    "test_audit_commands_issue_only_reads_and_leave_every_expiry": (
        "runs verify and status, which scan one server (per primary on a cluster), "
        "and counts commands with INFO commandstats, which is per node"
    ),
}

globals().update(single_server_tests(single_server, exclude=EXCLUDED))
