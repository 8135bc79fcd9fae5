"""On the cluster: the journal: payloads in the record only, hash chain, re-fold, audit.

The tests of ``tests/integration/test_core_journal.py``, collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_core_journal as single_server

globals().update(single_server_tests(single_server))
