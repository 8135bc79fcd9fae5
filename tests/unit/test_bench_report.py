"""The benchmark's goals are judged from the JSON report, at the issue's thresholds."""

from __future__ import annotations

from typing import Any

import pytest

from canon.bench import evaluate_goals, goal_lines
from canon.bench.report import spread


def _ratios(value: float) -> dict[str, float]:
    return {"min": value, "median": value, "max": value}


def _report(
    *,
    writer: float = 1.5,
    boundary: float = 1.1,
    p99: float = 1.2,
    fixed: float = 1800.0,
    payload: float = 1.1,
    lag: dict[str, Any] | None = None,
    scale: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "ratios": {
            "writer": {
                "64": {"invocations_per_s": _ratios(writer), "p99_ms": _ratios(1.0)},
                "16": {"invocations_per_s": _ratios(1.0), "p99_ms": _ratios(p99)},
            },
            "boundary": {"64": {"invocations_per_s": _ratios(boundary), "p99_ms": _ratios(1.0)}},
        },
        "memory": {"recommended": {"fixed_bytes": fixed, "payload_ratio": payload}},
        "projection_lag": lag or {"measured": True, "p99_ms": 40.0},
        "scale": {"points": scale or []},
    }


def _status(report: dict[str, Any]) -> list[str]:
    return [goal["status"] for goal in evaluate_goals(report)]


def test_a_report_meeting_every_goal_passes_all_but_the_unmeasured_scale() -> None:
    """Goals at or inside their thresholds PASS; 1M stored is N/A without its run."""
    assert _status(_report()) == ["PASS"] * 6 + ["N/A", "N/A"]


@pytest.mark.parametrize(
    ("field", "value", "index"),
    [
        ("writer", 1.29, 0),
        ("boundary", 0.99, 1),
        ("p99", 2.01, 2),
        ("fixed", 2049.0, 3),
        ("payload", 1.41, 4),
    ],
)
def test_each_goal_is_short_just_past_its_threshold(field: str, value: float, index: int) -> None:
    """Just past its threshold a goal is SHORT and the others still PASS."""
    statuses = _status(_report(**{field: value}))
    assert statuses[index] == "SHORT"
    assert statuses[:index] + statuses[index + 1 : 6] == ["PASS"] * 5


def test_thresholds_themselves_pass() -> None:
    """Exactly 1.3x, 1.0x, 2x, 2 KiB and 1.4x meet their goals."""
    report = _report(writer=1.3, boundary=1.0, p99=2.0, fixed=2048.0, payload=1.4)
    assert _status(report)[:5] == ["PASS"] * 5


def test_unmeasured_lag_is_not_applicable_with_its_reason() -> None:
    """Without projections the lag goal is N/A and says why."""
    report = _report(lag={"measured": False, "reason": "projections not available"})
    goal = evaluate_goals(report)[5]
    assert goal["status"] == "N/A"
    assert "projections not available" in goal_lines([goal])[0]


def _point(stored: int, cpu: float, size: float) -> dict[str, Any]:
    return {
        "stored": stored,
        "invocations_per_s": 1000.0,
        "server_cpu_us": cpu,
        "bytes_per_invocation": size,
    }


def test_scale_goals_compare_1m_with_10k_within_15_percent() -> None:
    """With 10k and 1M stored, Redis CPU per invocation and bytes are judged within 15 %."""
    points = [_point(10_000, 100.0, 5000.0), _point(1_000_000, 114.0, 5800.0)]
    assert _status(_report(scale=points))[6:] == ["PASS", "SHORT"]
    points = [_point(10_000, 100.0, 5000.0), _point(1_000_000, 116.0, 4300.0)]
    assert _status(_report(scale=points))[6:] == ["SHORT", "PASS"]


def test_scale_goal_uses_the_pair_by_pair_ratio_when_the_sizes_ran_side_by_side() -> None:
    """Sizes measured side by side carry a pair-by-pair ratio; it decides, not the medians."""
    small, large = _point(10_000, 100.0, 5000.0), _point(1_000_000, 130.0, 5000.0)
    assert _status(_report(scale=[small, large]))[6] == "SHORT"
    large["server_cpu_ratio"] = 1.05
    assert _status(_report(scale=[small, large]))[6] == "PASS"
    large["server_cpu_ratio"] = 1.2
    assert _status(_report(scale=[small, large]))[6] == "SHORT"


def test_goal_lines_start_with_the_status() -> None:
    """Every printed goal line starts with PASS, SHORT or N/A and names its target."""
    lines = goal_lines(evaluate_goals(_report(writer=1.0)))
    assert lines[0].startswith("SHORT writer lifecycle at concurrency 64")
    assert "(target >= 1.3)" in lines[0]
    assert all(line.split()[0] in {"PASS", "SHORT", "N/A"} for line in lines)


def test_spread_gives_min_median_max() -> None:
    """A spread is the min, median and max of its values (zeros when there are none)."""
    assert spread([3.0, 1.0, 2.0]) == {"min": 1.0, "median": 2.0, "max": 3.0}
    assert spread([]) == {"min": 0.0, "median": 0.0, "max": 0.0}
