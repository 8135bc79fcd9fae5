"""On the cluster: projections copy no raw payload.

The tests of ``tests/integration/test_projection_no_raw.py``, collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_projection_no_raw as single_server

globals().update(single_server_tests(single_server))
