"""A small, unmodified MCP server (the SDK's MCPServer) on stdio, for the proxy's tests.

``python tests/support/mcp_upstream_server.py [COUNT_FILE] [PORT]`` serves three tools
(on stdio, or with a PORT over streamable HTTP on 127.0.0.1):
``lookup`` answers a query, ``fail`` always raises (the SDK answers ``isError: true``) and
``ping`` takes no arguments. With ``COUNT_FILE``, each call of a tool appends one line
with its name, so tests can tell how often the upstream really ran a tool. Over HTTP,
``UPSTREAM_BEARER_TOKEN`` in the environment makes every request without
``Authorization: Bearer <it>`` an HTTP 401, as an OAuth-protected server answers.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

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


def _guarded(app: Any, token: str) -> Any:
    """``app`` behind a bearer-token check (lifespan and other scopes pass through)."""
    expected = f"Bearer {token}".encode()

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await app(scope, receive, send)

    return asgi


if __name__ == "__main__":
    _token = os.environ.get("UPSTREAM_BEARER_TOKEN")
    if _port is None:
        server.run("stdio")
    elif _token:
        import uvicorn

        app = _guarded(server.streamable_http_app(host="127.0.0.1"), _token)
        uvicorn.run(app, host="127.0.0.1", port=_port, log_level="warning")
    else:
        server.run("streamable-http", host="127.0.0.1", port=_port)
