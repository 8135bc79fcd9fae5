"""On the cluster: random envelopes never break the boundary.

The tests of ``tests/integration/test_boundary_property.py``, collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_boundary_property as single_server

globals().update(single_server_tests(single_server))
