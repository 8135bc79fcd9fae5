"""On the cluster: the receipt worker.

The tests of ``tests/integration/test_receipt_worker.py``, collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_receipt_worker as single_server

globals().update(single_server_tests(single_server))
