"""The benchmark's report: summaries, the goals as PASS/SHORT lines, and the tables.

Everything here works on the plain JSON report, so a saved ``--json`` file can be judged
and rendered again without running anything.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any, Final

from rich.console import Console
from rich.table import Table

PASS: Final = "PASS"  # noqa: S105 - a goal status, not a secret
SHORT: Final = "SHORT"
NOT_MEASURED: Final = "N/A"

KIB: Final = 1024


def spread(values: Sequence[float]) -> dict[str, float]:
    """``{"min", "median", "max"}`` of ``values``, rounded (zeros when empty)."""
    if not values:
        return {"min": 0.0, "median": 0.0, "max": 0.0}
    return {
        "min": round(min(values), 3),
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
    }


def _goal(
    name: str, measured: float | None, target: str, ok: bool | None, note: str = ""
) -> dict[str, Any]:
    status = NOT_MEASURED if ok is None else PASS if ok else SHORT
    return {"goal": name, "status": status, "measured": measured, "target": target, "note": note}


def _ratio(report: dict[str, Any], mode: str, concurrency: int, metric: str) -> float | None:
    pairs = report.get("ratios", {}).get(mode, {}).get(str(concurrency))
    return None if pairs is None else float(pairs[metric]["median"])


def _close(a: float, b: float, tolerance: float) -> bool:
    return abs(a - b) <= tolerance * b


def evaluate_goals(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Judge the issue's goals on a report; medians of pair-by-pair ratios are used."""
    goals = []
    writer = _ratio(report, "writer", 64, "invocations_per_s")
    goals.append(
        _goal(
            "writer lifecycle at concurrency 64 >= 1.3 x naive floor",
            writer,
            ">= 1.3",
            None if writer is None else writer >= 1.3,
        )
    )
    boundary = _ratio(report, "boundary", 64, "invocations_per_s")
    goals.append(
        _goal(
            "boundary lifecycle at concurrency 64 >= 1.0 x naive floor",
            boundary,
            ">= 1.0",
            None if boundary is None else boundary >= 1.0,
        )
    )
    p99 = _ratio(report, "writer", 16, "p99_ms")
    goals.append(
        _goal(
            "writer p99 append latency at concurrency 16 <= 2 x floor p99",
            p99,
            "<= 2.0",
            None if p99 is None else p99 <= 2.0,
        )
    )
    memory = report.get("memory", {})
    judged = memory.get("recommended") or memory.get("configured")
    fixed = None if judged is None else judged["fixed_bytes"]
    goals.append(
        _goal(
            "fixed overhead per invocation <= 2 KiB (recommended settings)",
            fixed,
            "<= 2048 B",
            None if fixed is None else fixed <= 2 * KIB,
        )
    )
    ratio = None if judged is None else judged["payload_ratio"]
    goals.append(
        _goal(
            "bytes per invocation - fixed <= 1.4 x payload (payload stored once)",
            ratio,
            "<= 1.4",
            None if ratio is None else ratio <= 1.4,
        )
    )
    lag = report.get("projection_lag", {})
    lag_p99 = lag.get("p99_ms") if lag.get("measured") else None
    lag_note = str(lag.get("reason", ""))
    if lag.get("pending"):
        lag_note = (
            f"a lower bound: {lag['pending']:,} receipts still pending; the worker drained "
            f"{lag['drained_per_s']:,.0f} invocations/s against {lag['rate_per_s']:,.0f} written"
        )
    goals.append(
        _goal(
            "projection lag p99 <= 100 ms at half load",
            lag_p99,
            "<= 100 ms",
            None if lag_p99 is None else lag_p99 <= 100,
            lag_note,
        )
    )
    goals += _scale_goals(report.get("scale", {}).get("points", []))
    return goals


