"""On the cluster: concurrent and retried appends apply once.

The tests of ``tests/integration/test_core_concurrency.py``, collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_core_concurrency as single_server

globals().update(single_server_tests(single_server))
