"""The benchmark's goals are judged from the JSON report, at the issue's thresholds."""

from __future__ import annotations

from typing import Any

import pytest

from canon.bench import BenchOptions, evaluate_goals, goal_lines
from canon.bench.report import ARCHIVE_GOALS, GOALS, spread
from canon.bench.runner import _durability, _scale_out
from canon.bench.scaleout import _curve_point
from canon.bench.timing import Sample

#: Index of each goal in GOALS (and in the printed lines).
WRITER, BOUNDARY, P99, MINIMAL, EVERYSEC, REDIS_CPU, CLIENT_CPU, ALWAYS = range(8)
FIXED, PAYLOAD, LAG, SCALE_CPU, SCALE_BYTES, CONSOLE = range(8, 14)
CLUSTER_REDIS, CLUSTER_CLIENT, CLUSTER_SHARE, CURVE_3, CURVE_6 = range(14, 19)


def _ratios(value: float) -> dict[str, float]:
    return {"min": value, "median": value, "max": value}


def _cell(
    inv: float = 1.0, p99: float = 1.0, client: float = 1.0, server: float = 1.0
) -> dict[str, Any]:
    return {
        "invocations_per_s": _ratios(inv),
        "p99_ms": _ratios(p99),
        "client_cpu_us": _ratios(client),
        "server_cpu_us": _ratios(server),
    }


def _report(
    *,
    writer: float = 1.5,
    boundary: float = 1.1,
    p99: float = 1.2,
    minimal: float = 1.6,
    everysec: float = 1.6,
    redis_cpu: float = 1.2,
    client_cpu: float = 1.4,
    always: float = 1.1,
    fixed: float = 1800.0,
    payload: float = 1.1,
    lag: dict[str, Any] | None = None,
    scale: list[dict[str, Any]] | None = None,
    console_ms: float = 80.0,
    cluster_redis: float = 1.15,
    cluster_client: float = 1.3,
    busiest_share: float = 1 / 3 + 0.05,
    x_single_3: float = 2.7,
    x_single_6: float = 5.4,
    sealed: float = 1.05,
) -> dict[str, Any]:
    def minimal_at(tasks: str, rate: float) -> dict[str, Any]:
        return {"minimal_naive": {"boundary": {tasks: _cell(inv=rate)}}}

    def site(client: float, server: float, shares: list[float]) -> dict[str, Any]:
        return {
            "client_cpu_us": _ratios(client),
            "server_cpu_us": _ratios(server),
            "master_shares": shares,
        }

    def curve(masters: int, x_single: float, loaded_cpu: float = 1.0) -> dict[str, Any]:
        return {
            "masters": masters,
            "measured": True,
            "loaded_server_cpu_x_single": loaded_cpu,
            "x_single": x_single,
            "x_single_at_split_load": round(x_single * 0.8, 2),
            "target_x_single": round(0.9 * masters, 2),
        }

    rest = (1 - busiest_share) / 2

    return {
        "ratios": {
            "script_floor": {
                "writer": {"64": _cell(inv=writer), "16": _cell(p99=p99)},
                "boundary": {"64": _cell(inv=boundary)},
            },
            "minimal_naive": {
                "boundary": {
                    "1": _cell(server=1.7),
                    "16": _cell(inv=minimal, server=redis_cpu),
                    "64": _cell(server=0.9),
                }
            },
            "minimal_sync": {"boundary": {"1": _cell(client=client_cpu)}},
        },
        "durability": {
            "measured": True,
            "everysec": {"ratios": minimal_at("16", everysec)},
            "always": {"ratios": minimal_at("64", always)},
        },
        "memory": {"recommended": {"fixed_bytes": fixed, "payload_ratio": payload}},
        "projection_lag": lag or {"measured": True, "p99_ms": 40.0},
        "scale": {"points": scale or []},
        "scale_out": {
            "measured": True,
            "masters": 3,
            "modes": {
                "writer": {
                    "single": site(200.0, 100.0, [1.0]),
                    # With the load spread, Redis CPU reads higher than with one master
                    # loaded at a time (the goal's figure, in the curve).
                    "cluster": site(200.0 * cluster_client, 130.0, [busiest_share, rest, rest]),
                }
            },
            "curve": [
                curve(1, 1.0),
                curve(3, x_single_3, loaded_cpu=cluster_redis),
                curve(6, x_single_6),
            ],
        },
        "console": {
            "measured": True,
            "pages": {
                "runs": {"median_ms": 5.0, "bytes": 9_000},
                "run page": {"median_ms": console_ms, "bytes": 97_000},
            },
        },
        "encryption": {
            "measured": True,
            "in_flight": {
                tasks: {
                    "plain_client_cpu_us": {"median": 400.0},
                    "sealed_client_cpu_us": {"median": 400.0 * sealed},
                    "ratio": {"median": sealed},
                }
                for tasks in ("1", "16")
            },
        },
    }


