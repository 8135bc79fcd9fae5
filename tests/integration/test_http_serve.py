"""``canon serve --with-workers``: receipts and progress visible within a second; exits 0."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from eventstore.store import Store
from machine.codes import EvidenceStatus
from machine.ids import invocation_id
from projections import read_view

RUN = "run-s"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def serve_process(tmp_path: Path) -> Iterator[Any]:
    """Starts ``canon serve``; kills and reaps it at the end if it is still running."""
    processes: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> subprocess.Popen[bytes]:
        with (tmp_path / "serve.log").open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "canon.cli", "serve", *args],
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=dict(os.environ),
            )
        processes.append(process)
        return process

    yield start
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


async def until(check: Any, timeout_s: float) -> float:
    """Poll ``check()`` until it is truthy; return the seconds it took."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not await check():
        assert loop.time() - started < timeout_s, "timed out"
        await asyncio.sleep(0.01)
    return loop.time() - started


async def test_served_receipts_and_progress_follow_a_run_within_a_second(
    make_store: Any, redis: Redis, redis_url: str, namespace: str, serve_process: Any
) -> None:
    """With serve and workers running, a call's receipt and progress appear within a second."""
    store: Store = make_store(shards=4)
    token = (await store.open_run(RUN, deadline=timedelta(minutes=5))).access_token
    port, metrics_port = free_port(), free_port()
    process = serve_process(
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

        assert await until(projected, 5) < 1.0
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
