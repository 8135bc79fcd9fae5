"""``canon workers`` processes: SIGKILL mid-batch is taken over, SIGTERM and SIGINT settle
the batch and exit 0, ``--metrics-port`` serves the workers' metrics, and nothing a worker
process prints holds a forbidden log fragment or a trace."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from eventstore.store import Store
from machine.codes import ErrorCode, EvidenceStatus
from projections import ProgressWorker, ReceiptWorker, read_view
from projections.worker.supervisor import run_workers
from tests.support.log_scan import LOG_FORBIDDEN
from tests.support.ports import free_port

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-k"
CALLS = 40
SHARDS = 2
GROUPS = ("receipts", "progress")


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    """Starts ``canon`` subprocesses, their stdout and stderr in one file each; at the end
    kills and reaps any still running, then fails the test if any output holds a fragment
    of the session log scan's LOG_FORBIDDEN or a trace (subprocess logs are outside it)."""
    processes: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(*args: str, throttle_ms: int = 0) -> subprocess.Popen[bytes]:
        env = {**os.environ, "CANON_WORKER_THROTTLE_MS": str(throttle_ms)}
        output = tmp_path / f"canon-{len(processes)}.log"
        with output.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "canon.cli", *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        processes.append((process, output))
        return process

    yield start
    for process, _ in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
    for _, output in processes:
        text = output.read_text(errors="replace")
        leaked = [fragment for fragment in (*LOG_FORBIDDEN, "Traceback") if fragment in text]
        assert not leaked, f"{output.name} holds {leaked}: {text[-2000:]}"


async def settled(redis: Redis, store: Store, group: str) -> int:
    """Feed entries the group's scripts have settled (each counted once, when acked)."""
    total = 0
    for shard in range(store.keys.shards):
        position = await redis.hgetall(store.keys.position(shard, group))
        total += sum(int(position.get(name, 0)) for name in (b"applied", b"stale", b"expired"))
    return total


async def pending(redis: Redis, store: Store, group: str) -> int:
    return sum(
        [(await redis.xpending(store.keys.feed(s), group))["pending"] for s in range(SHARDS)]
    )


async def test_killed_worker_is_taken_over_and_every_event_is_reflected_once(
    make_store: Any, redis: Redis, redis_url: str, namespace: str, spawn: Any
) -> None:
    """After SIGKILL mid-batch, a second worker settles the rest: each event once, none pending."""
    store: Store = make_store(shards=SHARDS)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    for i in range(CALLS):
        head = await store.writer.create(RUN, f"c{i:02d}", "search", b'{"q":1}')
        head = await store.writer.start_projecting(head, b'{"raw":1}')
        await store.writer.complete(head, b'{"a":1}', EvidenceStatus.EVIDENCE_FOUND, "s")
    entries = CALLS * 3

    doomed = spawn(
        "workers",
        f"--redis-url={redis_url}",
        f"--namespace={namespace}",
        f"--shards={SHARDS}",
        "--consumer=doomed",
        "--batch=10",
        "--block-ms=100",
        throttle_ms=15,
    )
    deadline = asyncio.get_running_loop().time() + 30
    while min([await settled(redis, store, g) for g in GROUPS]) < 10:
        assert doomed.poll() is None, "the worker exited before it was killed"
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    doomed.send_signal(signal.SIGKILL)
    assert doomed.wait(timeout=10) == -signal.SIGKILL

    stuck = {g: await pending(redis, store, g) for g in GROUPS}
    assert sum(stuck.values()) > 0
    assert all([await settled(redis, store, g) < entries for g in GROUPS])

    await asyncio.sleep(0.15)
    rescuers = [
        ReceiptWorker(store, consumer="rescuer", min_idle_ms=100),
        ProgressWorker(store, consumer="rescuer", min_idle_ms=100),
    ]
    await run_workers(rescuers, burst=True, handle_signals=False)

    assert sum(w.counters["reclaimed"] for w in rescuers) == sum(stuck.values())
    for group in GROUPS:
        assert await settled(redis, store, group) == entries
        assert await pending(redis, store, group) == 0
    receipts = [k async for k in redis.scan_iter(match=store.keys.scan_pattern("receipt"))]
    assert len(receipts) == CALLS
    assert {int(await redis.hget(k, "version")) for k in receipts} == {3}
    view = await read_view(store, RUN)
    assert view is not None
    assert (view.invocations, view.by_status, view.by_evidence) == (
        CALLS,
        {"READY": CALLS},
        {"EVIDENCE_FOUND": CALLS},
    )
    assert [fact["tool_call_id"] for fact in view.facts] == [f"c{i:02d}" for i in range(CALLS)]


