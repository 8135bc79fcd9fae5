"""An MCP proxy: any MCP server's tools, every call recorded through the boundary.

:func:`proxy_server` lists the upstream server's tools once (names, descriptions, input
and output schemas passed through as listed) and serves them with
:func:`canon.integrations.mcp.build_server`. Each ``tools/call`` becomes an invocation:
the executor calls the upstream's ``tools/call`` and its raw response, stored in the
record, is the upstream's ``CallToolResult`` as JSON; the projector's bounded result is
what the host sees, the upstream's ``content`` (and ``structuredContent``) within the
store's limits, with evidence found when the upstream returned any. An upstream
``isError: true`` result fails the invocation (EXECUTION_FAILED): the host sees the safe
error, never the upstream's error text (which only the raised exception carries).
:func:`connect_upstream` starts the upstream (a command on stdio) or reaches it (a
streamable-HTTP URL). ``canon mcp-proxy`` is the command line around both.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Final

from canon.integrations._shared import reply_payload, require
from canon.integrations.mcp import RunOptions, build_server, json_result
from canon.integrations.mcp_upstream import upstream_environment
from eventstore.boundary.contracts import (
    AgentReply,
    Projection,
    ToolCall,
    ToolError,
    ToolResult,
    ToolSpec,
)
from eventstore.boundary.tool_boundary import OnDuplicate, ToolBoundary
from eventstore.errors import CanonError, RunExists
from eventstore.store import Store
from machine.codes import ErrorCode
from machine.limits import Limits

require("mcp", "mcp")

import mcp_types as types  # noqa: E402  (after the extra's check, on purpose)
import pydantic  # noqa: E402
from mcp.client.session import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.server.lowlevel import Server  # noqa: E402

#: Most pages of ``tools/list`` read from the upstream: a paginator that never ends
#: cannot keep the proxy from starting.
MAX_LIST_PAGES: Final = 100
# Most characters of an upstream error's text kept as failure detail.
_DETAIL_CHARS = 2000


class UpstreamToolError(CanonError):
    """Raised when the upstream server answers a call with ``isError: true``."""


@asynccontextmanager
async def connect_upstream(
    command: Sequence[str] | None = None, *, url: str | None = None
) -> AsyncIterator[ClientSession]:
    """Start ``command`` as a stdio MCP server (or reach ``url``) and hand an open session.

    The child inherits this process's environment (without canon's own settings) and
    its standard error; it stops when the block ends.
    """
    async with AsyncExitStack() as stack:
        if url is not None:
            read_stream, write_stream = await stack.enter_async_context(streamable_http_client(url))
        elif command:
            parameters = StdioServerParameters(
                command=command[0], args=list(command[1:]), env=upstream_environment()
            )
            read_stream, write_stream = await stack.enter_async_context(stdio_client(parameters))
        else:
            raise ValueError("connect_upstream needs a command or a url")
        session = await stack.enter_async_context(ClientSession(read_stream, write_stream))
        await session.initialize()
        yield session


async def list_upstream_tools(session: ClientSession) -> list[types.Tool]:
    """Every tool the upstream lists, following its pages."""
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(MAX_LIST_PAGES):
        page = await session.list_tools(
            params=types.PaginatedRequestParams(cursor=cursor) if cursor else None
        )
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def upstream_specs(
    session: ClientSession, tools: Sequence[types.Tool], *, timeout_s: float | None = None
) -> dict[str, ToolSpec]:
    """One ToolSpec per upstream tool, its executor calling the upstream."""
    return {
        tool.name: ToolSpec(
            executor=_Upstream(session, tool.name),
            projector=project_upstream,
            timeout_s=timeout_s,
            description=tool.description or "",
            input_schema=tool.input_schema,
        )
        for tool in tools
    }


def project_upstream(raw: Any, call: ToolCall) -> Projection:
    """The bounded result: the upstream's content (and structured content), evidence if any."""
    result: dict[str, Any] = {"content": raw.get("content", [])}
    if raw.get("structuredContent") is not None:
        result["structuredContent"] = raw["structuredContent"]
    found = bool(result["content"]) or "structuredContent" in result
    return Projection(
        result=result,
        evidence_status="EVIDENCE_FOUND" if found else "NO_EVIDENCE",
        scope=f"mcp tool {call.tool}",
    )


