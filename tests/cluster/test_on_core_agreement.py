"""On the cluster: the writer and Lua agree with the fold on every (state, event) pair.

The tests of ``tests/integration/test_core_agreement.py``, collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_core_agreement as single_server

globals().update(single_server_tests(single_server))
