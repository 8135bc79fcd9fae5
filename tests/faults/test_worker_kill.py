"""Worker processes SIGKILLed at random points, 20 times, while events keep flowing: a final
burst worker takes over what they left, and the projections converge — every receipt at its
record's version, every progress view equal to its records, nothing pending, nothing
counted twice."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from eventstore import Projection, RunContext, Store, ToolBoundary, ToolCall, ToolEnvelope
from eventstore.boundary.contracts import ToolSpec
from eventstore.server.embedded import EmbeddedRedis
from projections import ProgressWorker, ReceiptWorker
from projections.worker.supervisor import run_workers
from tests.faults.convergence import assert_projections_match, assert_settled_once

ITERATIONS = 20
SHARDS = 4
RUNS = [f"run-{n}" for n in range(8)]
TOOL = "probe"
#: Entries idle this long in a dead consumer are taken over.
MIN_IDLE_MS = 200
#: Log fragments no worker process may ever write.
FORBIDDEN_IN_LOGS = ("Traceback", "cr1:", ":{s", "PAYLOAD-MARKER")


async def executor(arguments: dict[str, Any], call: ToolCall) -> Any:
    """One call in six fails; the rest answer with a marker payload."""
    if random.random() < 1 / 6:
        raise RuntimeError("failed")
    return {"raw": "PAYLOAD-MARKER-raw", "n": arguments["n"]}


def projector(raw: Any, call: ToolCall) -> Projection:
    """Evidence found or not, at random."""
    evidence = random.choice(["EVIDENCE_FOUND", "NO_EVIDENCE"])
    return Projection(result={"n": raw["n"]}, evidence_status=evidence, scope="probe")


async def keep_calling(boundary: ToolBoundary, stopping: asyncio.Event) -> int:
    """Invoke small concurrent batches until stopped; return how many calls were made."""
    made = 0
    while not stopping.is_set():
        batch = []
        for _ in range(4):
            run_id = RUNS[made % len(RUNS)]
            envelope = ToolEnvelope(
                run_id=run_id, tool_call_id=f"c{made}", tool=TOOL, arguments={"n": made}
            )
            batch.append(boundary.invoke(RunContext(run_id), envelope))
            made += 1
        await asyncio.gather(*batch)
        await asyncio.sleep(0.1)
    return made


async def pending_entries(store: Store) -> int:
    """Entries delivered to some consumer and not yet acknowledged, in every group."""
    total = 0
    for shard in range(SHARDS):
        for group in await store.client.xinfo_groups(store.keys.feed(shard)):
            total += int(group["pending"])
    return total


async def wait_for_start(log_path: Path, process: Any, timeout_s: float = 20.0) -> None:
    """Wait until a worker process has logged that its workers started."""
    deadline = time.monotonic() + timeout_s
    while b"worker_started" not in await asyncio.to_thread(log_path.read_bytes):
        assert process.poll() is None, "the worker process exited before it was killed"
        assert time.monotonic() < deadline, "the worker process did not start"
        await asyncio.sleep(0.02)


async def test_killed_workers_converge(
    start_server: Any, spawn_workers: Any, namespace: str
) -> None:
    """20 worker processes killed with SIGKILL at random moments, events flowing throughout;
    after a final burst everything is settled exactly once and matches the records."""
    server: EmbeddedRedis = start_server()
    async with Store.from_url(server.url, namespace=namespace, shards=SHARDS) as store:
        for run_id in RUNS:
            await store.open_run(run_id, deadline=timedelta(minutes=10))
        boundary = ToolBoundary(store, {TOOL: ToolSpec(executor=executor, projector=projector)})
        stopping = asyncio.Event()
        load = asyncio.create_task(keep_calling(boundary, stopping))
        logs = []
        kills_mid_batch = 0
        for iteration in range(ITERATIONS):
            process, log_path = spawn_workers(
                f"--redis-url={server.url}",
                f"--namespace={namespace}",
                f"--shards={SHARDS}",
                f"--consumer=w{iteration % 3}",
                "--batch=8",
                "--block-ms=50",
                f"--min-idle-ms={MIN_IDLE_MS}",
                "--max-deliveries=1000",
                throttle_ms=5,
            )
            logs.append(log_path)
            await wait_for_start(log_path, process)
            await asyncio.sleep(random.uniform(0.0, 0.4))
            process.send_signal(signal.SIGKILL)
            assert await asyncio.to_thread(process.wait, 10) == -signal.SIGKILL
            kills_mid_batch += await pending_entries(store) > 0
        stopping.set()
        calls = await load

        assert calls > 200
        assert kills_mid_batch > 0, "no kill ever left work behind"

        await asyncio.sleep(MIN_IDLE_MS / 1000 + 0.1)
        final = [
            ReceiptWorker(store, consumer="final", min_idle_ms=MIN_IDLE_MS, max_deliveries=1000),
            ProgressWorker(store, consumer="final", min_idle_ms=MIN_IDLE_MS, max_deliveries=1000),
        ]
        await run_workers(final, burst=True, handle_signals=False)

        await assert_settled_once(store)
        live = await assert_projections_match(store)
        assert len(live) == calls
    for log_path in logs:
        text = await asyncio.to_thread(log_path.read_text)
        assert not [marker for marker in FORBIDDEN_IN_LOGS if marker in text], text
