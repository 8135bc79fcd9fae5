"""On the cluster: replayed retries.

The tests of ``tests/integration/test_boundary_replay.py``, collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_boundary_replay as single_server

globals().update(single_server_tests(single_server))
