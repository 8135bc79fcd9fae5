"""On the cluster: no record left PROJECTING by the tool or the caller.

The tests of ``tests/integration/test_boundary_interrupts.py``, collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_boundary_interrupts as single_server

globals().update(
    single_server_tests(
        single_server,
        exclude={
            "test_cancelling_while_the_record_is_being_created_closes_it": (
                "the cluster client is not batched, and redis-py's cluster client absorbs a "
                "cancellation that lands during its command: the call then simply goes on"
            ),
            "test_cancelling_while_a_failure_is_being_written_still_closes_the_record": (
                "the same: the cluster client absorbs a cancellation during its command"
            ),
        },
    )
)