def _status(report: dict[str, Any]) -> list[str]:
    return [goal["status"] for goal in evaluate_goals(report)]


def test_a_report_meeting_every_goal_passes_all_but_the_unmeasured_scale() -> None:
    """Goals at or inside their thresholds PASS; 1M stored is N/A without its run."""
    assert _status(_report()) == ["PASS"] * 11 + ["N/A", "N/A", "PASS"] + ["PASS"] * 7


def test_the_encryption_goals_judge_sealed_beside_plain_client_cpu() -> None:
    """1.1 x plain passes, just past it is SHORT, at 1 and at 16 in flight; the line gives
    both figures; without the section both goals are N/A with the reason."""
    assert _status(_report(sealed=1.1))[-2:] == ["PASS", "PASS"]
    goals = evaluate_goals(_report(sealed=1.11))
    assert [goal["status"] for goal in goals[-2:]] == ["SHORT", "SHORT"]
    assert goal_lines(goals)[-1].endswith("- 444 us beside 400 us plain")
    report = _report()
    report["encryption"] = {"measured": False, "reason": "failed: TimeoutError"}
    last = evaluate_goals(report)[-2:]
    assert [goal["status"] for goal in last] == ["N/A", "N/A"]
    assert "TimeoutError" in goal_lines(last)[0]


def test_the_console_goal_judges_the_slowest_page_and_names_it() -> None:
    """The slowest console page's median decides (200 ms passes, 201 does not); the line
    names that page and its size; without the section the goal is N/A with the reason."""
    assert _status(_report(console_ms=200.0))[CONSOLE] == "PASS"
    goals = evaluate_goals(_report(console_ms=201.0))
    assert goals[CONSOLE]["status"] == "SHORT"
    assert goal_lines(goals)[CONSOLE].endswith("- run page (97,000 bytes)")
    report = _report()
    report["console"] = {"measured": False, "reason": "failed: ConnectionError"}
    goal = evaluate_goals(report)[CONSOLE]
    assert goal["status"] == "N/A" and "ConnectionError" in goal_lines([goal])[0]


@pytest.mark.parametrize(
    ("field", "value", "index"),
    [
        ("writer", 1.29, WRITER),
        ("boundary", 0.99, BOUNDARY),
        ("p99", 2.01, P99),
        ("minimal", 1.49, MINIMAL),
        ("everysec", 1.49, EVERYSEC),
        ("redis_cpu", 1.31, REDIS_CPU),
        ("client_cpu", 1.51, CLIENT_CPU),
        ("always", 0.99, ALWAYS),
        ("fixed", 2049.0, FIXED),
        ("payload", 1.41, PAYLOAD),
    ],
)
def test_each_goal_is_short_just_past_its_threshold(field: str, value: float, index: int) -> None:
    """Just past its threshold a goal is SHORT and the others still PASS."""
    statuses = _status(_report(**{field: value}))
    assert statuses[index] == "SHORT"
    assert statuses[:index] + statuses[index + 1 : 11] == ["PASS"] * 10


def test_thresholds_themselves_pass() -> None:
    """Exactly 1.3x, 1.0x, 2x, 1.5x, 1.3x, 1.5x, 1.0x, 2 KiB and 1.4x meet their goals."""
    report = _report(
        writer=1.3,
        boundary=1.0,
        p99=2.0,
        minimal=1.5,
        everysec=1.5,
        redis_cpu=1.3,
        client_cpu=1.5,
        always=1.0,
        fixed=2048.0,
        payload=1.4,
    )
    assert _status(report)[:10] == ["PASS"] * 10


def test_the_redis_cpu_goal_gives_the_ratios_at_1_and_64_tasks_too() -> None:
    """Judged at 16 tasks, the Redis CPU goal's line also names the ratio at 1 and 64."""
    line = goal_lines(evaluate_goals(_report()))[REDIS_CPU]
    assert line.endswith("- 1.7 at 1 task, 0.9 at 64 tasks")


