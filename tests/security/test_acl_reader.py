"""The read-only user of docs/acl.md runs everything that only reads: ``canon serve``, the
receipt and progress API, and every audit command, with no ACL denial; opening a store for
reading writes nothing; a command the user may not run is named an ACL denial, never
"the Redis server is unavailable"."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from eventstore import Store
from eventstore.decisions import new_approval_id
from eventstore.errors import AccessDenied
from eventstore.server.embedded import EmbeddedRedis
from eventstore.writer import now_ms
from machine.codes import Stage
from machine.ids import invocation_id
from projections import create_app
from projections.console import Console, OperatorAuth
from tests.integration.receipts.test_serve import free_port, spawn, until  # noqa: F401 (fixture)
from tests.security.test_acl import (  # noqa: F401 (fixtures)
    admin,
    denials,
    server,
    url_of,
    write_calls,
)
from tests.support.calls import RUN
from tests.support.console_run import OPERATOR_TOKEN

READER = "canon-reader"


async def test_reader_runs_canon_serve(
    server: EmbeddedRedis,  # noqa: F811
    admin: Redis,  # noqa: F811
    spawn: Any,  # noqa: F811
) -> None:
    """``canon serve`` as the reader starts, serves every receipt and the run's progress,
    and stops on SIGTERM with exit 0, without a single ACL denial."""
    token, _, writer = await write_calls(server)
    await writer.aclose()
    port = free_port()
    process, output = spawn(
        "serve",
        f"--redis-url={url_of(server, READER)}",
        "--namespace=canon",
        "--shards=4",
        f"--port={port}",
        "--log-format=json",
    )
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:

        async def listening() -> bool:
            assert process.poll() is None, output.read_text()
            try:
                answer = await http.get("/v1/invocations/inspection-capabilities", headers=headers)
            except httpx.TransportError:
                return False
            return answer.status_code == 200

        await until(listening, 30)
        for call in ("c1", "c2"):
            response = await http.get(
                f"/v1/invocations/{invocation_id(RUN, call)}/receipt", headers=headers
            )
            assert response.status_code == 200, response.text
            assert response.json()["tool_call_id"] == call
        progress = await http.get(f"/v1/runs/{RUN}/progress", headers=headers)
        assert progress.status_code == 200, progress.text
    process.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(process.wait, 20) == 0, output.read_text()
    assert await denials(admin) == []


async def _canon(*args: str) -> tuple[int, str, str]:
    """Run ``canon`` in a subprocess; its exit code, stdout and stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "canon.cli",
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


async def test_reader_runs_every_audit_command(
    server: EmbeddedRedis,  # noqa: F811
    admin: Redis,  # noqa: F811
) -> None:
    """replay, verify, export, inspect and status all run as the reader; the only command
    refused is CONFIG GET, which the reader is denied on purpose (it can read passwords):
    status then says the cost settings could not be read."""
    token, _, writer = await write_calls(server)
    await writer.aclose()
    url = f"--redis-url={url_of(server, READER)}"
    receipt_id = invocation_id(RUN, "c1")
    for command in (
        ["replay", RUN],
        ["verify", "--no-progress"],
        ["export", RUN],
        ["inspect", receipt_id, f"--run-token={token}"],
        ["inspect", receipt_id, f"--run-id={RUN}"],
    ):
        code, _, stderr = await _canon(*command, url, "--shards=4")
        assert code == 0, (command, stderr)
    assert await denials(admin) == []

    code, stdout, stderr = await _canon("status", "--json", url, "--shards=4")
    # It could report: exit 0, with one warning (the settings CONFIG GET would have read).
    assert code == 0, stderr
    assert "unavailable" not in stderr
    assert '"records":2' in stdout and '"appendonly":"yes"' in stdout, stdout
    assert '"maxmemory_policy":"noeviction"' in stdout, stdout
    assert '"groups":[]' in stdout and "server settings could not be read" in stdout
    # 6.2 logs a denied subcommand by its command, 7.x as command|subcommand.
    assert {entry["object"] for entry in await denials(admin)} in ({"config|get"}, {"config"})


async def test_a_read_only_store_writes_nothing(
    server: EmbeddedRedis,  # noqa: F811
    admin: Redis,  # noqa: F811
) -> None:
    """A store opened for reading, on a namespace nobody has written yet, enters as the
    reader without a denial and creates nothing (no namespace metadata)."""
    async with Store.from_url(url_of(server, READER), shards=4, read_only=True) as store:
        assert await store.get(RUN, "c1") is None
    assert await admin.dbsize() == 0
    assert await denials(admin) == []


async def test_an_acl_denial_is_named_as_one(
    server: EmbeddedRedis,  # noqa: F811
    admin: Redis,  # noqa: F811
) -> None:
    """The reader entering a writing store is refused with AccessDenied; ``canon workers``
    as the reader exits 2 with a line naming the ACL denial, not the server unavailable."""
    with pytest.raises(AccessDenied):
        async with Store.from_url(url_of(server, READER), shards=4):
            pass
    code, _, stderr = await _canon(
        "workers", "--burst", f"--redis-url={url_of(server, READER)}", "--shards=4"
    )
    assert code == 2
    assert "NOPERM" in stderr and "docs/acl.md" in stderr, stderr
    assert "unavailable" not in stderr


async def test_a_decision_served_as_the_reader_is_named_an_acl_denial(
    server: EmbeddedRedis,  # noqa: F811
    admin: Redis,  # noqa: F811
) -> None:
    """Served as the reader (``canon serve`` without workers, as docs/acl.md suggests), an
    operator's decision over HTTP is 503 ``store_access_denied``, saying a writer is
    needed, never "unavailable"; the call still waits."""
    _, _, writer = await write_calls(server)
    await writer.writer.request_approval(
        RUN,
        "pay-1",
        "refund",
        b'{"amount":5}',
        approval_id=new_approval_id(),
        approval_expires_at_ms=now_ms() + 600_000,
        requested_by="agent",
    )
    reader = Store.from_url(url_of(server, READER), shards=4, read_only=True)
    try:
        console = Console(reader, OperatorAuth(OPERATOR_TOKEN))
        app = create_app(reader, console=console, operator=console.gate)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://canon") as http:
            answer = await http.post(
                f"/v1/runs/{RUN}/invocations/{invocation_id(RUN, 'pay-1')}/approval",
                json={"decision": "approve", "reason": "checked", "by": "ana"},
                headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
            )
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"] == "store_access_denied"
        record = await writer.reader.get(RUN, "pay-1")
        assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL
    finally:
        await reader.aclose()
        await writer.aclose()
