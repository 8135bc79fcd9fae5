"""``canon demo --serve`` as a newcomer runs it: the printed console URL and token open a
populated run and its failed call; SIGTERM stops it with exit 0 and no redis-server left."""

from __future__ import annotations

import asyncio
import os
import pathlib
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from eventstore.server.loopback import free_port
from tests.integration.test_demo import _processes_in
from tests.support.waiting import wait_for

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture
def demo(tmp_path: pathlib.Path) -> Iterator[Any]:
    """Starts ``canon demo --serve``, output in a file; stops and reaps it by pid at the end,
    and any server it left in ``tmp_path``."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*argv: str) -> tuple[subprocess.Popen[bytes], pathlib.Path]:
        output = tmp_path / "demo.out"
        env = {
            k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "CANON_OPERATOR_TOKEN")
        }
        with output.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "canon.cli", "demo", *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**env, "COLUMNS": "100"},
            )
        started.append(process)
        return process, output

    yield start
    for process in started:
        if process.poll() is None:
            # SIGTERM first: the demo stops its embedded Redis on the way out; a SIGKILL
            # would leave that child running.
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        process.wait(timeout=10)
    # Whatever the demo could not stop (it was killed): its servers run in tmp_path.
    for pid in _processes_in(tmp_path, below=True):
        os.kill(pid, signal.SIGKILL)


async def test_demo_serve_opens_the_console_on_a_populated_run(
    demo: Any, tmp_path: pathlib.Path
) -> None:
    """The printed URL and token log in; the runs page lists the demo's runs, the run page
    has its bars, the failed call's page says EXECUTION_FAILED; the embedded Redis listens
    on the --redis-port asked for, printed as one plain line; SIGTERM exits 0 and the
    embedded Redis is gone."""
    data_dir = tmp_path / "data"
    redis_port = free_port()
    process, output = demo(
        "--serve",
        "--port",
        "0",
        "--data-dir",
        str(data_dir),
        "--calls",
        "6",
        "--redis-port",
        str(redis_port),
    )

    def printed() -> str:
        assert process.poll() is None, output.read_text(errors="replace")[-3000:]
        return ANSI.sub("", output.read_text(errors="replace"))

    await wait_for(lambda: "operator token:" in printed(), 120)
    text = printed()
    url = re.search(r"console: (http://127\.0\.0\.1:\d+/console/)", text)
    token = re.search(r"operator token: (\S+)", text)
    run_url = re.search(r"the first run: (http://\S+)", text)
    failed_url = re.search(r"its failed call: (http://\S+)", text)
    run_ids = re.search(r"namespace demo · runs (.+)", text)
    assert url and token and run_url and failed_url and run_ids, text
    assert "embedded server at redis://" in text or "embedded server at unix://" in text
    assert re.search(rf"^redis: redis://127\.0\.0\.1:{redis_port}/0$", text, re.MULTILINE), text
    async with httpx.AsyncClient() as client:
        login = await client.post(
            url.group(1) + "login", data={"token": token.group(1), "next": "/console/"}
        )
        assert login.status_code == 303
        runs = await client.get(url.group(1))
        assert runs.status_code == 200
        for run_id in run_ids.group(1).split(", "):
            assert f"/console/runs/{run_id}" in runs.text, run_id
        run = await client.get(run_url.group(1))
        assert run.status_code == 200 and run.text.count('<rect class="bar"') >= 6
        failed = await client.get(failed_url.group(1))
        assert failed.status_code == 200 and "Failure detail" in failed.text
        assert 'id="error-code">EXECUTION_FAILED' in failed.text
    process.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(process.wait, 30) == 0, printed()
    assert not _processes_in(data_dir), "the embedded redis-server outlived the demo"
    assert "Traceback" not in output.read_text(errors="replace")
