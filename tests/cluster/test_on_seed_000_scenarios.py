"""On the cluster: every scenario of seed 000.

The tests of ``tests/integration/test_seed_000_scenarios.py``, collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_seed_000_scenarios as single_server

globals().update(single_server_tests(single_server))
