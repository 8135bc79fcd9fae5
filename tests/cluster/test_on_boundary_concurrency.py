"""On the cluster: budgets and duplicates under concurrency.

The tests of ``tests/integration/test_boundary_concurrency.py``, collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_boundary_concurrency as single_server

EXCLUDED = {
    "test_tool_budget_holds_under_200_concurrent_calls_from_two_clients": (
        "asserts two single-server connection pools; test_cluster_layout has the cluster version"
    ),
    "test_run_budget_holds_under_200_concurrent_calls_from_two_clients": (
        "asserts two single-server connection pools; test_cluster_layout has the cluster version"
    ),
    "test_run_budget_binds_before_a_larger_tool_budget": (
        "asserts two single-server connection pools"
    ),
}

globals().update(single_server_tests(single_server, exclude=EXCLUDED))
