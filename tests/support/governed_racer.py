"""One racer process of the governed-call fault test: calls, decides, pauses and resumes at
random, through a real ToolBoundary.

    python -m tests.support.governed_racer URL NAMESPACE RUN SEED CALL...

Every racer goes through the calls in the same order, so they all press on the same call
at once. On each look at a call it may call the tool (the first call records it waiting
for approval; a later one is its framework re-entering it with the same id and request),
decide it (approve four times in five), pause or unpause the run, or resume it. The tool
(``refund``; ``refund_fast`` for a call whose number is a multiple of four, whose approval
expires in 300 ms) prints ``permit <call>`` when it starts, so a test can kill the racer
between the permit and the side effect, or after; the side effect is an RPUSH of the
racer's pid on ``<namespace>:ran:<call>``, which the test counts. A racer moves to the next
call once the current one is dispatched or ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
from datetime import timedelta
from typing import Any

from eventstore import RunContext, Store, ToolBoundary, ToolEnvelope, ToolSpec
from eventstore.boundary.contracts import Projection, ToolCall
from eventstore.decisions import NotAwaitingApproval
from machine.codes import EvidenceStatus, Stage

#: Most looks at one call (a paused run may keep a call waiting).
LOOKS = 300
_SETTLED = (Stage.EXECUTING, Stage.PROJECTING, Stage.READY, Stage.ERROR)


def tool_of(call: str) -> str:
    """The tool a call names: one in four expires fast."""
    return "refund_fast" if int(call.rsplit("-", 1)[1]) % 4 == 0 else "refund"


def arguments_of(call: str) -> dict[str, Any]:
    """The request of ``call``: the same in every racer, so a second call is a re-entry."""
    return {"amount": int(call.rsplit("-", 1)[1])}


def boundary_of(store: Store, namespace: str) -> ToolBoundary:
    async def refund(arguments: dict[str, Any], call: ToolCall) -> Any:
        print(f"permit {call.tool_call_id}", flush=True)
        ran = f"{namespace}:ran:{call.tool_call_id}"
        await store.client.rpush(ran, os.getpid())
        await store.client.expire(ran, 600)
        await asyncio.sleep(random.uniform(0, 0.02))
        return {"refunded": arguments["amount"]}

    def project(raw: Any, call: ToolCall) -> Projection:
        return Projection(result=raw, evidence_status=EvidenceStatus.EVIDENCE_FOUND, scope="t")

    def spec(waits: timedelta) -> ToolSpec:
        return ToolSpec(
            executor=refund,
            projector=project,
            read_only=False,
            approval=True,
            approval_timeout=waits,
        )

    tools = {
        "refund": spec(timedelta(minutes=10)),
        "refund_fast": spec(timedelta(milliseconds=300)),
    }
    return ToolBoundary(store, tools, replay_wait_s=0.05)


async def race(url: str, namespace: str, run: str, seed: int, calls: list[str]) -> None:
    """Race the other processes over ``calls`` of ``run``, in order."""
    chance = random.Random(seed)
    async with Store.from_url(url, namespace=namespace, shards=2) as store:
        boundary = boundary_of(store, namespace)
        ctx = RunContext(run)
        print("started", flush=True)
        for call in calls:
            envelope = ToolEnvelope(
                run_id=run, tool_call_id=call, tool=tool_of(call), arguments=arguments_of(call)
            )
            for _ in range(LOOKS):
                record = await store.reader.get(run, call)
                if record is not None and record.state.stage in _SETTLED:
                    break
                action = chance.random()
                if record is None or action < 0.15:
                    await boundary.invoke(ctx, envelope)
                elif record.state.stage is Stage.AWAITING_APPROVAL and action < 0.4:
                    approve = chance.random() < 0.8
                    with contextlib.suppress(NotAwaitingApproval):  # decided meanwhile
                        await store.decide(run, call, approve=approve, by=f"p{seed}", reason="r")
                elif action < 0.43:
                    await store.pause_run(run, by=f"p{seed}", reason="race")
                elif action < 0.55:
                    await store.unpause_run(run, by=f"p{seed}", reason="race")
                else:
                    await boundary.resume(ctx, call)


if __name__ == "__main__":
    url, namespace, run, seed, *calls = sys.argv[1:]
    asyncio.run(race(url, namespace, run, int(seed), calls))
