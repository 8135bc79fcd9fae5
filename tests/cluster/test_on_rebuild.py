"""On the cluster: ``canon rebuild`` and its generations.

The tests of ``tests/integration/test_rebuild.py``, collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_rebuild as single_server

globals().update(single_server_tests(single_server))
