"""On the cluster: worker counters and lag metrics.

The tests of ``tests/integration/test_projection_metrics.py``, collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_projection_metrics as single_server

globals().update(single_server_tests(single_server))