def test_unmeasured_durability_columns_make_their_goals_not_applicable() -> None:
    """With --redis-url the everysec and always goals are N/A and say why; others judge."""
    report = _report()
    report["durability"] = {"measured": False, "reason": "--redis-url given"}
    goals = evaluate_goals(report)
    assert [goals[i]["status"] for i in (EVERYSEC, ALWAYS)] == ["N/A", "N/A"]
    assert "durability columns not measured: --redis-url given" in goal_lines(goals)[ALWAYS]
    assert goals[MINIMAL]["status"] == "PASS"


def test_unmeasured_lag_is_not_applicable_with_its_reason() -> None:
    """Without projections the lag goal is N/A and says why."""
    report = _report(lag={"measured": False, "reason": "projections not available"})
    goal = evaluate_goals(report)[LAG]
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
    assert _status(_report(scale=points))[SCALE_CPU:CONSOLE] == ["PASS", "SHORT"]
    points = [_point(10_000, 100.0, 5000.0), _point(1_000_000, 116.0, 4300.0)]
    assert _status(_report(scale=points))[SCALE_CPU:CONSOLE] == ["SHORT", "PASS"]


def test_scale_goal_uses_the_pair_by_pair_ratio_when_the_sizes_ran_side_by_side() -> None:
    """Sizes measured side by side carry a pair-by-pair ratio; it decides, not the medians."""
    small, large = _point(10_000, 100.0, 5000.0), _point(1_000_000, 130.0, 5000.0)
    assert _status(_report(scale=[small, large]))[SCALE_CPU] == "SHORT"
    large["server_cpu_ratio"] = 1.05
    assert _status(_report(scale=[small, large]))[SCALE_CPU] == "PASS"
    large["server_cpu_ratio"] = 1.2
    assert _status(_report(scale=[small, large]))[SCALE_CPU] == "SHORT"


def test_goal_lines_start_with_the_status() -> None:
    """Every printed goal line starts with PASS, SHORT or N/A and names its target."""
    lines = goal_lines(evaluate_goals(_report(writer=1.0)))
    assert lines[0].startswith("SHORT writer lifecycle at 64 tasks")
    assert "(target >= 1.3)" in lines[0]
    assert "(target <= 2048 B)" in lines[FIXED] and "(target 0.85-1.15 x)" in lines[SCALE_CPU]
    assert all(line.split()[0] in {"PASS", "SHORT", "N/A"} for line in lines)


def test_every_goal_has_its_own_name() -> None:
    """The goal table names each goal once, so a printed line identifies its goal."""
    names = [goal.name for goal in GOALS]
    assert len(names) == len(set(names)) == 21


async def test_a_given_server_leaves_out_the_durability_columns_and_scale_out() -> None:
    """With --redis-url both sections say why they were not measured, starting nothing."""
    options = BenchOptions.quick_run().on("redis://127.0.0.1:1/0", None)
    durability = await _durability(options, print)
    scale_out = await _scale_out(options, print)
    assert durability["measured"] is False and "--redis-url" in durability["reason"]
    assert scale_out["measured"] is False and "--redis-url" in scale_out["reason"]


def test_spread_gives_min_median_max() -> None:
    """A spread is the min, median and max of its values (zeros when there are none)."""
    assert spread([3.0, 1.0, 2.0]) == {"min": 1.0, "median": 2.0, "max": 3.0}
    assert spread([]) == {"min": 0.0, "median": 0.0, "max": 0.0}


@pytest.mark.parametrize(
    ("field", "value", "index"),
    [
        ("cluster_redis", 1.16, CLUSTER_REDIS),
        ("cluster_client", 1.31, CLUSTER_CLIENT),
        ("busiest_share", 1 / 3 + 0.06, CLUSTER_SHARE),
        ("x_single_3", 2.69, CURVE_3),
        ("x_single_6", 5.39, CURVE_6),
    ],
)
def test_each_cluster_goal_falls_short_just_past_its_threshold(
    field: str, value: float, index: int
) -> None:
    """Summed Redis CPU 1.15 x, client CPU 1.3 x, the busiest share 1/N + 0.05 and 0.9 x N
    the single server's capacity pass; a little past each, that goal alone is SHORT."""
    statuses = _status(_report(**{field: value}))
    assert statuses[index] == "SHORT", statuses
    assert statuses.count("SHORT") == 1


