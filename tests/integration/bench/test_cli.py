"""``scripts/bench.py --quick`` (``canon bench``) runs end to end and reports every section.

This proves the benchmark works, not how fast anything is: no timing is asserted, and
no goal's status is (most are expected to be SHORT on some runs).
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
from rich.console import Console

from canon.bench import evaluate_goals, goal_lines, render
from canon.bench.modes import MODES as BENCH_MODES
from canon.bench.modes import RATIO_METRICS, REFERENCES
from canon.bench.report import GOALS
from eventstore.server.embedded import ServerBinary

ROOT = pathlib.Path(__file__).resolve().parents[3]
MODES = tuple(mode.key for mode in BENCH_MODES)
TASKS = ("1", "16", "64")
SPREAD = {"min", "median", "max"}
DURABILITY = ("everysec", "always")


#: Longest a quick run may take before it counts as hung: about 50 s on a quiet machine,
#: 140 s seen beside the soak and the conformance suite on two busy cores.
QUICK_TIMEOUT_S = 300

#: The test that runs a binary's quick run (a fixture) waits for it: the hang guard above
#: ends it first.
pytestmark = pytest.mark.timeout(QUICK_TIMEOUT_S + 60)


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
            stdout, stderr = process.communicate(timeout=QUICK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=15)
            pytest.fail(f"the quick benchmark took longer than {QUICK_TIMEOUT_S} s")
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


def _check_throughput(section: dict[str, Any]) -> None:
    """Every mode at 1, 16 and 64 tasks has its spreads, and every ratio is there."""
    for mode in MODES:
        for tasks in TASKS:
            cell = section["throughput"][mode][tasks]
            for metric in ("invocations_per_s", "p50_ms", "p99_ms", "client_cpu_us"):
                assert set(cell[metric]) == SPREAD
            assert cell["invocations_per_s"]["min"] > 0
    assert set(section["ratios"]) == set(REFERENCES)
    for reference, by_mode in section["ratios"].items():
        assert set(by_mode) == set(MODES) - {reference}
        for by_tasks in by_mode.values():
            assert set(by_tasks) == set(TASKS)
            assert all(set(cell) == set(RATIO_METRICS) for cell in by_tasks.values())


def test_quick_report_has_every_throughput_cell(quick: tuple[Any, dict[str, Any]]) -> None:
    """Each mode at 1, 16 and 64 tasks has throughput, latency and CPU spreads, and ratios."""
    _, report = quick
    assert report["schema"] == "canon.bench.v2" and report["quick"] is True
    assert report["environment"]["server"] == "embedded"
    assert report["persistence"]["appendonly"] == "no"
    _check_throughput(report)
    assert report["batching"]["round_trips"] < report["batching"]["calls"]


def test_quick_report_has_both_durability_columns(quick: tuple[Any, dict[str, Any]]) -> None:
    """The throughput section ran again with appendonly yes, appendfsync everysec / always.

    Redis's automatic rewrites are off there: the benchmark rewrites the file once after
    each repeat, outside every timed window, and the server forked for nothing else.
    """
    result, report = quick
    durability = report["durability"]
    assert durability["measured"] is True
    for name in DURABILITY:
        assert durability[name]["settings"] == {
            "appendonly": "yes",
            "appendfsync": name,
            "auto-aof-rewrite-percentage": "0",
        }
        assert durability[name]["forks"] == report["config"]["durability"]["repeats"]
        _check_throughput(durability[name])
        assert f"Throughput, appendonly yes, appendfsync {name}" in result.stdout
    assert "Throughput, no persistence (appendonly no)" in result.stdout


def test_quick_report_has_scale_out_on_a_cluster(
    quick: tuple[Any, dict[str, Any]], server_binary: ServerBinary
) -> None:
    """On Redis 7 the writer and boundary ran on 3 masters and one server, with CPU shares."""
    result, report = quick
    scale_out = report["scale_out"]
    if server_binary.version < (7, 0, 0):
        assert scale_out["measured"] is False and "Redis 7" in scale_out["reason"]
        assert "Scale-out: not measured" in result.stdout
        return
    assert scale_out["measured"] is True and scale_out["masters"] == 3
    assert set(scale_out["modes"]) == {"writer", "boundary"}
    for point in scale_out["modes"].values():
        for system, masters in (("single", 1), ("cluster", 3)):
            figures = point[system]
            assert figures["invocations_per_s"]["min"] > 0
            assert len(figures["master_shares"]) == masters
            assert sum(figures["master_shares"]) == pytest.approx(1, abs=0.01)
            assert figures["implied_capacity_per_s"] > 0
        assert set(point["cluster_x_single"]) == {"invocations_per_s", "server_cpu_us"}
    assert "Scale-out at 64 tasks: a 3-master cluster" in result.stdout
    assert "implied by the CPU, not measured" in result.stdout
    # The capacity curve: one server, 3 masters, and 6 only in a full run.
    one, three, six = scale_out["curve"]
    assert (one["masters"], one["x_single"]) == (1, 1.0)
    assert three["masters"] == 3 and three["measured"] and three["x_single"] > 0
    assert three["target_x_single"] == pytest.approx(2.7)
    assert six == {"masters": 6, "measured": False, "reason": six["reason"]}
    assert "full run only" in six["reason"]
    assert "Capacity curve (writer, busiest master" in result.stdout
    goals = {goal["goal"]: goal for goal in report["goals"]}
    assert goals["cluster: 3 masters' implied capacity / (0.9 x 3 x one server) >= 1.0"][
        "measured"
    ] == pytest.approx(three["x_single"] / 2.7, abs=0.01)
    assert (
        goals["cluster: 6 masters' implied capacity / (0.9 x 6 x one server) >= 1.0"]["status"]
        == "N/A"
    )


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
    """Scale points, projection lag, the console's pages and every goal line are present
    and printed."""
    result, report = quick
    assert [point["stored"] for point in report["scale"]["points"]] == [2_000, 10_000]
    lag = report["projection_lag"]
    assert lag["measured"] is True and lag["invocations"] > 0
    assert 0 <= lag["p50_ms"] <= lag["p99_ms"] <= lag["max_ms"]
    goals = report["goals"]
    assert [goal["goal"] for goal in goals] == [goal.name for goal in GOALS]
    assert {goal["status"] for goal in goals} <= {"PASS", "SHORT", "N/A"}
    # Only the 1M-stored goals and the 6-master capacity need a full run; the cluster's
    # goals need Redis 7.
    clustered = report["scale_out"]["measured"]
    unmeasured = [goal["goal"] for goal in goals if goal["status"] == "N/A"]
    assert unmeasured == [
        goal["goal"]
        for goal in goals
        if goal["goal"].startswith("1M stored")
        or goal["goal"].startswith("cluster: 6 masters")
        or (goal["goal"].startswith("cluster:") and not clustered)
    ]
    assert len(unmeasured) == (3 if clustered else 7)
    console = report["console"]
    assert console["measured"] is True and console["calls"] == 3_000
    for page in console["pages"].values():
        assert 0 < page["median_ms"] <= page["max_ms"] and page["bytes"] > 0
    for goal in goals:
        assert f"{goal['status']:<5} {goal['goal']}" in result.stdout
    assert set(report["elapsed_s"]) >= {"throughput", "durability", "scale_out", "total"}


def test_quick_report_shows_one_call_beside_the_sync_floor(
    quick: tuple[Any, dict[str, Any]],
) -> None:
    """At 1 task the report gives each store mode's wall and client CPU per call beside the
    minimal floor, sync, of the same run, and how many times a call waited for Redis: twice
    for the boundary, three times for the writer's three appends and for the floor."""
    result, report = quick
    rows = report["one_call"]
    assert set(rows) == {"boundary", "boundary_def_tool", "sync_boundary", "writer", "minimal_sync"}
    for mode, row in rows.items():
        assert row["wall_us"] > 0 and row["client_cpu_us"] > 0
        if mode != "minimal_sync":
            assert row["x_floor_wall"] > 0 and row["x_floor_client_cpu"] > 0
    # Counted over a window that calls in flight straddle: within a hundredth of a wait.
    for mode in ("boundary", "boundary_def_tool", "sync_boundary"):
        assert rows[mode]["waits"] == pytest.approx(2, abs=0.05)
    assert rows["writer"]["waits"] == pytest.approx(3, abs=0.05)
    assert rows["minimal_sync"]["waits"] == 3
    assert "One call at a time (1 task)" in result.stdout


