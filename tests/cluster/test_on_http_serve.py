"""On the cluster: ``canon serve``: receipts and progress over HTTP.

The tests of ``tests/integration/test_http_serve.py``, collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_http_serve as single_server

globals().update(single_server_tests(single_server))
