"""On the cluster: ``canon export``.

The tests of ``tests/integration/test_export.py``, collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_export as single_server

globals().update(single_server_tests(single_server))
