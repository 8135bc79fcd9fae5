"""What ``canon mcp-proxy`` records and what the host gets back for a recorded call.

The proxy itself is :mod:`canon.integrations.mcp_relay` (the transparent relay, where each
``tools/call`` goes through the boundary), with the upstream in
:mod:`canon.integrations.mcp_upstream` and the host's side in
:mod:`canon.integrations.mcp_stdio` and :mod:`canon.integrations.mcp_http`. This module
holds the proxy's answers: :func:`host_result` (the upstream's result as recorded),
:func:`safe_error_result` (a refused or failed call, with :func:`limit_hint` naming the
flag of a size limit) and :func:`open_runs_with` (the runs it opens).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from canon.integrations._shared import reply_payload, require
from canon.integrations.mcp import RunOptions, json_result
from eventstore.boundary.contracts import AgentReply, ToolError, ToolResult
from eventstore.errors import CanonError, RunExists
from eventstore.store import Store
from machine.codes import ErrorCode
from machine.limits import Limits

require("mcp", "mcp")


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
