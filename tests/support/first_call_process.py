"""A harness process that makes one tool call and holds it in its executor until told to go.

Run as ``python -m tests.support.first_call_process URL NAMESPACE RUN_ID TOOL_CALL_ID``.
It prints ``executing`` once the executor runs (the record is PROJECTING), waits for one
line on standard input, lets the executor return, and prints the reply
(``reply_to_builtins``) and the executor's call count as one JSON object.
"""

from __future__ import annotations

import asyncio
import sys

import msgspec

from canon.logging_setup import configure_logging
from eventstore import (
    Projection,
    RunContext,
    Store,
    ToolBoundary,
    ToolCall,
    ToolEnvelope,
    ToolSpec,
    reply_to_builtins,
)

#: The tool, the arguments and the result the replay tests expect of this process.
TOOL = "search"
ARGUMENTS = {"q": "refund"}
RESULT = {"titles": ["Refund policy"], "score": 0.5}

executed = 0


async def executor(arguments: dict[str, object], call: ToolCall) -> object:
    """Announce the call, then wait for the go line."""
    global executed
    executed += 1
    print("executing", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    return {"rows": 1}


def projector(raw: object, call: ToolCall) -> Projection:
    """Always the same evidence."""
    return Projection(result=RESULT, evidence_status="EVIDENCE_FOUND", scope="kb")


async def run(url: str, namespace: str, run_id: str, tool_call_id: str) -> None:
    """Make the one call and print its reply."""
    async with Store.from_url(url, namespace=namespace) as store:
        boundary = ToolBoundary(store, {TOOL: ToolSpec(executor=executor, projector=projector)})
        reply = await boundary.invoke(
            RunContext(run_id),
            ToolEnvelope(run_id=run_id, tool_call_id=tool_call_id, tool=TOOL, arguments=ARGUMENTS),
        )
    print(msgspec.json.encode({"reply": reply_to_builtins(reply), "executed": executed}).decode())


def main(argv: list[str]) -> int:
    """Entry point; see the module docstring for the arguments."""
    url, namespace, run_id, tool_call_id = argv
    configure_logging(json=True, level="WARNING")  # stdout carries only the protocol
    asyncio.run(run(url, namespace, run_id, tool_call_id))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
