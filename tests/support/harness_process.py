"""A second harness process for the cross-process budget tests.

Run as ``python -m tests.support.harness_process URL NAMESPACE RUN_ID TOOL PREFIX COUNT``.
It opens its own store, prints ``ready``, waits for one line on standard input (the start
signal), fires COUNT concurrent calls with ids ``PREFIX-0`` ... and prints one JSON object
mapping each outcome (``READY`` or an error code) to its count.
"""

from __future__ import annotations

import asyncio
import collections
import sys

import msgspec

from canon.logging_setup import configure_logging
from eventstore import Projection, RunContext, Store, ToolBoundary, ToolCall, ToolEnvelope, ToolSpec
from eventstore.boundary.contracts import ToolResult


async def executor(arguments: dict[str, object], call: ToolCall) -> object:
    """Yield once so calls interleave, then answer."""
    await asyncio.sleep(0.001)
    return {"pid": "child"}


def projector(raw: object, call: ToolCall) -> Projection:
    """Always evidence."""
    return Projection(result="ok", evidence_status="EVIDENCE_FOUND", scope="child")


async def run(url: str, namespace: str, run_id: str, tool: str, prefix: str, count: int) -> None:
    """Serve one start signal, then ``count`` concurrent calls."""
    async with Store.from_url(url, namespace=namespace) as store:
        boundary = ToolBoundary(store, {tool: ToolSpec(executor=executor, projector=projector)})
        ctx = RunContext(run_id)
        await store.run_info(run_id)  # connect before the start signal
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        replies = await asyncio.gather(
            *(
                boundary.invoke(
                    ctx,
                    ToolEnvelope(
                        run_id=run_id, tool_call_id=f"{prefix}-{i}", tool=tool, arguments={"i": i}
                    ),
                )
                for i in range(count)
            )
        )
    counts = collections.Counter(
        "READY" if isinstance(reply, ToolResult) else reply.error_code.value for reply in replies
    )
    print(msgspec.json.encode(dict(counts)).decode(), flush=True)


def main(argv: list[str]) -> int:
    """Entry point; see the module docstring for the arguments."""
    url, namespace, run_id, tool, prefix, count = argv
    configure_logging(json=True, level="WARNING")  # stdout carries only the protocol
    asyncio.run(run(url, namespace, run_id, tool, prefix, int(count)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
