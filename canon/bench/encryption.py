"""What encrypting payloads at rest costs the client per invocation, beside plain ones.

Two stores on one server and one namespace, one without a keyring and one with (each in
its own run), drive the same tool through the boundary: a request, a raw response and an
agent result of about 1 KiB each, so each invocation seals three payloads. At 1 and 16
calls in flight, blocks of ``calls`` invocations alternate between the two, plain first in
even rounds and sealed first in odd ones (an A-B-B-A order, so a steady drift of a shared
machine adds as much to each); each block's client CPU per invocation is measured, and
the sealed block is compared with the plain block of its own round. The report gives both
medians and the spread of the pair-by-pair ratios.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from datetime import timedelta
from typing import Any, Final

from canon.bench.report import spread
from canon.bench.scale import delete_namespace
from eventstore.boundary import (
    Projection,
    RunContext,
    ToolBoundary,
    ToolCall,
    ToolEnvelope,
    ToolSpec,
)
from eventstore.keyring import KEY_BYTES, Keyring
from eventstore.store import Store
from machine.codes import EvidenceStatus

#: Calls in flight measured.
IN_FLIGHT: Final = (1, 16)
#: Characters of each payload's text (request, raw response, agent result): ~1 KiB each.
PAYLOAD_CHARS: Final = 1000
_TEXT: Final = "x" * PAYLOAD_CHARS


async def _execute(arguments: dict[str, Any], call: ToolCall) -> Any:
    return {"rows": _TEXT}


def _project(raw: Any, call: ToolCall) -> Projection:
    return Projection(
        result={"answer": _TEXT}, evidence_status=EvidenceStatus.EVIDENCE_FOUND, scope="bench"
    )


class _Lane:
    """One store's boundary writing calls of one run, numbered on."""

    def __init__(self, store: Store, run_id: str) -> None:
        self.boundary = ToolBoundary(
            store, {"search": ToolSpec(executor=_execute, projector=_project)}
        )
        self.context = RunContext(run_id)
        self.run_id = run_id
        self.calls = 0

    async def block(self, calls: int, in_flight: int) -> float:
        """Run ``calls`` invocations, ``in_flight`` at once; client CPU µs per invocation."""
        each = max(calls // in_flight, 1)

        async def worker() -> None:
            for _ in range(each):
                self.calls += 1
                envelope = ToolEnvelope(
                    run_id=self.run_id,
                    tool_call_id=f"c{self.calls}",
                    tool="search",
                    arguments={"q": _TEXT},
                )
                await self.boundary.invoke(self.context, envelope)

        started = time.process_time()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        return (time.process_time() - started) * 1e6 / (each * in_flight)


async def measure_encryption(url: str, *, repeats: int, calls: int) -> dict[str, Any]:
    """Client CPU per invocation, plain and sealed, at each of :data:`IN_FLIGHT`."""
    namespace = "enc" + secrets.token_hex(4)
    keyring = Keyring({"bench": secrets.token_bytes(KEY_BYTES)}, "bench")
    plain = Store.from_url(url, namespace=namespace, durability="off")
    sealed = Store.from_url(url, namespace=namespace, durability="off", keys=keyring)
    figures: dict[str, Any] = {}
    try:
        async with plain, sealed:
            for in_flight in IN_FLIGHT:
                lanes = {}
                for name, store in (("plain", plain), ("sealed", sealed)):
                    run_id = f"bench-{name}-{in_flight}"
                    await store.open_run(run_id, deadline=timedelta(hours=1))
                    lanes[name] = _Lane(store, run_id)
                    await lanes[name].block(calls, in_flight)  # warm-up (the run's data key)
                cpu: dict[str, list[float]] = {"plain": [], "sealed": []}
                for repeat in range(repeats):
                    order = ("plain", "sealed") if repeat % 2 == 0 else ("sealed", "plain")
                    for name in order:
                        cpu[name].append(await lanes[name].block(calls, in_flight))
                figures[str(in_flight)] = {
                    "plain_client_cpu_us": spread(cpu["plain"]),
                    "sealed_client_cpu_us": spread(cpu["sealed"]),
                    "ratio": spread(
                        [s / p for s, p in zip(cpu["sealed"], cpu["plain"], strict=True) if p]
                    ),
                }
            await delete_namespace(plain.client, namespace)
    except Exception as exc:  # the other sections still count
        return {"measured": False, "reason": f"failed: {type(exc).__name__}"}
    return {"measured": True, "payload_chars": PAYLOAD_CHARS, "in_flight": figures}
