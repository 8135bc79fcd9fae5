"""``canon serve``, with its workers or beside a ``canon workers`` process: receipts and
progress visible over HTTP once projected (how soon is the projection-lag benchmark's
figure); SIGTERM exits 0; no process prints a forbidden
log fragment or a trace."""

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
import msgspec
import pytest
from redis.asyncio import Redis

from eventstore.store import Store
from machine.codes import EvidenceStatus
from machine.ids import invocation_id
from projections import read_view
from tests.support.log_scan import LOG_FORBIDDEN
from tests.support.ports import free_port

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-s"


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    """Starts ``canon <command>`` processes, stdout and stderr in one file each (returns the
    process and that file); at the end kills and reaps any still running, then fails the
    test if any output holds a fragment of the session log scan's LOG_FORBIDDEN or a trace
    (subprocess logs are outside that scan)."""
    processes: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(command: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
        output = tmp_path / f"{command}-{len(processes)}.log"
        with output.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "canon.cli", command, *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(os.environ),
            )
        processes.append((process, output))
        return process, output

    yield start
    for process, _ in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
    for _, output in processes:
        text = output.read_text(errors="replace")
        leaked = [fragment for fragment in (*LOG_FORBIDDEN, "Traceback") if fragment in text]
        assert not leaked, f"{output.name} holds {leaked}: {text[-2000:]}"


async def until(check: Any, timeout_s: float) -> float:
    """Poll ``check()`` until it is truthy; return the seconds it took."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not await check():
        assert loop.time() - started < timeout_s, "timed out"
        await asyncio.sleep(0.01)
    return loop.time() - started


async def test_served_receipts_and_progress_follow_a_run(
    make_store: Any, redis: Redis, redis_url: str, namespace: str, spawn: Any
) -> None:
    """With serve and workers running, a call's receipt and progress appear as it completes.

    (How soon is measured by the projection-lag benchmark, not asserted here.)"""
    store: Store = make_store(shards=4)
    token = (await store.open_run(RUN, deadline=timedelta(minutes=5))).access_token
    port, metrics_port = free_port(), free_port()
    process, _ = spawn(
        "serve",
        f"--redis-url={redis_url}",
        f"--namespace={namespace}",
        "--shards=4",
        f"--port={port}",
        f"--metrics-port={metrics_port}",
        "--with-workers",
    )
    auth = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:

        async def answering() -> bool:
            assert process.poll() is None, "canon serve exited"
            try:
                await client.get("/v1/invocations/inspection-capabilities", headers=auth)
            except httpx.TransportError:
                return False
            return True

        await until(answering, 30)
        head = await store.writer.create(RUN, "c1", "search", b'{"q":1}')
        head = await store.writer.start_projecting(head, b'{"raw":1}')
        head = await store.writer.complete(head, b'{"n":7}', EvidenceStatus.NO_EVIDENCE, "s")
        receipt_key = store.keys.receipt(RUN, invocation_id(RUN, "c1"))

        async def projected() -> bool:
            view = await read_view(store, RUN)
            materialized = await redis.hget(receipt_key, "version")
            return materialized == b"3" and view is not None and view.by_status == {"READY": 1}

        await until(projected, 30)
        response = await client.get(
            f"/v1/invocations/{invocation_id(RUN, 'c1')}/receipt", headers=auth
        )
        assert response.status_code == 200
        assert response.json()["result"]["agent_result"] == {"n": 7}
        async with httpx.AsyncClient() as scraper:
            text = (await scraper.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
        assert 'canon_events_projected_total{outcome="applied",projection="receipts"}' in text
        assert 'canon_http_request_duration_seconds_count{route="receipt",status="200"}' in text

    process.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(process.wait, 15) == 0


async def test_serve_answers_what_a_separate_workers_process_projected(
    make_store: Any, redis: Redis, redis_url: str, namespace: str, spawn: Any
) -> None:
    """``canon serve`` without workers and ``canon workers`` as two processes on one Redis:
    the receipt and progress the workers process writes are served over HTTP, and both
    processes exit 0 on SIGTERM."""
    store: Store = make_store(shards=4)
    token = (await store.open_run(RUN, deadline=timedelta(minutes=5))).access_token
    port = free_port()
    connection = (f"--redis-url={redis_url}", f"--namespace={namespace}", "--shards=4")
    server, _ = spawn("serve", *connection, f"--port={port}")
    workers, workers_log = spawn("workers", *connection, "--block-ms=100")
    auth = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:

        async def ready() -> bool:
            assert server.poll() is None, "canon serve exited"
            assert workers.poll() is None, "canon workers exited"
            started = (await asyncio.to_thread(workers_log.read_bytes)).count(b"worker_started")
            try:
                await client.get("/v1/invocations/inspection-capabilities", headers=auth)
            except httpx.TransportError:
                return False
            return started == 2

        await until(ready, 30)
        head = await store.writer.create(RUN, "c1", "search", b'{"q":1}')
        head = await store.writer.start_projecting(head, b'{"raw":1}')
        head = await store.writer.complete(head, b'{"n":7}', EvidenceStatus.EVIDENCE_FOUND, "s")
        receipt_key = store.keys.receipt(RUN, invocation_id(RUN, "c1"))

        async def served() -> bool:
            progress = await client.get(f"/v1/runs/{RUN}/progress", headers=auth)
            body = progress.json()
            materialized = await redis.hget(receipt_key, "version")
            return materialized == b"3" and body["source"] == "view" and body["invocations"] == 1

        await until(served, 30)
        # Mark the stored receipt: only the workers process writes receipts, so a served
        # mark shows the server answered with what that process projected.
        stored = msgspec.json.decode(await redis.hget(receipt_key, "receipt"))
        stored["result"]["scope"] = "projected-elsewhere"
        await redis.hset(receipt_key, "receipt", msgspec.json.encode(stored))
        response = await client.get(
            f"/v1/invocations/{invocation_id(RUN, 'c1')}/receipt", headers=auth
        )
        assert response.status_code == 200
        body = response.json()
        assert (body["result"]["scope"], body["result"]["agent_result"]) == (
            "projected-elsewhere",
            {"n": 7},
        )

    for process in (server, workers):
        process.send_signal(signal.SIGTERM)
    for process in (server, workers):
        assert await asyncio.to_thread(process.wait, 15) == 0
