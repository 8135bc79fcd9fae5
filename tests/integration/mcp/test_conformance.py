"""The official MCP conformance suite passes through ``canon mcp-proxy`` as it passes directly.

The suite's server scenarios (``@modelcontextprotocol/conformance``) run against the
project's stand-in server (tests/support/mcp_everything_server.py, written from the
scenarios' published expectations) over streamable HTTP, against ``canon mcp-proxy
--http`` in front of the same server started on stdio, and in front of it reached with
``--upstream-url``; the three targets run at once. Runs: release 0.2.0-alpha.12 with the
2025-11-25 and the 2026-07-28 requirement sets (each scenario at its revision's wire: the
handshake, then per-request ``_meta``) and ``--suite all``, and release 0.1.16 with
``--suite all`` (the stdio mode runs the requirement sets only: ``RUNS`` says why). Every
scored scenario must pass directly, and every mode must report exactly what the direct run
reports, but for the tasks extension (not scored: optional by definition), which the
stand-in does not implement. Needs Node 22 and the suites in .conformance/
(``scripts/conformance.sh`` installs them); without them the test is skipped.

The client scenarios (the suite plays the server; OAuth's left out) run with the host of
tests/support/mcp_conformance_client.py connecting directly, then through ``canon mcp-proxy
--upstream-url`` (the proxy is then the client the suite judges): the same checks pass
and fail. Cost on this machine: about 90 s for the server scenarios, 85 s for the client
ones.

Run alone: ``pytest tests/integration/mcp/test_conformance.py -p no:randomly``.
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

ROOT = Path(__file__).parents[3]
LOCAL = ROOT / ".conformance"
NEXT = LOCAL / "node_modules" / "conformance-next" / "dist" / "index.js"
OLD = LOCAL / "node_modules" / "conformance-0116" / "dist" / "index.js"
#: (suite, its options, the proxy modes it runs through) of each run; the direct run and
#: its proxied runs go at once. Through a stdio upstream every 2025-era session starts a
#: Python child (about a second of CPU each), so that mode runs the two requirement sets,
#: which hold every scored scenario at both wires; ``--upstream-url`` runs everything.
BOTH = ("stdio upstream", "--upstream-url")
RUNS = [
    (NEXT, ("--requirements", "2025-11-25"), BOTH),
    (NEXT, ("--requirements", "2026-07-28"), BOTH),
    (NEXT, ("--suite", "all"), ("--upstream-url",)),
    (OLD, ("--suite", "all"), ("--upstream-url",)),
]
# The requirement-set runs come first: they name the scenarios that are never scored.
#: Scenarios of the tasks extension (io.modelcontextprotocol/tasks): never scored, and not
#: implemented by the stand-in, so directly and through the proxy they fail differently.
UNIMPLEMENTED_EXTENSION = re.compile(r"^tasks-")
#: A requirement set's line for a scenario it runs without scoring it.
NOT_SCORED = re.compile(r"^\s+[✓✗] ([\w/-]+) \((?:extension|pending|added-after-release)\)", re.M)
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
    if found is None or not (NEXT.exists() and OLD.exists()):
        pytest.skip("no Node 22 or MCP conformance suites: run scripts/conformance.sh")
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


async def run_suite(
    node: str, suite: Path, options: tuple[str, ...], url: str, workdir: Path
) -> tuple[dict[str, tuple[int, int]], tuple[set[str], set[str]]]:
    """Each server scenario's (passed, failed) checks against ``url``; the scenarios that
    failed, and those the run says it does not score (extension, pending, added later)."""
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    process = await asyncio.create_subprocess_exec(
        node,
        str(suite),
        "server",
        *options,
        "--url",
        url,
        cwd=workdir,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await process.communicate()
    text = output.decode(errors="replace")
    results = {}
    for line in text.splitlines():
        match = SUMMARY.match(line.strip())
        if match:
            results[match["scenario"]] = (int(match["passed"]), int(match["failed"]))
    assert results, text[-3000:]
    not_scored = set(NOT_SCORED.findall(text))
    failing = {name for name, (_, failed) in results.items() if failed}
    return results, (failing, not_scored)


async def test_every_server_scenario_passes_through_the_proxy_as_it_does_directly(
    node: str, serve: Any, tmp_path: Path
) -> None:
    """Directly, through a stdio upstream and through ``--upstream-url``: the same results,
    at both requirement sets, ``--suite all``, and release 0.1.16 (see ``RUNS``)."""
    direct_url = await serve([*EVERYTHING, "{port}"])
    # Each proxy records into the embedded Redis it starts itself, as on a desktop (so
    # the test does not depend on the suite's Redis backends).
    proxy = [sys.executable, "-m", "canon.cli", "mcp-proxy", "--http", "--port={port}"]
    modes = {
        "direct": direct_url,
        "stdio upstream": await serve(
            [*proxy, f"--data-dir={tmp_path / 'data-stdio'}", "--", *EVERYTHING]
        ),
        "--upstream-url": await serve(
            [*proxy, f"--data-dir={tmp_path / 'data-url'}", f"--upstream-url={direct_url}"]
        ),
    }
    not_scored: set[str] = set()
    for number, (suite, options, through_modes) in enumerate(RUNS):
        targets = {mode: modes[mode] for mode in ("direct", *through_modes)}
        runs = await asyncio.gather(
            *(
                run_suite(node, suite, options, url, tmp_path / f"run-{number}" / mode.strip("-"))
                for mode, url in targets.items()
            )
        )
        (direct, (failing, unscored)), *proxied = runs
        not_scored |= unscored
        label = f"{suite.parent.parent.name} {' '.join(options)}"
        assert len(direct) >= 30 and not failing - not_scored, (label, failing - not_scored)
        for mode, (through, _) in zip(through_modes, proxied, strict=True):
            differing = {
                scenario: (direct.get(scenario), through.get(scenario))
                for scenario in direct.keys() | through.keys()
                if direct.get(scenario) != through.get(scenario)
                and not UNIMPLEMENTED_EXTENSION.match(scenario)
            }
            assert not differing, f"{label} through the proxy ({mode}): {differing}"


#: Client scenarios (the suite plays the server) of each wire, but OAuth's: the proxy
#: reaches an upstream with the headers it is given and plays no authorization flow.
CLIENT_SCENARIOS = {
    "2026-07-28": (
        "tools_call",
        "request-metadata",
        "sep-2322-client-request-state",
        "http-standard-headers",
        "http-custom-headers",
        "http-invalid-tool-headers",
        "json-schema-ref-no-deref",
        "json-schema-2020-12-preservation",
    ),
    "2025-11-25": (
        "initialize",
        "tools_call",
        "elicitation-sep1034-client-defaults",
        "sse-retry",
        "json-schema-2020-12-preservation",
    ),
}
CLIENT = ROOT / "tests" / "support" / "mcp_conformance_client.py"
#: The suite's closing line of one client scenario: ``Passed: 3/3, 0 failed, 0 warnings``.
CLIENT_SUMMARY = re.compile(r"Passed: (\d+)/(\d+), (\d+) failed")


async def run_client_scenario(
    node: str, scenario: str, version: str, through_proxy: bool, workdir: Path
) -> tuple[int, int, int]:
    """(passed, checks, failed) of one client scenario, the host direct or through the proxy."""
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    command = f"{sys.executable} {CLIENT}" + (" --through-proxy" if through_proxy else "")
    process = await asyncio.create_subprocess_exec(
        node,
        str(NEXT),
        "client",
        "--command",
        command,
        "--scenario",
        scenario,
        "--spec-version",
        version,
        cwd=workdir,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await process.communicate()
    text = output.decode(errors="replace")
    found = CLIENT_SUMMARY.findall(text)
    assert found, text[-3000:]
    passed, checks, failed = found[-1]
    return int(passed), int(checks), int(failed)


async def test_every_client_scenario_gives_the_same_through_the_proxy_as_directly(
    node: str, tmp_path: Path
) -> None:
    """The proxy as the HTTP client the suite's servers judge (``--upstream-url``, the host
    on its stdio): each scenario's checks come out as with the host connecting directly."""
    limit = asyncio.Semaphore(4)

    async def both(version: str, scenario: str) -> tuple[str, Any, Any]:
        async with limit:
            folder = tmp_path / version / scenario
            direct, proxied = await asyncio.gather(
                run_client_scenario(node, scenario, version, False, folder / "direct"),
                run_client_scenario(node, scenario, version, True, folder / "proxy"),
            )
        return f"{version} {scenario}", direct, proxied

    outcomes = await asyncio.gather(
        *(both(version, name) for version, names in CLIENT_SCENARIOS.items() for name in names)
    )
    for label, direct, proxied in outcomes:
        assert direct[0] > 0, (label, direct)
        assert proxied == direct, (label, direct, proxied)
