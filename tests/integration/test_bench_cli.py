"""``scripts/bench.py --quick`` (``canon bench``) runs end to end and reports every section.

This proves the benchmark works, not how fast anything is: no timing is asserted.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
from typing import Any

import pytest

from eventstore.embedded import ServerBinary

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODES = ("floor", "ceiling", "writer", "boundary")
TASKS = ("1", "16", "64")
SPREAD = {"min", "median", "max"}


def _run_quick(binary: ServerBinary, report: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """Run the quick benchmark on private servers; SIGTERM (which stops them) on overrun."""
    env = {name: value for name, value in os.environ.items() if name != "REDIS_URL"}
    command = [
        sys.executable,
        str(ROOT / "scripts" / "bench.py"),
        "--quick",
        "--json",
        str(report),
        "--redis-server",
        binary.path,
    ]
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=100)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=15)
            pytest.fail("the quick benchmark took longer than 100 s")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def quick_runs() -> dict[str, tuple[subprocess.CompletedProcess[str], dict[str, Any]]]:
    """Reports of quick runs, one per binary, shared by this module's tests."""
    return {}


@pytest.fixture
def quick(
    server_binary: ServerBinary,
    tmp_path: pathlib.Path,
    quick_runs: dict[str, tuple[subprocess.CompletedProcess[str], dict[str, Any]]],
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """The quick run on this binary (run once) and its parsed JSON report."""
    if server_binary.label not in quick_runs:
        path = tmp_path / "bench.json"
        result = _run_quick(server_binary, path)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        quick_runs[server_binary.label] = (result, json.loads(path.read_text()))
    return quick_runs[server_binary.label]


def test_quick_report_has_every_throughput_cell(quick: tuple[Any, dict[str, Any]]) -> None:
    """Each mode at 1, 16 and 64 tasks has throughput, latency and CPU spreads, and ratios."""
    _, report = quick
    assert report["schema"] == "canon.bench.v1" and report["quick"] is True
    assert report["environment"]["server"] == "embedded"
    for mode in MODES:
        for tasks in TASKS:
            cell = report["throughput"][mode][tasks]
            for metric in ("invocations_per_s", "p50_ms", "p99_ms", "client_cpu_us"):
                assert set(cell[metric]) == SPREAD
            assert cell["invocations_per_s"]["min"] > 0
    for mode in MODES[1:]:
        assert set(report["ratios"][mode]) == set(TASKS)
    assert report["batching"]["round_trips"] < report["batching"]["calls"]


def test_quick_report_measures_memory_under_both_settings(
    quick: tuple[Any, dict[str, Any]],
) -> None:
    """Memory is measured at 64 B and 4 KiB raw under recommended and default settings."""
    _, report = quick
    memory = report["memory"]
    assert set(memory) == {"recommended", "defaults"}
    for name, section in memory.items():
        assert [point["raw_bytes"] for point in section["points"]] == [64, 4096]
        assert section["fixed_bytes"] > 0 and section["payload_ratio"] > 0
        encodings = {point["record_encoding"] for point in section["points"]}
        assert encodings == ({"hashtable"} if name == "defaults" else encodings - {"hashtable"})
    assert memory["recommended"]["warnings"] == []
    assert len(memory["defaults"]["warnings"]) == 2


def test_quick_report_has_scale_lag_and_goals(quick: tuple[Any, dict[str, Any]]) -> None:
    """Scale points, projection lag and all eight goal lines are present and printed."""
    result, report = quick
    assert [point["stored"] for point in report["scale"]["points"]] == [2_000, 10_000]
    lag = report["projection_lag"]
    assert lag["measured"] is True and lag["invocations"] > 0
    assert 0 <= lag["p50_ms"] <= lag["p99_ms"] <= lag["max_ms"]
    goals = report["goals"]
    assert len(goals) == 8
    assert {goal["status"] for goal in goals} <= {"PASS", "SHORT", "N/A"}
    assert [goal["status"] for goal in goals[6:]] == ["N/A", "N/A"]
    for goal in goals:
        assert f"{goal['status']:<5} {goal['goal']}" in result.stdout


def test_quick_run_names_its_private_servers(quick: tuple[Any, dict[str, Any]]) -> None:
    """Each private server it starts is announced with its loopback URL and data folder."""
    result, _ = quick
    lines = [line for line in result.stdout.splitlines() if line.startswith("private Redis at")]
    assert lines and all("redis://127.0.0.1:" in line and "(data in /" in line for line in lines)
