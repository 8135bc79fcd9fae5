"""``canon mcp-proxy --http`` at both protocol eras, with the official client as the host.

The proxy routes each request by its era, as the SDK's own server does: 2026-07-28
requests (self-contained, ``_meta`` envelope, routing headers) go to one shared relay
whose upstream starts with the first valid request; 2025 sessions each get their own.
Nothing that is refused starts an upstream; idle ones stop.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.client.client import Client

from eventstore import Store
from machine.codes import Status
from tests.support.mcp_raw_host import ROOT
from tests.support.ports import free_port
from tests.support.waiting import wait_for

RUN = "run-http-eras"
MODERN = "2026-07-28"
HOSTILE = [sys.executable, str(ROOT / "tests" / "support" / "mcp_hostile_upstream.py")]
EVERYTHING = [sys.executable, str(ROOT / "tests" / "support" / "mcp_everything_server.py")]
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
}
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}

pytestmark = pytest.mark.timeout(120)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def popen(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``argv`` from the project root, its output in ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=ROOT)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    """Starts HTTP servers (output in files); SIGTERM, then SIGKILL, each by pid."""
    processes: list[subprocess.Popen[bytes]] = []

    async def start(argv: list[str]) -> str:
        port = free_port()
        argv = [arg.replace("{port}", str(port)) for arg in argv]
        processes.append(popen(argv, tmp_path / f"server-{len(processes)}.log"))
        url = f"http://127.0.0.1:{port}/mcp"

        async def answering() -> bool:
            try:
                async with httpx.AsyncClient() as client:
                    await client.get(url, timeout=1.0)
            except httpx.TransportError:
                return False
            return True

        await wait_for(answering, timeout_s=60)
        return url

    start.processes = processes  # type: ignore[attr-defined]
    yield start
    for process in reversed(processes):
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def proxy(redis_url: str, namespace: str, *options: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "canon.cli",
        "mcp-proxy",
        f"--redis-url={redis_url}",
        f"--namespace={namespace}",
        "--http",
        "--port={port}",
        *options,
    ]


def modern(request_id: Any, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": method,
        "params": {**(params or {}), "_meta": dict(ENVELOPE)},
    }


def pids(ran: Path, kind: str = "pids") -> list[int]:
    """The upstream children that started (``pids``) or got a request (``served``)."""
    path = Path(f"{ran}.{kind}")
    return [int(line) for line in path.read_text().split()] if path.exists() else []


async def test_the_official_client_in_its_default_mode_speaks_2026_through_the_proxy(
    spawn: Any, redis_url: str, namespace: str, make_store: Any
) -> None:
    """``Client(url)`` negotiates 2026-07-28; results, a pending call and a refusal all parse."""
    store: Store = make_store()
    options = (f"--run-id={RUN}", "--govern=test_error_handling")
    url = await spawn([*proxy(redis_url, namespace, *options), "--", *EVERYTHING])
    async with Client(url) as client:
        assert client.session.protocol_version == MODERN
        listed = await client.list_tools()
        assert "test_simple_text" in [tool.name for tool in listed.tools]
        done = await client.call_tool("test_simple_text", {})
        pending = await client.call_tool("test_error_handling", {})
        refused = await client.call_tool("no_such_tool", {})
    assert done.result_type == "complete" and not done.is_error
    assert done.content[0].text == "This is a simple text response for testing."  # type: ignore[union-attr]
    assert pending.result_type == "complete" and not pending.is_error
    assert pending.meta is not None and "io.canon/approval_id" in pending.meta
    assert refused.is_error
    assert json.loads(refused.content[0].text)["error_code"] == "UNKNOWN_TOOL"  # type: ignore[union-attr]
    tool_call_id = done.meta["io.canon/tool_call_id"]  # type: ignore[index]
    record = await store.get(RUN, tool_call_id)
    assert record is not None and record.state.status is Status.READY


async def test_the_proxy_sends_the_2026_routing_headers_to_an_http_upstream(
    spawn: Any, redis_url: str, namespace: str
) -> None:
    """Through ``--upstream-url`` to the SDK's own server, which refuses a request without
    MCP-Protocol-Version / Mcp-Method / Mcp-Name (-32020): every call is answered."""
    upstream = await spawn([*EVERYTHING, "{port}"])
    url = await spawn([*proxy(redis_url, namespace, f"--upstream-url={upstream}")])
    async with Client(url) as client:
        assert client.session.protocol_version == MODERN
        done = await client.call_tool("test_simple_text", {})
        prompt = await client.get_prompt("test_simple_prompt")
    assert not done.is_error and done.result_type == "complete"
    assert prompt.messages


async def test_a_refused_request_starts_no_upstream_and_an_idle_one_stops(
    spawn: Any, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """A POST that is no initialize, a bad 2026 envelope: refused, no child; the first valid
    request starts one child for every 2026 request (and a spare, started ahead for the
    next session); idle past the timeout, the serving child stops, the spare waits."""
    ran = tmp_path / "ran.txt"
    options = (f"--run-id={RUN}", "--idle-timeout-s=1")
    url = await spawn([*proxy(redis_url, namespace, *options), "--", *HOSTILE, "ok", str(ran)])
    async with httpx.AsyncClient(headers=HEADERS, timeout=30) as http:
        legacy = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert legacy.status_code == 400
        bare = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        headers = {"mcp-protocol-version": MODERN, "mcp-method": "tools/list"}
        refused = await http.post(url, json=bare, headers=headers)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == -32602
        assert pids(ran) == []
        for request_id in (3, 4):
            answer = await http.post(url, json=modern(request_id, "tools/list"), headers=headers)
            assert answer.status_code == 200, answer.text
            assert answer.json()["id"] == request_id
            assert answer.json()["result"]["resultType"] == "complete"
        # The child serving them, and the spare started ahead for the next session.
        await wait_for(lambda: len(pids(ran)) == 2, timeout_s=30)
        # Both start at once: which wrote its pid first is chance, which was served is not.
        [serving] = pids(ran, "served")
        [spare] = set(pids(ran)) - {serving}
        await wait_for(lambda: not alive(serving), timeout_s=30)
        assert alive(spare)
        again = await http.post(url, json=modern(5, "tools/list"), headers=headers)
        assert again.status_code == 200
        await wait_for(lambda: len(pids(ran)) == 3, timeout_s=30)


async def test_a_legacy_session_idle_past_the_timeout_ends_with_its_upstream(
    spawn: Any, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """A 2025 session left idle: its id answers 404 and its child is gone."""
    ran = tmp_path / "ran.txt"
    options = (f"--run-id={RUN}", "--idle-timeout-s=1")
    url = await spawn([*proxy(redis_url, namespace, *options), "--", *HOSTILE, "ok", str(ran)])
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {}},
    }
    async with httpx.AsyncClient(headers=HEADERS, timeout=30) as http:
        opened = await http.post(url, json=initialize)
        assert opened.status_code == 200
        session = opened.headers["mcp-session-id"]
        [pid] = pids(ran, "served")  # not the spare started ahead for the next session
        await wait_for(lambda: not alive(pid), timeout_s=30)
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        gone = await http.post(url, json=ping, headers={"mcp-session-id": session})
        assert gone.status_code == 404


async def test_two_hosts_with_the_same_json_rpc_id_each_get_their_own_answer(
    spawn: Any, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """2026 requests share one upstream; the proxy's own ids keep two ``1``s apart."""
    ran = tmp_path / "ran.txt"
    url = await spawn(
        [*proxy(redis_url, namespace, f"--run-id={RUN}"), "--", *HOSTILE, "ok", str(ran)]
    )
    headers = {"mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": "echo"}
    async with httpx.AsyncClient(headers=HEADERS, timeout=30) as http:
        answers = await asyncio.gather(
            *(
                http.post(
                    url,
                    json=modern(1, "tools/call", {"name": "echo", "arguments": {"n": n}}),
                    headers=headers,
                )
                for n in range(4)
            )
        )
    texts = sorted(answer.json()["result"]["content"][0]["text"] for answer in answers)
    assert texts == [json.dumps({"n": n}) for n in range(4)]
    assert all(answer.json()["id"] == 1 for answer in answers)


async def test_every_child_stops_with_the_proxy(
    spawn: Any, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """Two sessions and the spare child: SIGTERM stops the proxy and every one of them."""
    ran = tmp_path / "ran.txt"
    url = await spawn(
        [*proxy(redis_url, namespace, f"--run-id={RUN}"), "--", *HOSTILE, "ok", str(ran)]
    )
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {}},
    }
    async with httpx.AsyncClient(headers=HEADERS, timeout=30) as http:
        for _ in range(2):
            assert (await http.post(url, json=initialize)).status_code == 200
    await wait_for(lambda: len(pids(ran)) == 3, timeout_s=30)
    [process] = [p for p in spawn.processes if "mcp-proxy" in p.args]
    process.send_signal(signal.SIGTERM)
    await asyncio.to_thread(process.wait, 30)
    assert process.returncode == 0
    for pid in pids(ran):
        await wait_for(lambda pid=pid: not alive(pid), timeout_s=30)
