"""On the cluster: every provider's tool call id, kept exactly; every key in the run's slot.

The tests of ``tests/integration/test_provider_ids.py``, collected again (``reuse.py``):
there ``redis`` is a cluster client, so the slot of every key is asked of the cluster
(``CLUSTER KEYSLOT``) and must be the slot of the run's shard tag, braces in the id or not.
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_provider_ids as single_server

globals().update(single_server_tests(single_server))
