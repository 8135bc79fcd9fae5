"""On the cluster: the tests of ``tests/integration/test_http_invocations.py``.

Collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_http_invocations as single_server

globals().update(single_server_tests(single_server))
