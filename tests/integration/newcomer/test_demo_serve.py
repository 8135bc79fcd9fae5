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
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.integration.newcomer.test_demo import _processes_in
from tests.support.browser import replaced, screenshot
from tests.support.ports import free_port
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


async def test_the_demos_waiting_refund_is_approved_in_the_browser_and_runs_once(
    demo: Any, tmp_path: pathlib.Path, browser: webdriver.Chrome
) -> None:
    """The demo prints the console page of its refund waiting for approval; an operator
    logs in there (headless chromium), approves it with a reason, and the demo's harness
    resumes it: the page shows it READY, approved by the console's operator with that
    reason, dispatched once with the approved request."""
    process, output = demo("--serve", "--port", "0", "--data-dir", str(tmp_path / "d"))

    def printed() -> str:
        assert process.poll() is None, output.read_text(errors="replace")[-3000:]
        return ANSI.sub("", output.read_text(errors="replace"))

    await wait_for(lambda: "operator token:" in printed(), 120)
    text = printed()
    token = re.search(r"operator token: (\S+)", text)
    waiting = re.search(r"a refund waiting for your approval: (http://\S+)", text)
    assert token and waiting, text

    def approve(driver: webdriver.Chrome) -> None:
        wait = WebDriverWait(driver, 30)
        driver.get(waiting.group(1))
        wait.until(lambda d: d.find_element(By.ID, "token")).send_keys(token.group(1))
        driver.find_element(By.ID, "login").click()
        form = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#decide form.decide"))
        assert "ord-1042" in driver.find_element(By.ID, "decide").text  # the frozen request
        screenshot(driver, "demo-refund-waiting", whole=False)
        form.find_element(By.NAME, "reason").send_keys("checked the order")
        form.find_element(By.CSS_SELECTOR, "button[value='approve']").click()
        wait.until(replaced(form))  # the answer's page, not the one the form was on
        wait.until(lambda d: d.find_elements(By.ID, "decision"))

        def ran(d: webdriver.Chrome) -> bool:
            d.refresh()
            return "status READY" in d.find_element(By.TAG_NAME, "main").text

        wait.until(ran)
        decision = driver.find_element(By.ID, "decision").text
        assert "approved by operator" in decision, decision
        assert "checked the order" in decision and "the approved one" in decision, decision
        screenshot(driver, "demo-refund-approved", whole=False)

    await asyncio.to_thread(approve, browser)
    await wait_for(lambda: "the harness resumed call_" in printed(), 30)
    assert "READY" in printed().split("the harness resumed", 1)[1]
    process.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(process.wait, 30) == 0, printed()
