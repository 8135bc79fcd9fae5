"""On the cluster: the tests of ``tests/integration/test_run_index.py``.

Collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_run_index as single_server

globals().update(single_server_tests(single_server))
