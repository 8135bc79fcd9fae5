"""One racer process of the governed-call fault test: decides, pauses and resumes at random.

    python -m tests.support.governed_racer URL NAMESPACE RUN SEED CALL...

Every racer goes through the calls in the same order, so they all press on the same call
at once. On each look at a call it may decide it (approve four times in five), pause or
unpause the run, or resume it: take its dispatch permit and, holding it, run the "tool"
(RPUSH of its own pid on ``<namespace>:ran:<call>``, the side effect the test counts) and
finish the call. It moves to the next call once the current one is dispatched or ended.
Each permit it wins is printed (``permit <call>``) before the tool runs, so a test can
kill it between the permit and the side effect, or after.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys

from eventstore.approvals import decide, pause_run, take_permit, unpause_run
from eventstore.store import Store
from machine.codes import EvidenceStatus, Stage

#: Most looks at one call (a paused run may keep a call waiting).
LOOKS = 300
_SETTLED = (Stage.EXECUTING, Stage.PROJECTING, Stage.READY, Stage.ERROR)


async def race(url: str, namespace: str, run: str, seed: int, calls: list[str]) -> None:
    """Race the other processes over ``calls`` of ``run``, in order."""
    chance = random.Random(seed)
    async with Store.from_url(url, namespace=namespace, shards=2) as store:
        print("started", flush=True)
        for call in calls:
            for _ in range(LOOKS):
                record = await store.reader.get(run, call)
                if record is None or record.state.stage in _SETTLED:
                    break
                action = chance.random()
                if record.state.stage is Stage.AWAITING_APPROVAL and action < 0.3:
                    approve = chance.random() < 0.8
                    await decide(store, run, call, approve=approve, by=f"p{seed}", reason="r")
                elif action < 0.33:
                    await pause_run(store, run, by=f"p{seed}", reason="race")
                elif action < 0.45:
                    await unpause_run(store, run, by=f"p{seed}", reason="race")
                elif record.state.stage is Stage.APPROVED:
                    permit = await take_permit(store, record.state, record.expires_at_ms)
                    if permit.head is None:
                        continue
                    print(f"permit {call}", flush=True)
                    ran = f"{namespace}:ran:{call}"
                    await store.client.rpush(ran, os.getpid())
                    await store.client.expire(ran, 600)
                    await asyncio.sleep(chance.uniform(0, 0.02))
                    head = await store.writer.start_projecting(permit.head, b'{"done":true}')
                    await store.writer.complete(
                        head, b'{"ok":1}', EvidenceStatus.EVIDENCE_FOUND, "t"
                    )


if __name__ == "__main__":
    url, namespace, run, seed, *calls = sys.argv[1:]
    asyncio.run(race(url, namespace, run, int(seed), calls))
