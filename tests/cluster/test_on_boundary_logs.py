"""On the cluster: the boundary logs safely.

The tests of ``tests/integration/test_boundary_logs.py``, collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_boundary_logs as single_server

EXCLUDED = {
    "test_store_outage_logs_safely": (
        "stops a single server of its own (server_binary); not a cluster scenario"
    ),
}

globals().update(single_server_tests(single_server, exclude=EXCLUDED))