async def write_calls(store: Store, count: int) -> None:
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    for i in range(count):
        head = await store.writer.create(RUN, f"c{i:02d}", "search", b'{"q":1}')
        await store.writer.fail(head, ErrorCode.EXECUTION_FAILED)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_stop_signal_settles_the_batch_and_exits_zero(
    make_store: Any,
    redis: Redis,
    redis_url: str,
    namespace: str,
    spawn: Any,
    signum: signal.Signals,
) -> None:
    """On SIGTERM or SIGINT (Ctrl-C) mid-load the workers finish and acknowledge their batch,
    then the process exits 0 without a trace."""
    store: Store = make_store(shards=SHARDS)
    await write_calls(store, 30)
    worker = spawn(
        "workers",
        f"--redis-url={redis_url}",
        f"--namespace={namespace}",
        f"--shards={SHARDS}",
        "--consumer=polite",
        "--batch=10",
        # 60 entries a group at 40 ms each: a group is still mid-load seconds after the
        # signal is sent, even when a busy machine starts the other group's worker late.
        throttle_ms=40,
    )
    deadline = asyncio.get_running_loop().time() + 30
    while min([await settled(redis, store, g) for g in GROUPS]) < 5:
        assert worker.poll() is None
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    worker.send_signal(signum)

    assert await asyncio.to_thread(worker.wait, 15) == 0
    for group in GROUPS:
        assert await pending(redis, store, group) == 0
        # Stopped mid-load: some entries settled, the rest left for the next worker.
        assert 0 < await settled(redis, store, group) < 60


async def test_burst_drains_everything_and_exits_zero(
    make_store: Any, redis: Redis, redis_url: str, namespace: str, spawn: Any
) -> None:
    """``canon workers --burst`` settles every available entry in both groups, then exits 0."""
    store: Store = make_store(shards=SHARDS)
    await write_calls(store, 5)
    worker = spawn(
        "workers",
        f"--redis-url={redis_url}",
        f"--namespace={namespace}",
        f"--shards={SHARDS}",
        "--burst",
    )
    assert await asyncio.to_thread(worker.wait, 30) == 0
    for group in GROUPS:
        assert await settled(redis, store, group) == 10
    view = await read_view(store, RUN)
    assert view is not None and view.by_status == {"ERROR": 5}


def samples(text: str, name: str) -> dict[tuple[str, ...], float]:
    """The values of the samples called ``name``, keyed by their sorted label values."""
    return {
        tuple(value for _, value in sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


async def test_metrics_port_serves_projected_lag_and_dead_letters(
    make_store: Any, redis: Redis, redis_url: str, namespace: str, spawn: Any
) -> None:
    """``canon workers --metrics-port`` serves Prometheus text: every entry counted once as
    projected, one poison entry as a dead letter per projection, and per-shard lag and
    pending gauges that fall to zero once the workers have caught up."""
    store: Store = make_store(shards=SHARDS)
    await write_calls(store, 5)
    await redis.xadd(store.keys.feed(0), {"junk": "1"})
    port = free_port()
    worker = spawn(
        "workers",
        f"--redis-url={redis_url}",
        f"--namespace={namespace}",
        f"--shards={SHARDS}",
        f"--metrics-port={port}",
        "--block-ms=100",
        "--min-idle-ms=100",
        "--max-deliveries=1",
    )
    every_shard = {(g, str(s)) for g in GROUPS for s in range(SHARDS)}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    text = ""
    async with httpx.AsyncClient() as client:
        while True:
            assert worker.poll() is None, "canon workers exited"
            assert loop.time() < deadline, f"metrics never settled: {text}"
            try:
                text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
            except httpx.TransportError:
                text = ""
            projected: dict[str, float] = {}
            for (_outcome, group), value in samples(text, "canon_events_projected_total").items():
                projected[group] = projected.get(group, 0) + value
            lag = samples(text, "canon_projection_lag_entries")
            waiting = samples(text, "canon_projection_pending_entries")
            # Lag is reported every few seconds, so it may trail the counters.
            if (
                projected == dict.fromkeys(GROUPS, 10)
                and set(lag) == set(waiting) == every_shard
                and set(lag.values()) == set(waiting.values()) == {0}
                and samples(text, "canon_dead_letters_total") == {(g,): 1 for g in GROUPS}
            ):
                break
            await asyncio.sleep(0.1)
    assert samples(text, "canon_projection_failures_total") == {(g,): 1 for g in GROUPS}
    assert set(samples(text, "canon_projection_oldest_unacked_seconds").values()) == {0}
    worker.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(worker.wait, 15) == 0
