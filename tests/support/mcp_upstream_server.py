"""A small, unmodified MCP server (the SDK's MCPServer) on stdio, for the proxy's tests.

``python tests/support/mcp_upstream_server.py [COUNT_FILE] [PORT]`` serves three tools
(on stdio, or with a PORT over streamable HTTP on 127.0.0.1):
``lookup`` answers a query, ``fail`` always raises (the SDK answers ``isError: true``) and
``ping`` takes no arguments. With ``COUNT_FILE``, each call of a tool appends one line
with its name, so tests can tell how often the upstream really ran a tool.
"""

from __future__ import annotations

import logging
import sys

from mcp.server.mcpserver import MCPServer

# The SDK logs a tool's traceback; this server's tests read the proxy's stderr for leaks.
logging.disable(logging.CRITICAL)

server = MCPServer("upstream")
_count_file = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else None
_port = int(sys.argv[2]) if len(sys.argv) > 2 else None


def _counted(tool: str) -> None:
    if _count_file:
        with open(_count_file, "a", encoding="utf-8") as out:
            out.write(tool + "\n")


@server.tool()
def lookup(q: str) -> str:
    """Look a query up."""
    _counted("lookup")
    return f"answer to {q}"


@server.tool()
def fail(q: str = "") -> str:
    """Always fails."""
    _counted("fail")
    raise RuntimeError("upstream detail PAYLOAD-MARKER")


@server.tool()
def ping() -> str:
    """Answer pong; takes no arguments."""
    _counted("ping")
    return "pong"


if __name__ == "__main__":
    if _port is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=_port)
