"""On the cluster: refused writes create nothing.

The tests of ``tests/integration/test_core_refusals.py``, collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_core_refusals as single_server

EXCLUDED = {
    "test_other_shard_count_on_a_namespace_is_refused": (
        "inspects a single server's connection pool; test_cluster_layout has the cluster version"
    ),
}

globals().update(single_server_tests(single_server, exclude=EXCLUDED))
