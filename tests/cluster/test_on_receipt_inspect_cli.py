"""On the cluster: ``canon inspect`` reads receipts.

The tests of ``tests/integration/test_receipt_inspect_cli.py``, collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_receipt_inspect_cli as single_server

globals().update(single_server_tests(single_server))
