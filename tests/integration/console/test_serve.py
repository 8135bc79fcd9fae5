"""``canon serve`` with the console: the token from a file opens it, no token leaves it off
(and the log says so), a non-loopback host logs a loud warning; no token in any log."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from eventstore.store import Store
from tests.integration.receipts.test_serve import spawn, until
from tests.support.console_run import DETAIL, OPERATOR_TOKEN, RUN, failed_invocation, populate
from tests.support.ports import free_port

__all__ = ["spawn"]  # the fixture, used by name


async def serve_console(
    spawn: Any, redis_url: str, namespace: str, *extra: str
) -> tuple[Any, Path, int]:
    port = free_port()
    process, output = spawn(
        "serve",
        f"--redis-url={redis_url}",
        f"--namespace={namespace}",
        "--shards=2",
        f"--port={port}",
        *extra,
    )
    async with httpx.AsyncClient() as client:

        async def answering() -> bool:
            assert process.poll() is None, output.read_text()
            try:
                await client.get(f"http://127.0.0.1:{port}/console/login")
            except httpx.TransportError:
                return False
            return True

        await until(answering, 30)
    return process, output, port


async def stop(process: Any) -> None:
    process.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(process.wait, 15) == 0


async def test_serve_opens_the_console_with_the_token_file(
    make_store: Any, redis_url: str, namespace: str, spawn: Any, tmp_path: Path
) -> None:
    """The token file's token opens the run page over a bearer header; the log names the
    console and never the token."""
    store: Store = make_store(shards=2)
    await populate(store)
    token_file = tmp_path / "operator-token"
    token_file.write_text(OPERATOR_TOKEN + "\n")
    process, output, port = await serve_console(
        spawn, redis_url, namespace, f"--operator-token-file={token_file}"
    )
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        page = await client.get(
            f"/console/runs/{RUN}", headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}
        )
        assert page.status_code == 200 and '<rect class="bar"' in page.text
        assert (await client.get("/console/")).status_code == 401
        failed = f"/console/runs/{RUN}/invocations/{failed_invocation()}"
        for path in (failed, failed + "/payloads", f"/console/runs/{RUN}/invocations/x"):
            await client.get(path, headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"})
    await stop(process)
    log = output.read_text()
    assert "console_enabled" in log and OPERATOR_TOKEN not in log
    # Neither a payload nor the failure detail reaches the log, whatever was browsed.
    assert "PAYLOAD-MARKER" not in log and DETAIL["message"] not in log


async def test_without_a_token_the_console_is_off_and_the_log_says_so(
    make_store: Any, redis_url: str, namespace: str, spawn: Any
) -> None:
    """No token configured: /console/ is 404 and the serve log says the console is off."""
    make_store(shards=2)
    process, output, port = await serve_console(spawn, redis_url, namespace)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        assert (await client.get("/console/")).status_code == 404
    await stop(process)
    assert "console_disabled" in output.read_text()


async def test_a_host_beyond_loopback_is_a_loud_warning(
    make_store: Any, redis_url: str, namespace: str, spawn: Any, tmp_path: Path
) -> None:
    """Bound to every address, the console still serves, and the log warns in capitals."""
    make_store(shards=2)
    token_file = tmp_path / "operator-token"
    token_file.write_text(OPERATOR_TOKEN)
    process, output, _ = await serve_console(
        spawn, redis_url, namespace, "--host=0.0.0.0", f"--operator-token-file={token_file}"
    )
    await stop(process)
    log = output.read_text()
    assert "console_exposed" in log and "REACHABLE BEYOND THIS MACHINE" in log


@pytest.mark.parametrize("where", ["file", "environment"])
async def test_a_short_operator_token_is_refused_at_start(
    make_store: Any,
    redis_url: str,
    namespace: str,
    spawn: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    """A token under 16 bytes (from the file or $CANON_OPERATOR_TOKEN): exit 2 with one
    ``canon: error:`` line that never shows the token, before anything listens."""
    make_store(shards=2)
    short = "Xq7-short-tok"
    extra: list[str] = []
    if where == "file":
        token_file = tmp_path / "operator-token"
        token_file.write_text(short + "\n")
        extra.append(f"--operator-token-file={token_file}")
    else:
        monkeypatch.setenv("CANON_OPERATOR_TOKEN", short)
    process, output = spawn(
        "serve", f"--redis-url={redis_url}", f"--namespace={namespace}", "--port=0", *extra
    )
    assert await asyncio.to_thread(process.wait, 30) == 2
    lines = output.read_text().splitlines()
    errors = [line for line in lines if line.startswith("canon: error:")]
    assert len(errors) == 1 and "at least 16 bytes" in errors[0], lines
    assert short not in output.read_text() and "server_started" not in output.read_text()


async def test_secure_cookies_flag_marks_the_cookie_secure_on_plain_http(
    make_store: Any, redis_url: str, namespace: str, spawn: Any, tmp_path: Path
) -> None:
    """``--secure-cookies``: the login cookie is ``Secure`` even when the request came in
    over plain HTTP (TLS ended by a proxy that does not say so)."""
    make_store(shards=2)
    token_file = tmp_path / "operator-token"
    token_file.write_text(OPERATOR_TOKEN)
    process, _, port = await serve_console(
        spawn, redis_url, namespace, f"--operator-token-file={token_file}", "--secure-cookies"
    )
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        login = await client.post("/console/login", data={"token": OPERATOR_TOKEN})
    await stop(process)
    assert login.status_code == 303
    cookie = login.headers["set-cookie"]
    assert "; secure" in cookie.lower() and "path=/console/" in cookie.lower(), cookie
