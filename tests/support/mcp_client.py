"""What the MCP tests read from a session: a connection to ``serve_tools``, a result's
text, and the pending result of a governed call."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
from mcp import ClientSession
from mcp.shared.memory import create_client_server_memory_streams
from mcp_types import CallToolResult, TextContent

from canon.integrations.mcp import (
    APPROVAL_ID_KEY,
    INVOCATION_ID_KEY,
    RUN_ID_KEY,
    TOOL_CALL_ID_KEY,
    serve_tools,
)
from eventstore import ToolBoundary, ToolSpec
from machine.ids import invocation_id


@asynccontextmanager
async def connected(
    boundary: ToolBoundary, tools: Mapping[str, ToolSpec], **options: Any
) -> AsyncIterator[ClientSession]:
    """One MCP connection to ``serve_tools`` over in-memory streams."""
    async with (
        create_client_server_memory_streams() as (client_streams, server_streams),
        anyio.create_task_group() as group,
    ):
        group.start_soon(lambda: serve_tools(boundary, tools, streams=server_streams, **options))
        async with ClientSession(*client_streams) as session:
            await session.initialize()
            yield session
        # Closing the client's write side ends the server's read loop.
        await client_streams[1].aclose()


def text_of(result: CallToolResult) -> str:
    """The text of a result made of one text block."""
    [block] = result.content
    assert isinstance(block, TextContent)
    return block.text


def assert_pending(result: CallToolResult, run_id: str, call: str) -> str:
    """The result is the pending one (not an error) for ``call`` of ``run_id``; returns
    its approval id."""
    assert not result.is_error
    assert result.meta is not None
    approval_id = result.meta[APPROVAL_ID_KEY]
    assert text_of(result) == (
        f"The tool call is awaiting an operator's approval (approval {approval_id}) "
        "and has not run. Do not retry it: it runs once approved."
    )
    assert result.meta[RUN_ID_KEY] == run_id
    assert result.meta[TOOL_CALL_ID_KEY] == call
    assert result.meta[INVOCATION_ID_KEY] == invocation_id(run_id, call)
    return str(approval_id)
