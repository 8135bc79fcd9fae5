"""What ``canon mcp-proxy`` records and what the host gets back for a recorded call.

The proxy itself is :mod:`canon.mcp_proxy.relay` (the transparent relay; each
``tools/call`` goes through the boundary in :mod:`canon.mcp_proxy.calls`), with the upstream in
:mod:`canon.mcp_proxy.upstream` and the host's side in
:mod:`canon.mcp_proxy.stdio` and :mod:`canon.mcp_proxy.http`. This module
holds the proxy's answers: :func:`host_result` (the upstream's result as recorded),
:func:`error_result` (a refused or failed call: the upstream's own error text when its
record holds one, else :func:`safe_error_result`, with :func:`limit_hint` naming the flag
of a size limit) and :func:`open_runs_with` (the runs it opens).

An upstream ``isError: true`` result fails the invocation (EXECUTION_FAILED). By default
(the relay's ``forward_tool_errors``) the host sees the upstream's error text, so that its
model can correct the call: the text of the result's ``text`` blocks, one per line,
scrubbed of secrets and within the agent result limit (else the safe error), as one
``isError: true`` text block, recorded as the failed record's agent result. With
``canon mcp-proxy --hide-tool-errors`` the host sees the safe error instead, and the text
stays in the harness-only failure detail (:class:`~canon.mcp_proxy.calls.UpstreamToolError`).
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
    # Any result object as the upstream sent it: content, structured content, or another
    # shape of the protocol (a task of the tasks extension, ``resultType: "task"``).
    if isinstance(result, dict):
        return dict(result)
    return json_result(reply).model_dump(mode="json", by_alias=True, exclude_none=True)


def error_result(reply: AgentReply, *, limits: Limits | None = None) -> dict[str, Any]:
    """The host's result for a refused or failed call.

    A failed call whose record holds the tool's own error text (the upstream's ``isError``
    text, forwarded unless ``--hide-tool-errors``; :attr:`ToolError.from_tool`) gets one
    ``isError: true`` text block with that text, scrubbed and bounded by the boundary, as
    the upstream answers its tools' errors; any other reply (a size error among them) gets
    :func:`safe_error_result`.
    """
    if isinstance(reply, ToolError) and reply.from_tool:
        return {"content": [{"type": "text", "text": reply.message}], "isError": True}
    return safe_error_result(reply, limits=limits)


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
            f"the arguments are over {limits.request_bytes} bytes (--max-request-bytes) or "
            f"{limits.json_depth} levels deep (--max-json-depth); raise them"
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
