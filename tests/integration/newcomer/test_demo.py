"""The main job: ``canon demo`` on a fresh machine with no Redis configured, and where it
leaves an operator: the commands it prints work against the data it kept."""

from __future__ import annotations

import io
import json
import os
import pathlib
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from rich.console import Console

from canon.cli import build_parser
from canon.commands.demo import FACTS_NOTE, REFUSALS_NOTE, configure_demo_logging, run_demo
from canon.demo.look import canon_command

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _processes_in(directory: pathlib.Path, *, below: bool = False) -> list[int]:
    """Pids whose working directory is ``directory`` (redis-server chdirs into --dir), or
    with ``below`` any folder under it; never this process."""
    found = []
    root = directory.resolve()
    for proc in pathlib.Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                cwd = pathlib.Path(os.readlink(proc / "cwd"))
            except OSError:
                continue
            if cwd == root or (below and root in cwd.parents):
                found.append(int(proc.name))
    return found


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["COLUMNS"] = "160"
    return env


def _canon(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "canon.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
        check=False,
    )


@pytest.fixture
def serve_data(tmp_path: pathlib.Path) -> Iterator[Any]:
    """Starts ``canon serve --data-dir DIR``; returns the embedded URL it logs. Each
    process is terminated and reaped by pid at the end."""
    processes: list[subprocess.Popen[str]] = []

    def start(data_dir: pathlib.Path) -> str:
        log_path = tmp_path / f"serve-{len(processes)}.log"
        with log_path.open("w") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "canon.cli", "serve", f"--data-dir={data_dir}", "--port=0"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=_env(),
                text=True,
            )
        processes.append(process)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert process.poll() is None, log_path.read_text()
            for line in log_path.read_text().splitlines():
                event = json.loads(line) if line.startswith("{") else {}
                if event.get("event") == "embedded_redis_started":
                    assert pathlib.Path(event["data_dir"]) == data_dir.resolve()
                    return str(event["url"])
            time.sleep(0.05)
        raise AssertionError("canon serve printed no embedded URL")

    yield start
    for process in processes:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def test_demo_runs_with_an_embedded_redis_and_stops_it(
    tmp_path: pathlib.Path, serve_data: Any
) -> None:
    """Without REDIS_URL the demo starts its own Redis (and says where), shows every table,
    exits 0, leaves no server running, and ends with commands that work: against a server
    started on the data it kept, each printed command exits 0, the failed call shows, the
    refund waiting for approval is listed and approved, and the billing run's spent budget
    shows as refusals in canon runs and in its replay."""
    data_dir = tmp_path / "data"
    result = _canon("demo", "--data-dir", str(data_dir), "--calls", "8")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    for heading in ("Runs", "Calls by outcome", "Progress views", "receipt of", "replay of"):
        assert heading in out, heading
    for code in ("RUN_MISMATCH", "DUPLICATE_TOOL_CALL", "EXECUTION_FAILED", "RESULT_TOO_LARGE"):
        assert code in out, code
    assert "NO_EVIDENCE" in out and "RUN_BUDGET_EXHAUSTED" in out
    assert "INTACT" in out
    assert "Redis: an embedded server at redis://127.0.0.1:" in out
    assert f"(data in {data_dir.resolve()})" in out
    assert "token=demo-secret" not in out + result.stderr  # the failing tool's message
    assert "Refunds are issued" not in out  # raw bodies stay in the record
    assert any(data_dir.glob("appendonly*")), "the embedded server kept no append-only file"
    assert _processes_in(data_dir) == []

    block = out.split("look at what the demo wrote", 1)[1]
    canon = canon_command()  # this interpreter's canon, as the demo's process finds it too
    assert f"{canon} serve --data-dir {data_dir.resolve()}" in block
    commands = [line.strip() for line in block.splitlines() if line.startswith(f"  {canon} ")]
    commands = [command for command in commands if not command.startswith(f"{canon} serve")]
    assert [command.split()[1] for command in commands] == [
        "replay",
        "replay",
        "replay",
        "approvals",
        "approve",
        "runs",
        "export",
        "status",
        "verify",
    ]
    billing = commands[2].split()[2]
    assert billing.startswith("billing-")
    url = serve_data(data_dir)
    shown_by: dict[str, str] = {}
    for command in commands:
        argv = shlex.split(command)[1:]
        assert argv.count("URL") == 1 and argv[argv.index("--namespace") + 1] == "demo"
        shown = _canon(*[url if arg == "URL" else arg for arg in argv])
        assert shown.returncode == 0, (command, shown.stdout[-2000:], shown.stderr[-2000:])
        shown_by[" ".join(argv[:2])] = shown.stdout
        if len(argv) > 2 and argv[0] == "replay" and argv[2].startswith("call_"):
            assert "error EXECUTION_FAILED" in shown.stdout and "INTACT" in shown.stdout
    assert "call_" in shown_by["approvals --redis-url"]  # the waiting refund is listed
    assert " approved by " in next(
        out for cmd, out in shown_by.items() if cmd.startswith("approve ")
    )
    runs = shown_by["runs --redis-url"]
    assert "refused" in runs
    assert re.search(rf"refused in {billing}: .*RUN_BUDGET_EXHAUSTED \d+", runs), runs
    replayed = shown_by[f"replay {billing}"]
    assert re.search(r"refused before any record: \d+ \(.*RUN_BUDGET_EXHAUSTED \d+", replayed)
    assert "RUN_BUDGET_EXHAUSTED" in replayed.split("the latest", 1)[1], replayed


def test_a_taken_redis_port_is_one_line_and_exit_2() -> None:
    """--redis-port naming a port in use stops before anything starts, saying which port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _canon("workers", "--burst", "--redis-port", str(port))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"canon: error: cannot start the embedded Redis on port {port}: it is in use"
    )


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Put back the structlog configuration the demo replaces."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


async def test_demo_logs_above_its_bar_and_fits_80_columns(
    redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str], restore_logging: None
) -> None:
    """On a terminal the expected failures' log lines go through the bar's console (printed
    above it, never over it), the tables explain refusals and facts, and at 80 columns no
    header or cell is cut."""
    args = build_parser().parse_args(
        ["demo", f"--redis-url={redis_url}", f"--namespace={namespace}", "--calls=4"]
    )
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=80, color_system=None)
    configure_demo_logging()
    where = await run_demo(args, console)
    text = ANSI.sub("", buffer.getvalue())
    err = capsys.readouterr().err
    assert "invocation_finished" in text and "invocation_finished" not in err
    flat = " ".join(text.split())
    assert " ".join(REFUSALS_NOTE.split()) in flat and " ".join(FACTS_NOTE.split()) in flat
    assert "…" not in text
    for header in (
        "budget",
        "used",
        "READY",
        "ERROR",
        "waiting",
        "in flight",
        "refused",
        "evidence status / error code",
    ):
        assert header in text
    # The refund waiting for an operator is counted as waiting, not as a call in flight.
    assert re.search(r"│\s+\d+/\d+\s+│\s+\d+\s+│\s+\d+\s+│\s+1\s+│\s+0\s+│", text), text
    for header in ("invocations", "by status", "by evidence", "facts", "state after"):
        assert header in text
    assert where.namespace == namespace and where.failed_call is not None
    assert where.run_id in where.runs and where.embedded_url is None
