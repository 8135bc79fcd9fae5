"""Named exit codes of the ``canon`` command (the table is in docs/operators.md).

=====  =============================================================================
code   meaning
=====  =============================================================================
0      the command did what it was asked (``status`` could report, warnings or not)
1      the command ran and found a problem: an integrity failure, nothing found,
       a rebuild claim held by another; ``status --strict`` with warnings
2      usage: a bad argument or setting, a port in use, a folder that cannot be used
       (or that a newer Redis wrote than the newest found), a database the server
       does not have, ``--cluster`` against a server not in cluster mode
3      the Redis server is unavailable: refused, unresolvable, timed out, or the
       embedded one could not start
=====  =============================================================================
"""

from typing import Final

RET_OK: Final = 0
#: The command ran and found a problem (an integrity failure, a failed check).
RET_PROBLEM: Final = 1
#: Bad arguments or settings: fix the command line.
RET_USAGE: Final = 2
#: The Redis server could not be reached or used: fix the server or the network.
RET_UNAVAILABLE: Final = 3
#: ``canon mcp-proxy``: the upstream MCP server could not be started or never answered.
RET_UPSTREAM: Final = 4