def test_the_cluster_goals_say_why_when_the_cluster_was_not_measured() -> None:
    """Without a cluster (a 6.2 server, --redis-url) every cluster goal is N/A with the
    reason; a quick run's missing 6-master point is N/A with its own."""
    report = _report()
    report["scale_out"] = {"measured": False, "reason": "needs a Redis 7 redis-server"}
    goals = evaluate_goals(report)
    for index in (CLUSTER_REDIS, CLUSTER_CLIENT, CLUSTER_SHARE, CURVE_3, CURVE_6):
        assert goals[index]["status"] == "N/A" and "Redis 7" in goals[index]["note"]
    report = _report()
    report["scale_out"]["curve"][2] = {"masters": 6, "measured": False, "reason": "full run only"}
    assert evaluate_goals(report)[CURVE_6]["note"] == "full run only"


def test_the_redis_cpu_goal_reads_one_loaded_master_and_notes_the_spread_load() -> None:
    """The summed Redis CPU goal is read with one master loaded at a time; the figure
    with the load spread over the masters is given beside it."""
    goal = evaluate_goals(_report(cluster_redis=1.04))[CLUSTER_REDIS]
    assert goal["status"] == "PASS"
    assert "1.30 x with the load spread" in goal["note"]


def test_a_curve_point_takes_the_loaded_masters_cpu_and_the_busiest_share() -> None:
    """N masters' capacity is the busiest master's: 1e6 / (C x its share), with C the CPU
    per invocation read with one master loaded alone, over the single server's 1e6 / C."""
    single = {"busiest_master_capacity_per_s": 10_000, "server_cpu_us": spread([100.0])}
    spread_point = {"master_shares": [0.35, 0.33, 0.32], "busiest_master_capacity_per_s": 7_000}
    loaded = [Sample(1.0, 1.0, 1.0, 1, 1.0, cpu) for cpu in (102.0, 104.0, 110.0)]
    point = _curve_point(spread_point, single, 3, loaded)
    assert point["loaded_server_cpu_x_single"] == 1.04
    assert point["busiest_master_capacity_per_s"] == round(1e6 / (104.0 * 0.35))
    assert point["x_single"] == round(round(1e6 / (104.0 * 0.35)) / 10_000, 2)
    assert point["x_single_at_split_load"] == 0.7
    assert point["target_x_single"] == 2.7


def _archive_report(
    *, sqlite_p99: float = 700.0, postgres_p99: float = 900.0, indexed: float = 30.0
) -> dict[str, Any]:
    def backend(p99: float) -> dict[str, Any]:
        lag = {"rate_per_s": 3000.0, "drained_per_s": 2900.0, "pending": 0, "p99_ms": p99}
        queries = {
            "indexed": {"p50_ms": indexed},
            "json_equal": {"p50_ms": 20.0},
            "json_nested": {"p50_ms": 480.0},
            "json_range": {"p50_ms": 120.0},
            "json_none": {"p50_ms": 9000.0},
        }
        return {"lag": {"1": lag}, "search": {"calls": 1_000_000, "queries": queries}}

    section = {"measured": True, "sqlite": backend(sqlite_p99), "postgresql": backend(postgres_p99)}
    return {"only": "archive", "archive": section}


def test_the_archive_goals_judge_lag_on_both_databases_and_search_on_postgresql() -> None:
    """A report of the archive section alone is judged on its four goals only: each
    database's lag p99 against 1 s, PostgreSQL's indexed query and its slowest JSON-path
    shape (the worst case, a condition no call meets, is reported, not judged)."""
    goals = evaluate_goals(_archive_report())
    assert [goal["goal"] for goal in goals] == [goal.name for goal in ARCHIVE_GOALS]
    assert [goal["status"] for goal in goals] == ["PASS"] * 4
    assert goals[3]["measured"] == 480.0 and "slowest json_nested" in goals[3]["note"]
    short = evaluate_goals(_archive_report(postgres_p99=1001.0, indexed=50.5))
    assert [goal["status"] for goal in short] == ["PASS", "SHORT", "SHORT", "PASS"]


def test_an_archive_database_not_measured_says_why() -> None:
    """A database the section could not run on makes its goals not applicable, with the
    reason; the other database's goals still count; a full report gets the archive's
    goals after its own."""
    report = _archive_report()
    report["archive"]["postgresql"] = {"measured": False, "reason": "no PostgreSQL binaries"}
    goals = evaluate_goals(report)
    assert [goal["status"] for goal in goals] == ["PASS", "N/A", "N/A", "N/A"]
    assert goals[1]["note"] == "no PostgreSQL binaries"
    full = {**_report(), "archive": _archive_report()["archive"]}
    assert [goal["goal"] for goal in evaluate_goals(full)] == [
        goal.name for goal in (*GOALS, *ARCHIVE_GOALS)
    ]
