"""The benchmark's goals, judged as PASS/SHORT lines, and the spreads the report is made of.

Everything here works on the plain JSON report, so a saved ``--json`` file can be judged
again without running anything (:mod:`.tables` prints it). The goals are one table,
:data:`GOALS`: a name, what is measured, and the bound it must meet. Ratios are the
medians of pair-by-pair ratios within one run (repeat *i* of a mode against repeat *i*
of its reference, on the same server), which cancels most of a shared machine's drift.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

PASS: Final = "PASS"  # noqa: S105 - a goal status, not a secret
SHORT: Final = "SHORT"
NOT_MEASURED: Final = "N/A"

KIB: Final = 1024

#: What a goal measures on a report: the value (None when not measured) and a note.
Measure = Callable[[dict[str, Any]], tuple[float | None, str]]


def spread(values: Sequence[float]) -> dict[str, float]:
    """``{"min", "median", "max"}`` of ``values``, rounded (zeros when empty)."""
    if not values:
        return {"min": 0.0, "median": 0.0, "max": 0.0}
    return {
        "min": round(min(values), 3),
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
    }


@dataclass(frozen=True, slots=True)
class Bound:
    """A goal's target: at least ``low``, at most ``high``, or both (a range)."""

    low: float | None = None
    high: float | None = None
    unit: str = ""

    def holds(self, value: float) -> bool:
        """Tell whether ``value`` meets the target (the bounds themselves do)."""
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)

    @property
    def text(self) -> str:
        """The target as printed: ``>= 1.3``, ``<= 2.0``, ``<= 2048 B``, ``0.85-1.15 x``."""
        if self.low is not None and self.high is not None:
            return f"{self._number(self.low)}-{self._number(self.high)}{self.unit}"
        if self.low is not None:
            return f">= {self._number(self.low)}{self.unit}"
        return f"<= {self._number(self.high)}{self.unit}"

    def _number(self, value: float | None) -> str:
        # A bare ratio keeps one decimal (1.0, 2.0); a quantity with a unit reads 2048 B.
        return f"{value:.1f}" if not self.unit and value == int(value or 0) else f"{value:g}"


@dataclass(frozen=True, slots=True)
class Goal:
    """One goal: its printed name, what it measures, and the bound it must meet."""

    name: str
    measure: Measure
    bound: Bound


def _section(report: dict[str, Any], persistence: str) -> dict[str, Any] | None:
    """The throughput section of ``persistence`` (``none``: the report itself)."""
    if persistence == "none":
        return report
    section: dict[str, Any] | None = report.get("durability", {}).get(persistence)
    return section


def ratio(
    mode: str,
    reference: str,
    tasks: int,
    metric: str = "invocations_per_s",
    *,
    persistence: str = "none",
    also_at: tuple[int, ...] = (),
) -> Measure:
    """The median pair-by-pair ratio of ``mode`` to ``reference`` at ``tasks``.

    ``also_at`` names other task counts whose ratios the goal's note gives.
    """

    def one(section: dict[str, Any], at: int) -> float | None:
        pairs = section.get("ratios", {}).get(reference, {}).get(mode, {}).get(str(at))
        return None if pairs is None else float(pairs[metric]["median"])

    def measure(report: dict[str, Any]) -> tuple[float | None, str]:
        section = _section(report, persistence)
        if section is None:
            reason = report.get("durability", {}).get("reason", "")
            return None, f"durability columns not measured: {reason}" if reason else ""
        others = [(at, one(section, at)) for at in also_at]
        note = ", ".join(
            f"{value:g} at {at} task{'' if at == 1 else 's'}"
            for at, value in others
            if value is not None
        )
        return one(section, tasks), note

    return measure


#: The modes of the one-call table: what a lone agent's call costs, beside the floor.
ONE_CALL_MODES: Final = ("boundary", "boundary_def_tool", "sync_boundary", "writer")
#: The floor they are held against there: three EVALSHA of the same bytes, sync redis-py.
ONE_CALL_FLOOR: Final = "minimal_sync"