def test_a_report_without_durability_or_scale_out_says_so(
    quick: tuple[Any, dict[str, Any]],
) -> None:
    """As with --redis-url: the printed report names both sections as not measured."""
    _, report = quick
    given = {
        **report,
        "durability": {"measured": False, "reason": "--redis-url given"},
        "scale_out": {"measured": False, "reason": "skipped: --redis-url given"},
    }
    console = Console(record=True, width=160)
    render({**given, "goals": evaluate_goals(given)}, console)
    text = console.export_text()
    assert "Durability columns (everysec, always): not measured: --redis-url given" in text
    assert "Scale-out: not measured: skipped: --redis-url given" in text
    lines = goal_lines(evaluate_goals(given))
    assert sum("durability columns not measured" in line for line in lines) == 2


def test_quick_run_names_its_private_servers(quick: tuple[Any, dict[str, Any]]) -> None:
    """Each private server it starts is announced with its loopback URL and data folder."""
    result, _ = quick
    lines = [line for line in result.stdout.splitlines() if line.startswith("private Redis at")]
    assert lines and all("redis://127.0.0.1:" in line and "(data in /" in line for line in lines)


def test_quick_report_measures_encryption_beside_plain(
    quick: tuple[Any, dict[str, Any]],
) -> None:
    """Client CPU per invocation with payloads sealed, beside plain, at 1 and 16 in flight,
    each judged by its goal."""
    result, report = quick
    section = report["encryption"]
    assert section["measured"] is True, section
    for tasks in ("1", "16"):
        cell = section["in_flight"][tasks]
        assert cell["plain_client_cpu_us"]["median"] > 0
        assert cell["sealed_client_cpu_us"]["median"] > 0
        assert cell["ratio"]["median"] > 0
    goals = {goal["goal"]: goal for goal in report["goals"]}
    for tasks in ("1 task", "16 tasks"):
        name = f"encryption: client CPU per invocation at {tasks} <= 1.1 x plain (1 KiB payloads)"
        assert goals[name]["status"] in {"PASS", "SHORT"}
    assert "Payloads encrypted at rest" in result.stdout
