"""``canon serve`` against hostile connections, over raw loopback sockets: every answer the
server makes (its own answers to malformed requests included) says ``no-store``, every log
line is JSON when JSON is chosen, idle and half-open connections are closed within their
bounds, the connection cap holds, and a normal request is served meanwhile."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from eventstore.store import Store
from projections.connections import ConnectionLimits
from projections.worker.supervisor import ReceiptServer
from tests.helpers import wait_until
from tests.integration.receipts.test_serve import free_port, spawn, until  # noqa: F401 (fixture)

CAPS = "/v1/invocations/inspection-capabilities"
RUN = "run-c"
#: How long a connection may wait: for its request's header, and idle after an answer.
BOUND_S = 1.0

Served = tuple[int, str, Any, Path]


@pytest.fixture
async def serve(
    spawn: Any,  # noqa: F811
    redis_url: str,
    namespace: str,
    make_store: Any,
) -> AsyncIterator[Callable[..., Awaitable[Served]]]:
    """Starts ``canon serve`` with JSON logs and the given options; returns its port, a
    run token, the process and its output file once it answers."""

    async def start(*options: str) -> Served:
        store: Store = make_store()
        token = (await store.open_run(RUN, deadline=timedelta(minutes=5))).access_token
        port = free_port()
        process, output = spawn(
            "serve",
            f"--redis-url={redis_url}",
            f"--namespace={namespace}",
            f"--port={port}",
            "--log-format=json",
            *options,
        )
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:

            async def listening() -> bool:
                assert process.poll() is None, output.read_text()
                try:
                    await http.get(CAPS)
                except httpx.TransportError:
                    return False
                return True

            await until(listening, 30)
        return port, token, process, output

    yield start


async def _exchange(port: int, data: bytes, timeout_s: float = 10) -> bytes:
    """Send ``data`` on a fresh connection and read until the server closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout_s)
    finally:
        writer.close()


def _headers(answer: bytes) -> tuple[int, dict[str, list[str]]]:
    head, _, _ = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, list[str]] = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    return int(status_line.split()[1]), headers


MALFORMED = {
    "duplicate_host": b"GET " + CAPS.encode() + b" HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    "http11_without_host": b"GET " + CAPS.encode() + b" HTTP/1.1\r\n\r\n",
    "raw_non_ascii_path": b"GET /v1/invocations/\xc3\xa9/receipt HTTP/1.1\r\nHost: a\r\n\r\n",
    "not_http": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(32)) + b"\r\n\r\n",
    "control_in_target": b"GET /\x7f HTTP/1.1\r\nHost: a\r\n\r\n",
}


async def test_every_answer_says_no_store_and_every_log_line_is_json(
    serve: Callable[..., Awaitable[Served]],
) -> None:
    """Malformed requests the HTTP layer answers itself (400), a 401 and a 200 all carry
    exactly one ``Cache-Control: no-store``; after SIGTERM every line the process wrote,
    uvicorn's own included, is a JSON object."""
    port, token, process, output = await serve()
    for name, data in MALFORMED.items():
        status, headers = _headers(await _exchange(port, data))
        assert status == 400, name
        assert headers.get("cache-control") == ["no-store"], (name, headers)
    for auth, expected in ((b"", 401), (f"Authorization: Bearer {token}\r\n".encode(), 200)):
        request = b"GET " + CAPS.encode() + b" HTTP/1.1\r\nHost: a\r\nConnection: close\r\n"
        status, headers = _headers(await _exchange(port, request + auth + b"\r\n"))
        assert status == expected
        assert headers.get("cache-control") == ["no-store"], headers
    process.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(process.wait, 20) == 0
    lines = [line for line in output.read_bytes().splitlines() if line.strip()]
    events = [msgspec.json.decode(line) for line in lines]  # raises on a non-JSON line
    assert all(isinstance(event, dict) and "event" in event for event in events)
    uvicorn_lines = [
        event for event in events if str(event.get("logger", "")).startswith("uvicorn")
    ]
    assert any("Invalid HTTP request" in event["event"] for event in uvicorn_lines), events


