"""Projection lag: from a commit to its receipt, with writers at half their maximum.

A ``ReceiptWorker`` runs in a child process (as ``canon workers`` would), reading the
namespace's feeds. Paced writers commit invocations at half the writer's measured
maximum. Lag is the receipt's ``updated_at_ms`` (set by the worker when it materialized
the final version) minus the time in the Completed event's feed entry id; both clocks
are this host's, at millisecond resolution.

The child is this module: ``python -m canon.bench.lag URL NAMESPACE SHARDS`` prints
``ready`` once its consumer groups exist and consumes until SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from canon.bench.timing import percentile
from canon.bench.workload import TOOL, Payloads, tool_call_id_for
from canon.logging_setup import configure_logging
from canon.service import freeze_startup_heap
from eventstore.store import Store
from eventstore.writer import Head, now_ms
from machine.codes import EvidenceStatus
from machine.ids import invocation_id

#: Writers (asyncio tasks, one run each) that :func:`write_paced` paces.
WRITERS = 16
#: Shortest wait for the receipts after the writers stop (four times the write time if longer).
_CATCH_UP_S = 5.0


@dataclass(frozen=True, slots=True)
class LagResult:
    """Commit-to-receipt lag of the invocations written at ``rate_per_s``.

    Attributes:
        rate_per_s: the write rate achieved (invocations per second).
        invocations: how many were written.
        p50_ms: median lag; p99_ms: 99th percentile; max_ms: the largest.
        drained_per_s: receipts materialized per second, first commit to last receipt.
        pending: receipts still missing when the wait ended; each counts with the time
            waited, so the lag figures are then lower bounds.

    """

    rate_per_s: float
    invocations: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    drained_per_s: float
    pending: int

    def to_json(self) -> dict[str, Any]:
        """Plain data for the JSON report."""
        return {
            "measured": True,
            "rate_per_s": round(self.rate_per_s, 1),
            "invocations": self.invocations,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "max_ms": self.max_ms,
            "drained_per_s": round(self.drained_per_s, 1),
            "pending": self.pending,
            "lower_bound": self.pending > 0,
        }


async def _start_worker(url: str, namespace: str, shards: int) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "canon.bench.lag",
        url,
        namespace,
        str(shards),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), timeout=30)
    if line.strip() != b"ready":
        raise RuntimeError("the receipt worker did not start")
    return process


async def _stop_worker(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), timeout=10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


async def write_paced(
    store: Store, rate_per_s: float, duration_s: float, payloads: Payloads | None = None
) -> list[Head]:
    """Write invocations for ``duration_s`` at ``rate_per_s`` from :data:`WRITERS` tasks.

    Each task writes its own run's calls through the Writer (create, ProjectingStarted,
    Completed; ``payloads``, else the benchmark's), evenly spaced; returns every
    Completed head.
    """
    payloads, writer = payloads or Payloads.of(), store.writer
    heads: list[Head] = []
    interval = WRITERS / rate_per_s
    started = time.perf_counter()

    async def task(index: int) -> None:
        run_id = f"lag{index:09d}"
        await store.open_run(run_id, deadline=timedelta(hours=1), tools={TOOL: None})
        number = 0
        while (due := started + index * interval / WRITERS + number * interval) < (
            started + duration_s
        ):
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            head = await writer.create(run_id, tool_call_id_for(number), TOOL, payloads.request)
            head = await writer.start_projecting(head, payloads.raw)
            heads.append(
                await writer.complete(head, payloads.result, EvidenceStatus.EVIDENCE_FOUND, "lag")
            )
            number += 1

    await asyncio.gather(*(task(index) for index in range(WRITERS)))
    return heads


async def _receipt_times(store: Store, heads: list[Head]) -> list[int | None]:
    async with store.client.pipeline(transaction=False) as pipe:
        for head in heads:
            key = store.keys.receipt(head.run_id, invocation_id(head.run_id, head.tool_call_id))
            pipe.hmget(key, "version", "updated_at_ms")
        replies = await pipe.execute()
    return [
        int(updated) if version is not None and int(version) >= 3 else None
        for version, updated in replies
    ]


async def measure_lag(url: str, namespace: str, rate_per_s: float, duration_s: float) -> LagResult:
    """Run the worker and paced writers on a fresh ``namespace``; return the lag figures.

    Receipts still missing when the catch-up time is over count with the time waited so
    far: their lag is at least that, so the figures are then lower bounds.
    """
    store = Store.from_url(url, namespace=namespace, ttl=timedelta(hours=1))
    async with store:
        process = await _start_worker(url, namespace, store.keys.shards)
        try:
            heads = await write_paced(store, rate_per_s, duration_s)
            deadline = time.monotonic() + max(_CATCH_UP_S, 4 * duration_s)
            while None in (times := await _receipt_times(store, heads)):
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
            ended_ms = now_ms()
        finally:
            await _stop_worker(process)
    committed = [int(head.entry_id.split("-")[0]) for head in heads]
    materialized = [ended_ms if updated is None else updated for updated in times]
    lags = [float(done - commit) for commit, done in zip(committed, materialized, strict=True)]
    # A worker slower than the writers shows as a drain rate below the write rate.
    span_s = max((max(materialized, default=0) - min(committed, default=0)) / 1000, 1e-3)
    return LagResult(
        rate_per_s=len(heads) / duration_s,
        invocations=len(heads),
        p50_ms=percentile(lags, 0.50),
        p99_ms=percentile(lags, 0.99),
        max_ms=max(lags, default=0.0),
        drained_per_s=(len(heads) - times.count(None)) / span_s,
        pending=times.count(None),
    )


async def _consume(url: str, namespace: str, shards: int) -> None:
    from projections import ReceiptWorker  # the projections package is optional here

    store = Store.from_url(url, namespace=namespace, shards=shards)
    async with store:
        worker = ReceiptWorker(store, consumer="bench-lag")
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, worker.stop)
        await worker.ensure_groups()
        print("ready", flush=True)
        await worker.run()


def main(argv: Sequence[str]) -> int:
    """Run the lag benchmark's worker: ``argv`` is URL, namespace, shard count."""
    url, namespace, shards = argv
    configure_logging(json=True, level="INFO")
    freeze_startup_heap()  # as canon workers does
    asyncio.run(_consume(url, namespace, int(shards)))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
