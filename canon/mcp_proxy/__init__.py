"""``canon mcp-proxy``: the transparent MCP proxy that records every ``tools/call``.

Its room, one module per concern: the message pump between host and upstream
(:mod:`~canon.mcp_proxy.relay`), the ``tools/call`` path through the boundary, fail closed
(:mod:`~canon.mcp_proxy.calls`), JSON-RPC frames, codes and limits
(:mod:`~canon.mcp_proxy.messages`), the upstream, a child process or a URL
(:mod:`~canon.mcp_proxy.upstream`), the host's transports (:mod:`~canon.mcp_proxy.stdio`,
:mod:`~canon.mcp_proxy.http`) and what the host gets back for a recorded call
(:mod:`~canon.mcp_proxy.answers`). It needs the ``mcp`` extra.
"""

from canon.integrations._shared import require

require("mcp", "mcp")