async def _hold(port: int, data: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if data:
        writer.write(data)
        await writer.drain()
    return reader, writer


async def _closed_by_server(reader: asyncio.StreamReader, timeout_s: float) -> bool:
    """Whether the server closes the connection within ``timeout_s`` (data is skipped)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    try:
        while loop.time() < deadline:
            chunk = await asyncio.wait_for(reader.read(65536), deadline - loop.time())
            if not chunk:
                return True
    except TimeoutError:
        return False
    except ConnectionError:  # reset by the server: closed too
        return True
    return False


async def test_idle_and_half_open_connections_are_closed_within_their_bounds(
    serve: Callable[..., Awaitable[Served]],
) -> None:
    """300 connections (100 silent, 100 with half a header, 100 idle after one answer):
    a normal request is served meanwhile, and the server closes every one of them within
    its bound (1 s here, plus scheduling slack), not the 40 s and more it used to allow."""
    port, token, process, _ = await serve(
        f"--header-timeout-s={BOUND_S}", f"--idle-timeout-s={BOUND_S}"
    )
    partial = b"GET " + CAPS.encode() + b" HTTP/1.1\r\nHost: a\r\nAuthoriz"
    complete = f"GET {CAPS} HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
    held = []
    try:
        for data in (b"", partial, complete):
            held += await asyncio.gather(*(_hold(port, data) for _ in range(100)))
        loop = asyncio.get_running_loop()
        opened = loop.time()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            answer = await http.get(CAPS, headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 200
        assert answer.headers["cache-control"] == "no-store"
        closed = await asyncio.gather(
            *(_closed_by_server(reader, timeout_s=BOUND_S + 10) for reader, _ in held)
        )
        assert all(closed), f"{closed.count(False)} of {len(held)} connections still open"
        assert loop.time() - opened < BOUND_S + 10
        assert process.poll() is None
    finally:
        for _, writer in held:
            writer.close()


async def test_the_connection_cap_holds_and_normal_requests_are_still_served(
    serve: Callable[..., Awaitable[Served]],
) -> None:
    """With --max-connections 20 and 50 silent connections, the server keeps at most 20
    open (the oldest waiting ones are closed first) and still serves a normal request."""
    port, token, _, _ = await serve("--max-connections=20", "--header-timeout-s=60")
    held = []
    try:
        for _ in range(50):
            held.append(await _hold(port, b""))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            answer = await http.get(CAPS, headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 200
        closed = await asyncio.gather(*(_closed_by_server(r, timeout_s=2) for r, _ in held))
        # 30 made room for the later ones, and one more for the normal request.
        assert closed == [True] * 31 + [False] * 19
    finally:
        for _, writer in held:
            writer.close()


async def test_busy_connections_are_never_cut_and_a_newcomer_past_the_cap_gets_503() -> None:
    """Requests still being answered outlive the header bound, are never closed to make
    room, and a connection past the cap while all are busy gets 503 no-store, then the
    busy ones get their answers."""
    release = asyncio.Event()

    async def slow(scope: Any, receive: Any, send: Any) -> None:
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    limits = ConnectionLimits(header_timeout_s=0.2, idle_timeout_s=0.2, max_connections=2)
    server = ReceiptServer(slow, limits=limits)
    task = asyncio.create_task(server.serve())
    held = []
    try:
        await wait_until(lambda: server.started or task.done())
        assert not task.done()
        request = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"
        held = [await _hold(server.port, request) for _ in range(2)]
        await wait_until(lambda: len(server.server_state.tasks) == 2)
        status, headers = _headers(await _exchange(server.port, request, timeout_s=5))
        assert (status, headers.get("cache-control")) == (503, ["no-store"])
        await asyncio.sleep(limits.header_timeout_s * 2)  # past the header bound on purpose
        release.set()
        for reader, _ in held:
            status, headers = _headers(await asyncio.wait_for(reader.readuntil(b"{}"), 5))
            assert (status, headers.get("cache-control")) == (200, ["no-store"])
    finally:
        for _, writer in held:
            writer.close()
        server.stop()
        await asyncio.wait_for(task, 10)