def upstream_result(reply: ToolResult) -> types.CallToolResult:
    """The host's result for a recorded upstream answer, as the upstream shaped it."""
    try:
        return types.CallToolResult.model_validate(reply.result)
    except pydantic.ValidationError:
        return json_result(reply)


@asynccontextmanager
async def proxy_server(
    store: Store,
    session: ClientSession,
    *,
    run_id: str | None = None,
    run_options: RunOptions | None = None,
    on_duplicate: OnDuplicate = "replay",
    timeout_s: float | None = None,
    name: str = "canon-mcp-proxy",
) -> AsyncIterator[Server[dict[str, Any]]]:
    """An MCP server in front of ``session``'s server, recording every call in ``store``.

    Runs are opened on their first call with ``run_options`` (a run opened beforehand,
    for instance by the harness that holds its receipt token, is used as it is).
    ``on_duplicate`` defaults to ``"replay"``: a host that re-sends a call with the same
    ``io.canon/tool_call_id`` gets the recorded answer and the upstream is not called
    again.
    """
    tools = await list_upstream_tools(session)
    boundary = ToolBoundary(
        store, upstream_specs(session, tools, timeout_s=timeout_s), on_duplicate=on_duplicate
    )
    try:
        yield build_server(
            boundary,
            tools,
            name=name,
            run_id=run_id,
            open_runs=(store, run_options or RunOptions()),
            result_of=upstream_result,
        )
    finally:
        boundary.close()


class _Upstream:
    """The executor of one upstream tool: its raw response is the upstream's result."""

    def __init__(self, session: ClientSession, tool: str) -> None:
        self._session = session
        self._tool = tool

    async def __call__(self, arguments: Mapping[str, Any], call: ToolCall) -> Any:
        result = await self._session.call_tool(self._tool, dict(arguments))
        if result.is_error:
            text = " ".join(
                block.text for block in result.content if isinstance(block, types.TextContent)
            )
            raise UpstreamToolError(text[:_DETAIL_CHARS])
        return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def host_result(reply: ToolResult) -> dict[str, Any]:
    """The host's ``tools/call`` result for a recorded reply: the upstream's, as recorded."""
    result = reply.result
    if isinstance(result, dict) and isinstance(result.get("content"), list):
        return dict(result)
    return json_result(reply).model_dump(mode="json", by_alias=True, exclude_none=True)


def safe_error_result(reply: AgentReply, *, limits: Limits | None = None) -> dict[str, Any]:
    """The host's result for a refused or failed call: ``isError`` with the safe error.

    A call over one of the proxy's size limits also says which limit, its size and the
    ``canon mcp-proxy`` flag that raises it (under ``limit``): the fixed message alone
    would leave a desktop user guessing.
    """
    payload = reply_payload(reply)
    hint = limit_hint(reply, limits) if limits is not None else None
    if hint is not None:
        payload = {**payload, "limit": hint}
    return {"content": [{"type": "text", "text": json.dumps(payload)}], "isError": True}


def limit_hint(reply: AgentReply, limits: Limits) -> str | None:
    """For a call refused or failed over a size limit, the limit and its flag, else None."""
    if not isinstance(reply, ToolError):
        return None
    if reply.error_code is ErrorCode.REQUEST_TOO_LARGE:
        return (
            f"the arguments are over {limits.request_bytes} bytes or {limits.json_depth} "
            "levels deep; raise it with --max-request-bytes"
        )
    if reply.error_code is ErrorCode.RESULT_TOO_LARGE:
        return (
            f"the upstream's result is over {limits.raw_bytes} bytes (--max-raw-bytes) or its "
            f"result over {limits.result_bytes} bytes (--max-result-bytes); raise them"
        )
    return None


def open_runs_with(store: Store, options: RunOptions) -> Callable[[str], Awaitable[None]]:
    """Open a run on its first call with ``options``; a run that exists is used as it is."""

    async def ensure(run_id: str) -> None:
        try:
            await store.open_run(run_id, deadline=options.deadline, budget=options.budget)
        except RunExists:
            pass
        except CanonError:
            # An unsafe id or Redis away: the boundary answers the call with the matching
            # safe error, so nothing is decided here.
            pass

    return ensure