def _scale_goals(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """1M against 10k stored: the throughput goal is judged on Redis CPU per invocation.

    Wall-clock rates move with everything else the machine runs; the CPU time Redis
    spends per invocation moves less, and it is what more stored keys would make dearer.
    When each size had its own server and the repeats alternated, the ratio is taken
    pair by pair (``server_cpu_ratio``). The rates are given in the note.
    """
    by_size = {point["stored"]: point for point in points}
    small, large = by_size.get(10_000), by_size.get(1_000_000)
    throughput = "1M stored: throughput (Redis CPU per invocation) within 15 % of 10k"
    size = "1M stored: bytes per invocation within 15 % of 10k"
    if small is None or large is None:
        note = "needs 10k and 1M stored (a run without --quick)"
        return [
            _goal(throughput, None, "0.85-1.15 x", None, note),
            _goal(size, None, "0.85-1.15 x", None, note),
        ]
    # Pair by pair when the sizes were measured side by side, else the medians' ratio.
    cpu = large.get("server_cpu_ratio") or large["server_cpu_us"] / small["server_cpu_us"]
    rates = (
        f"{large['invocations_per_s']:,.0f} against {small['invocations_per_s']:,.0f} invocations/s"
    )
    return [
        _goal(throughput, round(cpu, 3), "0.85-1.15 x", abs(cpu - 1) <= 0.15, rates),
        _goal(
            size,
            round(large["bytes_per_invocation"] / small["bytes_per_invocation"], 3),
            "0.85-1.15 x",
            _close(large["bytes_per_invocation"], small["bytes_per_invocation"], 0.15),
        ),
    ]


def goal_lines(goals: list[dict[str, Any]]) -> list[str]:
    """One ``PASS|SHORT|N/A  goal: measured (target)`` line per goal."""
    lines = []
    for goal in goals:
        measured = "not measured" if goal["measured"] is None else f"{goal['measured']:g}"
        note = f" - {goal['note']}" if goal["note"] else ""
        lines.append(
            f"{goal['status']:<5} {goal['goal']}: {measured} (target {goal['target']}){note}"
        )
    return lines


def _mid(values: dict[str, float], digits: int = 0) -> str:
    fmt = f"{{:,.{digits}f}}"
    return (
        f"{fmt.format(values['median'])} [{fmt.format(values['min'])}-{fmt.format(values['max'])}]"
    )


def render(report: dict[str, Any], console: Console) -> None:
    """Print the report's tables and goal lines."""
    env = report["environment"]
    kind = "quick" if report["quick"] else "full"
    console.print(
        f"canon bench ({kind}): Redis {env['redis_version']} ({env['server']}), "
        f"{env['cpus']} CPUs, load {env['load_before']} -> {env['load_after']}"
    )
    table = Table(
        title="Throughput: median \\[min-max] over repeats; ratios are pair by pair to the floor"
    )
    for column in (
        "mode",
        "tasks",
        "invocations/s",
        "append p50 ms",
        "append p99 ms",
        "CPU us/inv client/redis",
        "x floor (inv/s)",
        "x floor (p99)",
    ):
        table.add_column(column, justify="right")
    for mode, by_concurrency in report["throughput"].items():
        for concurrency, row in by_concurrency.items():
            ratios = report["ratios"].get(mode, {}).get(concurrency)
            table.add_row(
                mode,
                concurrency,
                _mid(row["invocations_per_s"]),
                _mid(row["p50_ms"], 2),
                _mid(row["p99_ms"], 2),
                f"{row['client_cpu_us']['median']:.0f} / {row['server_cpu_us']['median']:.0f}",
                "" if ratios is None else _mid(ratios["invocations_per_s"], 2),
                "" if ratios is None else _mid(ratios["p99_ms"], 2),
            )
    console.print(table)
    _render_memory(report, console)
    _render_rest(report, console)
    for line in goal_lines(report["goals"]):
        console.print(line, style="green" if line.startswith(PASS) else "yellow", highlight=False)


def _render_memory(report: dict[str, Any], console: Console) -> None:
    table = Table(
        title="Memory: bytes per invocation (record + stream + feed share; run index apart)"
    )
    for column in (
        "settings",
        "raw B",
        "payload B",
        "record",
        "stream",
        "feed",
        "per inv",
        "run index",
        "encoding",
        "fixed",
        "x payload",
    ):
        table.add_column(column, justify="right")
    for name, section in report["memory"].items():
        for point in section["points"]:
            table.add_row(
                name,
                str(point["raw_bytes"]),
                str(point["payload_bytes"]),
                f"{point['record']:,.0f}",
                f"{point['stream']:,.0f}",
                f"{point['feed']:,.0f}",
                f"{point['per_invocation']:,.0f}",
                f"{point['run_index']:,.0f}",
                point["record_encoding"],
                f"{section['fixed_bytes']:,.0f}",
                f"{section['payload_ratio']:.2f}",
            )
    console.print(table)


def _render_rest(report: dict[str, Any], console: Console) -> None:
    table = Table(title="Scale: writer lifecycle at 64 tasks with N invocations stored")
    for column in ("stored", "bytes/invocation", "invocations/s", "Redis CPU us/inv"):
        table.add_column(column, justify="right")
    for point in report["scale"]["points"]:
        table.add_row(
            f"{point['stored']:,}",
            f"{point['bytes_per_invocation']:,.0f}",
            f"{point['invocations_per_s']:,.0f}",
            f"{point['server_cpu_us']:,.0f}",
        )
    console.print(table)
    lag = report["projection_lag"]
    if lag.get("measured"):
        console.print(
            f"Projection lag at {lag['rate_per_s']:,.0f} invocations/s: "
            f"p50 {lag['p50_ms']:.0f} ms, p99 {lag['p99_ms']:.0f} ms, max {lag['max_ms']:.0f} ms; "
            f"receipts drained at {lag['drained_per_s']:,.0f} invocations/s"
            + (f"; {lag['pending']:,} still pending (lower bounds)" if lag["pending"] else "")
        )
    else:
        console.print(f"Projection lag: not measured: {lag.get('reason', '')}")
    batching = report["batching"]
    console.print(
        f"Auto-pipelining: {batching['calls']:,} script calls in {batching['round_trips']:,} "
        f"round trips ({batching['calls_per_round_trip']:.1f} per trip), "
        f"{batching['reloads']} reloads"
    )
