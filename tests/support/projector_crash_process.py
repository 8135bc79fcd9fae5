"""A harness process whose second call hangs in its projector until it is killed.

Run as ``python -m tests.support.projector_crash_process URL NAMESPACE RUN_ID``. Its
first call (``warm``) runs to READY, so the store has seen the server run its scripts;
the second (``crash``) reaches its projector, which prints ``projecting`` and blocks the
process (a plain function run in the event loop, as a CPU-bound projector would) until
a line comes on standard input, which the test never sends: it kills the process.
"""

from __future__ import annotations

import asyncio
import sys

from canon.logging_setup import configure_logging
from eventstore import Projection, RunContext, Store, ToolBoundary, ToolCall, ToolEnvelope, ToolSpec

#: The tool, and the raw response its executor returns.
TOOL = "search"
RAW = {"rows": [1, 2, 3], "note": "kept"}


async def executor(arguments: dict[str, object], call: ToolCall) -> object:
    """Always the same raw response."""
    return RAW


def projector(raw: object, call: ToolCall) -> Projection:
    """For the second call, announce it and block the whole process."""
    if call.tool_call_id == "crash":
        print("projecting", flush=True)
        sys.stdin.readline()
    return Projection(result={"n": 3}, evidence_status="EVIDENCE_FOUND", scope="kb")


async def run(url: str, namespace: str, run_id: str) -> None:
    """Make the two calls."""
    async with Store.from_url(url, namespace=namespace) as store:
        boundary = ToolBoundary(store, {TOOL: ToolSpec(executor=executor, projector=projector)})
        for call in ("warm", "crash"):
            envelope = ToolEnvelope(run_id=run_id, tool_call_id=call, tool=TOOL, arguments={})
            await boundary.invoke(RunContext(run_id), envelope)


def main(argv: list[str]) -> int:
    """Entry point; see the module docstring for the arguments."""
    url, namespace, run_id = argv
    configure_logging(json=True, level="WARNING")  # stdout carries only the protocol
    asyncio.run(run(url, namespace, run_id))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
