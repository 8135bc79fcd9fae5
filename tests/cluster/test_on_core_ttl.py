"""On the cluster: one expiry per record, set once, never extended.

The tests of ``tests/integration/test_core_ttl.py``, collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_core_ttl as single_server

globals().update(single_server_tests(single_server))