def one_call(section: dict[str, Any]) -> dict[str, Any]:
    """One call at a time (1 task): wall and client CPU per call, each mode beside the floor.

    Per mode: ``wall_us`` (one over the median rate), ``client_cpu_us`` and ``waits`` (the
    times a call waited for Redis: its awaited round trips) as medians over the repeats,
    and ``x_floor_wall`` / ``x_floor_client_cpu``: the medians of the pair-by-pair ratios
    to :data:`ONE_CALL_FLOOR` in the same run (below 1: cheaper than the floor).
    """
    throughput, ratios = section.get("throughput", {}), section.get("ratios", {})
    rows: dict[str, Any] = {}
    for mode in (*ONE_CALL_MODES, ONE_CALL_FLOOR):
        cell = throughput.get(mode, {}).get("1")
        if cell is None:
            continue
        rate = cell["invocations_per_s"]["median"]
        row: dict[str, Any] = {
            "wall_us": round(1e6 / rate, 1) if rate else None,
            "client_cpu_us": cell["client_cpu_us"]["median"],
            "waits": cell.get("waits_per_invocation", {}).get("median") or None,
        }
        pairs = ratios.get(ONE_CALL_FLOOR, {}).get(mode, {}).get("1")
        if pairs is not None:
            rate_ratio = pairs["invocations_per_s"]["median"]
            row["x_floor_wall"] = round(1 / rate_ratio, 3) if rate_ratio else None
            row["x_floor_client_cpu"] = pairs["client_cpu_us"]["median"]
        rows[mode] = row
    if ONE_CALL_FLOOR in rows:
        rows[ONE_CALL_FLOOR]["waits"] = 3.0  # three EVALSHA, each awaited, by construction
    return rows


def _memory(field: str) -> Measure:
    def measure(report: dict[str, Any]) -> tuple[float | None, str]:
        memory = report.get("memory", {})
        judged = memory.get("recommended") or memory.get("configured")
        return (None, "") if judged is None else (float(judged[field]), "")

    return measure


def _lag_p99(report: dict[str, Any]) -> tuple[float | None, str]:
    lag = report.get("projection_lag", {})
    note = str(lag.get("reason", ""))
    if lag.get("pending"):
        note = (
            f"a lower bound: {lag['pending']:,} receipts still pending; the worker drained "
            f"{lag['drained_per_s']:,.0f} invocations/s against {lag['rate_per_s']:,.0f} written"
        )
    return (lag.get("p99_ms") if lag.get("measured") else None), note


def _scale(field: str) -> Measure:
    """1M against 10k stored; the throughput goal is judged on Redis CPU per invocation.

    Wall-clock rates move with everything else the machine runs; the CPU time Redis
    spends per invocation moves less, and it is what more stored keys would make dearer.
    When each size had its own server and the repeats alternated, the ratio is taken
    pair by pair (``server_cpu_ratio``). The rates are given in the note.
    """

    def measure(report: dict[str, Any]) -> tuple[float | None, str]:
        by_size = {point["stored"]: point for point in report.get("scale", {}).get("points", [])}
        small, large = by_size.get(10_000), by_size.get(1_000_000)
        if small is None or large is None:
            return None, "needs 10k and 1M stored (a run without --quick)"
        if field == "bytes_per_invocation":
            return round(large[field] / small[field], 3), ""
        # Pair by pair when the sizes were measured side by side, else the medians' ratio.
        cpu = large.get("server_cpu_ratio") or large["server_cpu_us"] / small["server_cpu_us"]
        rates = (
            f"{large['invocations_per_s']:,.0f} against "
            f"{small['invocations_per_s']:,.0f} invocations/s"
        )
        return round(cpu, 3), rates

    return measure


def _encryption_ratio(tasks: int) -> Measure:
    """The median pair-by-pair ratio of sealed to plain client CPU at ``tasks`` in flight."""

    def measure(report: dict[str, Any]) -> tuple[float | None, str]:
        section = report.get("encryption", {})
        if not section.get("measured"):
            return None, str(section.get("reason", "not run"))
        cell = section["in_flight"][str(tasks)]
        plain = cell["plain_client_cpu_us"]["median"]
        sealed = cell["sealed_client_cpu_us"]["median"]
        return cell["ratio"]["median"], f"{sealed:g} us beside {plain:g} us plain"

    return measure


def _slowest_console_page(report: dict[str, Any]) -> tuple[float | None, str]:
    """The slowest console page's median time at 3,000 calls, and which page it is."""
    console = report.get("console", {})
    if not console.get("measured"):
        return None, str(console.get("reason", ""))
    name, page = max(console["pages"].items(), key=lambda item: item[1]["median_ms"])
    return page["median_ms"], f"{name} ({page['bytes']:,} bytes)"


def _cluster_ratio(metric: str) -> Measure:
    """The 3-master cluster's writer figure over the single server's, pair by pair.

    ``server_cpu_us`` is Redis CPU per invocation summed over the masters; ``client_cpu_us``
    the client's per invocation.
    """

    def measure(report: dict[str, Any]) -> tuple[float | None, str]:
        section = report.get("scale_out", {})
        if not section.get("measured"):
            return None, str(section.get("reason", ""))
        writer = section["modes"]["writer"]
        single, cluster = writer["single"][metric]["median"], writer["cluster"][metric]["median"]
        return (round(cluster / single, 3) if single else None), "medians, writer at 64 tasks"

    return measure


