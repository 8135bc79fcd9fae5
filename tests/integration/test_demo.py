"""The main job: ``canon demo`` on a fresh machine with no Redis configured."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys


def _processes_in(directory: pathlib.Path) -> list[int]:
    """Pids whose working directory is ``directory`` (redis-server chdirs into --dir)."""
    found = []
    for proc in pathlib.Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if pathlib.Path(os.readlink(proc / "cwd")) == directory.resolve():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def test_demo_runs_with_an_embedded_redis_and_stops_it(tmp_path: pathlib.Path):
    """Without REDIS_URL the demo starts its own Redis, shows every table, exits 0 and
    leaves no server running."""
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["COLUMNS"] = "160"
    data_dir = tmp_path / "data"
    result = subprocess.run(
        [sys.executable, "-m", "canon.cli", "demo", "--data-dir", str(data_dir), "--calls", "8"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    for heading in ("Runs", "Calls by outcome", "Progress views", "receipt of", "replay of"):
        assert heading in out, heading
    for code in ("RUN_MISMATCH", "DUPLICATE_TOOL_CALL", "EXECUTION_FAILED", "RESULT_TOO_LARGE"):
        assert code in out, code
    assert "NO_EVIDENCE" in out and "RUN_BUDGET_EXHAUSTED" in out
    assert "INTACT" in out
    assert "token=demo-secret" not in out + result.stderr  # the failing tool's message
    assert "Refunds are issued" not in out  # raw bodies stay in the record
    assert any(data_dir.glob("appendonly*")), "the embedded server kept no append-only file"
    assert _processes_in(data_dir) == []
