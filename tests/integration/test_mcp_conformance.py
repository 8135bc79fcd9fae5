"""The official MCP conformance suite passes through ``canon mcp-proxy`` as it passes directly.

The suite's server scenarios (``@modelcontextprotocol/conformance``, every suite) run
against tests/support/mcp_everything_server.py over streamable HTTP, then against
``canon mcp-proxy --http`` in front of the same server started on stdio, then in front of
it reached with ``--upstream-url``. Each scenario must pass, and every mode must report
exactly what the direct run reports. Needs Node 22 and the suite in .conformance/
(``scripts/conformance.sh`` installs both); without them the test is skipped.

Run alone: ``pytest tests/integration/test_mcp_conformance.py -p no:randomly``.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.ports import free_port
from tests.support.waiting import wait_for

ROOT = Path(__file__).parents[2]
LOCAL = ROOT / ".conformance"
SUITE = LOCAL / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
EVERYTHING = [sys.executable, str(ROOT / "tests" / "support" / "mcp_everything_server.py")]
#: One summary line of the suite: ``✓ tools-list: 1 passed, 0 failed``.
SUMMARY = re.compile(r"^[✓✗] (?P<scenario>[\w-]+): (?P<passed>\d+) passed, (?P<failed>\d+) failed")

pytestmark = [pytest.mark.timeout(600)]


def node_22() -> str | None:
    """A Node >= 22: the one scripts/conformance.sh installed, else the one on PATH."""
    for candidate in (str(LOCAL / "node_modules" / ".bin" / "node"), shutil.which("node")):
        if candidate is None or not Path(candidate).exists():
            continue
        version = subprocess.run(
            [candidate, "--version"], capture_output=True, text=True, check=False, timeout=30
        ).stdout
        match = re.match(r"v(\d+)", version)
        if match and int(match.group(1)) >= 22:
            return candidate
    return None


async def answering(url: str) -> bool:
    try:
        async with httpx.AsyncClient() as client:
            await client.get(url, timeout=1.0)
    except httpx.TransportError:
        return False
    return True


@pytest.fixture
def node() -> str:
    found = node_22()
    if found is None or not SUITE.exists():
        pytest.skip("no Node 22 or MCP conformance suite: run scripts/conformance.sh")
    return found


def popen(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``argv`` from the project root, its output in ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Any]:
    """Starts HTTP servers (their output in files); SIGTERM, then SIGKILL, each by pid."""
    processes: list[subprocess.Popen[bytes]] = []

    async def start(argv: list[str]) -> str:
        port = free_port()
        argv = [*argv[:1], *[arg.replace("{port}", str(port)) for arg in argv[1:]]]
        processes.append(popen(argv, tmp_path / f"server-{len(processes)}.log"))
        url = f"http://127.0.0.1:{port}/mcp"
        await wait_for(lambda: answering(url), timeout_s=60)
        return url

    yield start
    for process in reversed(processes):
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


async def run_suite(node: str, url: str, workdir: Path) -> dict[str, tuple[int, int]]:
    """Every server scenario's (passed, failed) checks against ``url``."""
    await asyncio.to_thread(workdir.mkdir, exist_ok=True)
    process = await asyncio.create_subprocess_exec(
        node,
        str(SUITE),
        "server",
        "--suite",
        "all",
        "--url",
        url,
        cwd=workdir,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await process.communicate()
    results = {}
    for line in output.decode(errors="replace").splitlines():
        match = SUMMARY.match(line.strip())
        if match:
            results[match["scenario"]] = (int(match["passed"]), int(match["failed"]))
    assert results, output.decode(errors="replace")[-3000:]
    return results


async def test_every_server_scenario_passes_through_the_proxy_as_it_does_directly(
    node: str, serve: Any, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """Directly, through a stdio upstream and through ``--upstream-url``: the same results."""
    direct_url = await serve([*EVERYTHING, "{port}"])
    proxy = [
        sys.executable,
        "-m",
        "canon.cli",
        "mcp-proxy",
        f"--redis-url={redis_url}",
        f"--namespace={namespace}",
        "--http",
        "--port={port}",
    ]
    stdio_url = await serve([*proxy, "--", *EVERYTHING])
    http_url = await serve([*proxy, f"--upstream-url={direct_url}"])

    direct = await run_suite(node, direct_url, tmp_path / "direct")
    assert len(direct) >= 30 and all(failed == 0 for _, failed in direct.values()), direct
    for mode, url in (("stdio upstream", stdio_url), ("--upstream-url", http_url)):
        proxied = await run_suite(node, url, tmp_path / mode.strip("-").replace(" ", "-"))
        differing = {
            scenario: (direct.get(scenario), proxied.get(scenario))
            for scenario in direct.keys() | proxied.keys()
            if direct.get(scenario) != proxied.get(scenario)
        }
        assert not differing, f"through the proxy ({mode}): {differing}"