def _cluster_redis_cpu(report: dict[str, Any]) -> tuple[float | None, str]:
    """Redis CPU per invocation, summed over the 3 masters, over the single server's.

    Read with one master loaded alone at the single server's load (see
    :mod:`canon.bench.scaleout`); the ratio with the load spread over the masters is in
    the note.
    """
    section = report.get("scale_out", {})
    if not section.get("measured"):
        return None, str(section.get("reason", ""))
    point = next(p for p in section.get("curve", []) if p["masters"] == section["masters"])
    writer = section["modes"]["writer"]
    single = writer["single"]["server_cpu_us"]["median"]
    spread_load = writer["cluster"]["server_cpu_us"]["median"] / single if single else 0.0
    note = f"one master loaded at a time; {spread_load:.2f} x with the load spread over them"
    return point["loaded_server_cpu_x_single"], note


def _busiest_share_over_even(report: dict[str, Any]) -> tuple[float | None, str]:
    """How far the 3-master cluster's busiest master is above an even share (1/N)."""
    section = report.get("scale_out", {})
    if not section.get("measured"):
        return None, str(section.get("reason", ""))
    shares = section["modes"]["writer"]["cluster"]["master_shares"]
    masters = section["masters"]
    return round(max(shares) - 1 / masters, 3), "shares " + " / ".join(f"{s:.2f}" for s in shares)


def _curve(masters: int) -> Measure:
    """The implied capacity of ``masters`` masters over ``0.9 x masters`` the single server's.

    1.0 or more meets the capacity goal; the capacity is the busiest master's (implied by
    the CPU, not measured).
    """

    def measure(report: dict[str, Any]) -> tuple[float | None, str]:
        section = report.get("scale_out", {})
        if not section.get("measured"):
            return None, str(section.get("reason", ""))
        point = next((p for p in section.get("curve", []) if p["masters"] == masters), None)
        if point is None or not point.get("measured"):
            return None, "" if point is None else str(point.get("reason", ""))
        note = (
            f"{point['x_single']:g} x one server (implied by the CPU, not measured; "
            f"{point['x_single_at_split_load']:g} x from the CPU with the load spread)"
        )
        return round(point["x_single"] / point["target_x_single"], 3), note

    return measure


_AT_LEAST_1 = Bound(low=1.0)
_WITHIN_15 = Bound(0.85, 1.15, " x")

#: Every goal, in the order they are printed. "minimal floor" is the minimal-work script,
#: "script floor" the store's own scripts through bare redis-py (see docs/performance.md).
# fmt: off
GOALS: Final = (
    Goal("writer lifecycle at 64 tasks >= 1.3 x script floor",
         ratio("writer", "script_floor", 64), Bound(low=1.3)),
    Goal("boundary lifecycle at 64 tasks >= 1.0 x script floor",
         ratio("boundary", "script_floor", 64), _AT_LEAST_1),
    Goal("writer p99 append latency at 16 tasks <= 2 x script floor p99",
         ratio("writer", "script_floor", 16, "p99_ms"), Bound(high=2.0)),
    Goal("boundary at 16 tasks >= 1.5 x minimal floor naive, no persistence",
         ratio("boundary", "minimal_naive", 16), Bound(low=1.5)),
    Goal("boundary at 16 tasks >= 1.5 x minimal floor naive, appendfsync everysec",
         ratio("boundary", "minimal_naive", 16, persistence="everysec"), Bound(low=1.5)),
    Goal("boundary Redis CPU per invocation at 16 tasks <= 1.3 x minimal floor naive",
         ratio("boundary", "minimal_naive", 16, "server_cpu_us", also_at=(1, 64)),
         Bound(high=1.3)),
    Goal("boundary client CPU per invocation at 1 task <= 1.5 x minimal floor sync",
         ratio("boundary", "minimal_sync", 1, "client_cpu_us"), Bound(high=1.5)),
    Goal("boundary at 64 tasks >= 1.0 x minimal floor naive, appendfsync always",
         ratio("boundary", "minimal_naive", 64, persistence="always"), _AT_LEAST_1),
    Goal("fixed overhead per invocation <= 2 KiB (recommended settings)",
         _memory("fixed_bytes"), Bound(high=2 * KIB, unit=" B")),
    Goal("bytes per invocation - fixed <= 1.4 x payload (payload stored once)",
         _memory("payload_ratio"), Bound(high=1.4)),
    Goal("projection lag p99 <= 100 ms at half load",
         _lag_p99, Bound(high=100, unit=" ms")),
    Goal("1M stored: throughput (Redis CPU per invocation) within 15 % of 10k",
         _scale("server_cpu_us"), _WITHIN_15),
    Goal("1M stored: bytes per invocation within 15 % of 10k",
         _scale("bytes_per_invocation"), _WITHIN_15),
    Goal("console: slowest page at 3,000 calls <= 200 ms (median)",
         _slowest_console_page, Bound(high=200, unit=" ms")),
    Goal("cluster: Redis CPU per invocation, summed over masters, <= 1.15 x one server",
         _cluster_redis_cpu, Bound(high=1.15)),
    Goal("cluster: client CPU per invocation <= 1.3 x one server",
         _cluster_ratio("client_cpu_us"), Bound(high=1.3)),
    Goal("cluster: busiest master's share - 1/N <= 0.05 (3 masters)",
         _busiest_share_over_even, Bound(high=0.05)),
    Goal("cluster: 3 masters' implied capacity / (0.9 x 3 x one server) >= 1.0",
         _curve(3), _AT_LEAST_1),
    Goal("cluster: 6 masters' implied capacity / (0.9 x 6 x one server) >= 1.0",
         _curve(6), _AT_LEAST_1),
    Goal("encryption: client CPU per invocation at 1 task <= 1.1 x plain (1 KiB payloads)",
         _encryption_ratio(1), Bound(high=1.1)),
    Goal("encryption: client CPU per invocation at 16 tasks <= 1.1 x plain (1 KiB payloads)",
         _encryption_ratio(16), Bound(high=1.1)),
)
# fmt: on


