"""On the cluster: the run-progress worker.

The tests of ``tests/integration/test_projection_progress.py``, collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_projection_progress as single_server

globals().update(single_server_tests(single_server))
