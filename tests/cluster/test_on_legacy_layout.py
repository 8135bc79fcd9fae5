"""On the cluster: a namespace in the legacy key layout stays readable and writable.

The tests of ``tests/integration/test_legacy_layout.py``, collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_legacy_layout as single_server

_VERIFY = "canon verify refuses a cluster URL: it is run against each primary in turn"
EXCLUDED = {
    "test_verify_reads_the_legacy_layout": _VERIFY,
    "test_verify_still_tells_a_legacy_stream_from_its_record": _VERIFY,
    "test_status_counts_legacy_records_not_their_streams": "canon status refuses a cluster URL",
}

globals().update(single_server_tests(single_server, exclude=EXCLUDED))
