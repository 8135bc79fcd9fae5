"""An unmodified MCP server (the SDK's MCPServer) with annotated tools, for governed calls.

``python tests/support/mcp_governed_upstream.py COUNT_FILE`` serves on stdio:

* ``read_inbox`` (``readOnlyHint: true``): lists the inbox.
* ``send_email`` (``readOnlyHint: false``): "sends" an email.
* ``archive`` (no annotations, so MCP reads it as one that may change things).
* ``confirm`` (``readOnlyHint: true``): asks the host a yes/no question by a form-mode
  elicitation and answers with what the host said.

Each call a tool really runs appends one line, ``<tool> <arguments as JSON>``, to
COUNT_FILE, so tests can tell how often the upstream ran a tool, and with what.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations
from pydantic import BaseModel

logging.disable(logging.CRITICAL)

server = MCPServer("governed-upstream")
_count_file = sys.argv[1]


def _ran(tool: str, arguments: dict[str, Any]) -> None:
    with open(_count_file, "a", encoding="utf-8") as out:
        out.write(f"{tool} {json.dumps(arguments, sort_keys=True)}\n")


class Answer(BaseModel):
    """The form the ``confirm`` elicitation asks the host to fill."""

    approve: bool


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def read_inbox() -> str:
    """List the inbox."""
    _ran("read_inbox", {})
    return "3 messages"


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
def send_email(to: str, body: str) -> str:
    """Send an email."""
    _ran("send_email", {"to": to, "body": body})
    return f"sent to {to}"


@server.tool()
def archive(q: str) -> str:
    """Archive the messages that match a query."""
    _ran("archive", {"q": q})
    return f"archived {q}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def confirm(question: str, ctx: Context) -> str:
    """Ask the user a yes/no question."""
    _ran("confirm", {"question": question})
    answer = await ctx.elicit(question, Answer)
    data = getattr(answer, "data", None)
    return f"{answer.action}: {data.approve if isinstance(data, Answer) else None}"


if __name__ == "__main__":
    server.run("stdio")
