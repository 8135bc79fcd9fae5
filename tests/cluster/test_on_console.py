"""On the cluster: the tests of ``tests/integration/test_console.py``.

Collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_console as single_server

globals().update(single_server_tests(single_server))
