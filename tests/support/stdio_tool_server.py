"""A tool server speaking JSON lines on stdio, as an MCP stdio server does.

``python -m tests.support.stdio_tool_server URL NAMESPACE`` opens a store and a run, then
answers each request line read from standard input, ``{"id": n, "tool_call_id": ...,
"arguments": {...}}``, with one response line ``{"id": n, "status": ..., "result": ...}``
on standard output, until standard input ends. It configures no logging: whatever canon
logs must not reach standard output, which belongs to the protocol.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta
from typing import Any

import msgspec

from eventstore import Projection, RunContext, Store, ToolBoundary, ToolEnvelope, ToolSpec
from eventstore.boundary.contracts import ToolResult


def lookup(arguments: Any, call: Any) -> dict[str, Any]:
    """The executor: a raw response."""
    return {"answer": arguments.get("q", ""), "internal": "raw only"}


def project(raw: Any, call: Any) -> Projection:
    """The projector: the bounded result."""
    return Projection(result=raw["answer"], evidence_status="EVIDENCE_FOUND", scope="stdio")


async def serve(url: str, namespace: str) -> None:
    """Answer request lines until standard input ends."""
    async with Store.from_url(url, namespace=namespace) as store:
        await store.open_run("run-stdio", deadline=timedelta(minutes=1))
        boundary = ToolBoundary(store, {"lookup": ToolSpec(executor=lookup, projector=project)})
        ctx = RunContext("run-stdio")
        while line := await asyncio.to_thread(sys.stdin.readline):
            request = msgspec.json.decode(line)
            envelope = ToolEnvelope(
                run_id="run-stdio",
                tool_call_id=request["tool_call_id"],
                tool="lookup",
                arguments=request["arguments"],
            )
            reply = await boundary.invoke(ctx, envelope)
            response = {
                "id": request["id"],
                "status": "READY" if isinstance(reply, ToolResult) else "ERROR",
                "result": reply.result if isinstance(reply, ToolResult) else None,
            }
            sys.stdout.write(msgspec.json.encode(response).decode() + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], sys.argv[2]))
