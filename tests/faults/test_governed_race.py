"""Governed calls under racing processes, some SIGKILLed, each driving a real ToolBoundary
at random (re-entering the call, resuming it, deciding it, pausing the run): the tool of
each call runs at most once, exactly once for each approved call whose permit holder
lived, never for a denied or expired one; no receipt says not_dispatched after a permit;
nothing is dispatched again by itself after its holder died; every record keeps its
expiry."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

from eventstore import ApprovalPending, RunContext, ToolEnvelope
from eventstore.server.embedded import EmbeddedRedis
from eventstore.store import Store
from machine.codes import ErrorCode, Stage
from machine.ids import invocation_id
from projections.receipts.inspection import inspect_invocation
from tests.support.governed_racer import arguments_of, boundary_of, tool_of

RUN = "run-race"
# Few calls, many racers: they collide on the same call's permit again and again.
CALLS = [f"pay-{n:02d}" for n in range(8)]
ROUNDS = 3
RACERS = 6


def racer(url: str, namespace: str, seed: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.governed_racer",
            url,
            namespace,
            RUN,
            str(seed),
            *CALLS,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )


async def first_permit_or_exit(process: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    """Wait until the racer printed a permit line (or exited)."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = await asyncio.to_thread(process.stdout.readline)
        if not line or line.startswith(b"permit"):
            return
    raise AssertionError("the racer never got to a permit")


async def test_racing_and_killed_resumers_run_each_tool_at_most_once(
    start_server: Any, namespace: str
) -> None:
    """Three rounds of six racing processes over eight governed calls (some expiring fast),
    one of each round SIGKILLed right after it won a permit; then the records, the side
    effects and the receipts agree."""
    server: EmbeddedRedis = start_server()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        async with Store.from_url(server.url, namespace=namespace, shards=2) as store:
            await store.open_run(RUN, deadline=timedelta(minutes=10))
            # The agent's calls: each recorded waiting (one in four expires while they race).
            boundary = boundary_of(store, namespace)
            for call in CALLS:
                envelope = ToolEnvelope(
                    run_id=RUN, tool_call_id=call, tool=tool_of(call), arguments=arguments_of(call)
                )
                assert isinstance(await boundary.invoke(RunContext(RUN), envelope), ApprovalPending)
            for round_ in range(ROUNDS):
                group = [racer(server.url, namespace, round_ * 10 + k) for k in range(RACERS)]
                processes += group
                victim = random.choice(group)
                await first_permit_or_exit(victim)
                if victim.poll() is None:
                    victim.send_signal(signal.SIGKILL)
                for process in group:
                    await asyncio.to_thread(process.wait, 60)

            ran: dict[str, int] = {}
            stages: set[Stage] = set()
            for call in CALLS:
                ran[call] = int(await store.client.llen(f"{namespace}:ran:{call}"))
                record = await store.reader.get(RUN, call)
                assert record is not None
                state = record.state
                assert ran[call] <= 1, (call, ran[call])
                dispatched = state.dispatched_request_sha256 is not None
                if state.stage is Stage.READY:
                    assert ran[call] == 1 and dispatched
                if state.error_code in (ErrorCode.APPROVAL_DENIED, ErrorCode.APPROVAL_EXPIRED):
                    assert ran[call] == 0 and not dispatched
                if ran[call]:
                    assert dispatched
                if state.stage is Stage.EXECUTING:
                    # Its holder was killed after the permit: it stays there.
                    assert dispatched
                receipt = await inspect_invocation(store, RUN, invocation_id(RUN, call))
                assert (receipt.dispatch_state.value == "attempted") == dispatched, call
                for key in (store.keys.record(RUN, call), store.keys.stream(RUN, call)):
                    assert int(await store.client.pttl(key)) > 0
                stages.add(state.stage)
            assert Stage.READY in stages, "no call ever ran: the test would prove nothing"
            assert sum(ran.values()) >= 1
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=10)
            if process.stdout is not None:
                process.stdout.close()
