"""``canon workers`` processes: SIGKILL mid-batch is taken over, SIGTERM settles and exits 0."""

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

import pytest
from redis.asyncio import Redis

from eventstore.store import Store
from machine.codes import ErrorCode, EvidenceStatus
from projections import ProgressWorker, ReceiptWorker, read_view
from projections.supervisor import run_workers

RUN = "run-k"
CALLS = 40
SHARDS = 2
GROUPS = ("receipts", "progress")


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    """Starts ``canon`` subprocesses; kills and reaps any still running at the end."""
    processes: list[subprocess.Popen[bytes]] = []

    def start(*args: str, throttle_ms: int = 0) -> subprocess.Popen[bytes]:
        env = {**os.environ, "CANON_WORKER_THROTTLE_MS": str(throttle_ms)}
        log = (tmp_path / f"canon-{len(processes)}.log").open("wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "canon.cli", *args],
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=env,
        )
        log.close()
        processes.append(process)
        return process

    yield start
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


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


async def test_sigterm_settles_the_batch_and_exits_zero(
    make_store: Any, redis: Redis, redis_url: str, namespace: str, spawn: Any
) -> None:
    """On SIGTERM the workers finish and acknowledge their batch, then the process exits 0."""
    store: Store = make_store(shards=SHARDS)
    await write_calls(store, 30)
    worker = spawn(
        "workers",
        f"--redis-url={redis_url}",
        f"--namespace={namespace}",
        f"--shards={SHARDS}",
        "--consumer=polite",
        "--batch=10",
        throttle_ms=15,
    )
    deadline = asyncio.get_running_loop().time() + 30
    while min([await settled(redis, store, g) for g in GROUPS]) < 5:
        assert worker.poll() is None
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    worker.send_signal(signal.SIGTERM)

    assert worker.wait(timeout=15) == 0
    for group in GROUPS:
        assert await pending(redis, store, group) == 0
        assert await settled(redis, store, group) > 0


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
