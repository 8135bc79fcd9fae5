"""On the cluster: worker processes: burst, SIGTERM, takeover after a kill.

The tests of ``tests/integration/test_projection_processes.py``, collected again (``reuse.py``).
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_projection_processes as single_server

globals().update(single_server_tests(single_server))