def _archive_backend(report: dict[str, Any], backend: str) -> tuple[dict[str, Any] | None, str]:
    """The archive section's figures of one database, or None and why not."""
    section = report.get("archive", {})
    if not section.get("measured"):
        return None, str(section.get("reason", ""))
    figures: dict[str, Any] = section.get(backend, {})
    if "lag" not in figures:
        return None, str(figures.get("reason", "not measured"))
    return figures, ""


def _archive_lag(backend: str) -> Measure:
    """The archive's lag p99 at the boundary's 16-in-flight rate, on ``backend``."""

    def measure(report: dict[str, Any]) -> tuple[float | None, str]:
        figures, reason = _archive_backend(report, backend)
        if figures is None:
            return None, reason
        lag = figures["lag"]["1"]
        note = f"{lag['rate_per_s']:,.0f} written/s, {lag['drained_per_s']:,.0f} archived/s" + (
            f"; {lag['pending']:,} still pending (a lower bound)" if lag["pending"] else ""
        )
        return lag["p99_ms"], note

    return measure


def _archive_search(backend: str, shapes: tuple[str, ...]) -> Measure:
    """The slowest p50 of ``shapes`` of the archive's search on ``backend``."""

    def measure(report: dict[str, Any]) -> tuple[float | None, str]:
        figures, reason = _archive_backend(report, backend)
        if figures is None:
            return None, reason
        search = figures["search"]
        name = max(shapes, key=lambda shape: search["queries"][shape]["p50_ms"])
        note = f"{search['calls']:,} calls" + (f", slowest {name}" if len(shapes) > 1 else "")
        return search["queries"][name]["p50_ms"], note

    return measure


#: The JSON-path shapes the search goal is judged on (``json_none``, a condition no call
#: meets, is the worst case and is reported beside them).
JSON_SHAPES: Final = ("json_equal", "json_nested", "json_range")

#: The archive section's goals, judged when it ran (``canon bench --archive``).
# fmt: off
ARCHIVE_GOALS: Final = (
    Goal("archive lag p99 <= 1 s at the boundary's 16-in-flight rate, SQLite",
         _archive_lag("sqlite"), Bound(high=1000, unit=" ms")),
    Goal("archive lag p99 <= 1 s at the boundary's 16-in-flight rate, PostgreSQL",
         _archive_lag("postgresql"), Bound(high=1000, unit=" ms")),
    Goal("archive search, tool + code + time range p50 <= 50 ms, PostgreSQL",
         _archive_search("postgresql", ("indexed",)), Bound(high=50, unit=" ms")),
    Goal("archive search, JSON-path condition p50 <= 500 ms, PostgreSQL",
         _archive_search("postgresql", JSON_SHAPES), Bound(high=500, unit=" ms")),
)
# fmt: on


def evaluate_goals(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Judge every goal of :data:`GOALS` on a report, and :data:`ARCHIVE_GOALS` with it.

    A report of the archive section alone (``"only": "archive"``) is judged on the
    archive's goals only.
    """
    judged: tuple[Goal, ...] = () if report.get("only") == "archive" else GOALS
    if "archive" in report:
        judged += ARCHIVE_GOALS
    goals = []
    for goal in judged:
        measured, note = goal.measure(report)
        ok = None if measured is None else goal.bound.holds(measured)
        status = NOT_MEASURED if ok is None else PASS if ok else SHORT
        goals.append(
            {
                "goal": goal.name,
                "status": status,
                "measured": measured,
                "target": goal.bound.text,
                "note": note,
            }
        )
    return goals


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
