"""The benchmark's tables: a report (live or a saved ``--json`` file) printed with rich."""

from __future__ import annotations

from typing import Any, Final

from rich.console import Console
from rich.table import Table

from canon.bench.modes import BY_KEY, PIPELINED
from canon.bench.report import PASS, goal_lines

#: The throughput sections in the order they are printed, and what each one's server ran.
_PERSISTENCE: Final = {
    "everysec": "appendonly yes, appendfsync everysec",
    "always": "appendonly yes, appendfsync always",
}


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
    if report.get("only") != "archive":
        _render_core(report, console)
    if "archive" in report:
        _render_archive(report["archive"], console)
    for line in goal_lines(report["goals"]):
        console.print(line, style="green" if line.startswith(PASS) else "yellow", highlight=False)


def _render_core(report: dict[str, Any], console: Console) -> None:
    """Every section but the archive's."""
    persistence = report.get("persistence", {})
    if persistence.get("appendonly", "no") == "no":
        server = "no persistence (appendonly no)"
    else:  # a given server (--redis-url) persisting as it is configured to
        server = f"appendonly yes, appendfsync {persistence.get('appendfsync', '?')}"
    _render_throughput(report, server, console)
    _render_one_call(report.get("one_call", {}), server, console)
    _render_encryption(report.get("encryption", {}), console)
    durability = report["durability"]
    for name, settings in _PERSISTENCE.items():
        if durability.get("measured") and name in durability:
            _render_throughput(durability[name], settings, console)
    if not durability.get("measured"):
        console.print(
            f"Durability columns ({', '.join(_PERSISTENCE)}): not measured: "
            f"{durability.get('reason', '')}"
        )
    _render_memory(report, console)
    _render_rest(report, console)
    _render_scale_out(report["scale_out"], console)


def _render_archive(section: dict[str, Any], console: Console) -> None:
    """The archive's lag at each write rate and its search times, per database."""
    if not section.get("measured"):
        console.print(f"Archive: not measured: {section.get('reason', '')}")
        return
    lag = Table(
        title=f"Archive lag: writers paced at fractions of the boundary's 16-in-flight rate "
        f"({section['rate_per_s']:,.0f}/s, {section['rate_source']}), "
        f"{section['config']['lag_duration_s']:g} s each; {section['config']['worker']}"
    )
    for column in ("database", "rate", "written/s", "archived/s", "p50 / p99 / max ms"):
        lag.add_column(column, justify="right")
    lag.add_column("worker CPU us/call", justify="right")
    lag.add_column("bytes/call", justify="right")
    search = Table(
        title="Archive search: ms per page of 50 (p50 / p90 / max) on calls built in bulk",
        caption="json_none: a condition no call meets, so every row is read (the worst case)",
    )
    search.add_column("database")
    search.add_column("calls", justify="right")
    search.add_column("bytes/call", justify="right")
    shapes = ("indexed", "json_equal", "json_nested", "json_range", "json_none")
    for shape in shapes:
        search.add_column(shape, justify="right")
    for backend in ("sqlite", "postgresql"):
        figures = section.get(backend, {})
        if "lag" not in figures:
            console.print(f"Archive on {backend}: not measured: {figures.get('reason', '')}")
            continue
        for fraction, row in figures["lag"].items():
            lag.add_row(
                backend,
                f"{fraction} x",
                f"{row['rate_per_s']:,.0f}",
                f"{row['drained_per_s']:,.0f}",
                f"{row['p50_ms']:,.0f} / {row['p99_ms']:,.0f} / {row['max_ms']:,.0f}"
                + (" (pending)" if row["pending"] else ""),
                f"{row['worker_cpu_us_per_call'] or 0:,}",
                f"{row['bytes_per_call'] or 0:,}",
            )
        found = figures["search"]
        queries = found["queries"]
        search.add_row(
            backend,
            f"{found['calls']:,}",
            f"{found['bytes_per_call']:,}",
            *(
                f"{queries[shape]['p50_ms']:,.1f} / {queries[shape]['p90_ms']:,.1f} / "
                f"{queries[shape]['max_ms']:,.1f}"
                for shape in shapes
            ),
        )
    console.print(lag)
    console.print(search)


def _render_throughput(section: dict[str, Any], persistence: str, console: Console) -> None:
    table = Table(
        title=f"Throughput, {persistence}: median \\[min-max] over repeats; ratios (medians) "
        "pair by pair to the minimal floor, naive, and to the script floor",
        caption="* append latency of a whole pipeline of 16 invocations; "
        "sync modes: N threads instead of N asyncio tasks",
    )
    table.add_column("mode", no_wrap=True)
    table.add_column("tasks", justify="right")
    table.add_column("invocations/s", justify="right", no_wrap=True)
    for column in (
        "append p50 / p99 ms",
        "CPU us/inv client / Redis",
        "x minimal inv/s",
        "x minimal Redis CPU",
        "x script floor inv/s",
        "x script floor p99",
    ):
        table.add_column(column, justify="right")
    ratios = section["ratios"]
    for mode, by_concurrency in section["throughput"].items():
        label = BY_KEY[mode].label + (" *" if mode in PIPELINED else "")
        for concurrency, row in by_concurrency.items():
            minimal = ratios["minimal_naive"].get(mode, {}).get(concurrency)
            script = ratios["script_floor"].get(mode, {}).get(concurrency)
            table.add_row(
                label,
                concurrency,
                _mid(row["invocations_per_s"]),
                f"{row['p50_ms']['median']:.2f} / {row['p99_ms']['median']:.2f}",
                f"{row['client_cpu_us']['median']:.0f} / {row['server_cpu_us']['median']:.0f}",
                _median(minimal, "invocations_per_s"),
                _median(minimal, "server_cpu_us"),
                _median(script, "invocations_per_s"),
                _median(script, "p99_ms"),
            )
    console.print(table)


def _render_one_call(rows: dict[str, Any], persistence: str, console: Console) -> None:
    """What one call at a time costs (1 task), each mode beside the sync floor."""
    if not rows:
        return
    table = Table(
        title=f"One call at a time (1 task), {persistence}: medians over repeats; x floor: "
        "medians of the pair-by-pair ratios to the minimal floor, sync, of the same run",
        caption="waits: times one call waited for Redis (its awaited round trips)",
    )
    table.add_column("mode", no_wrap=True)
    for column in ("wall us/call", "x floor", "client CPU us/call", "x floor", "waits/call"):
        table.add_column(column, justify="right")
    for mode, row in rows.items():
        waits = row.get("waits")
        table.add_row(
            BY_KEY[mode].label,
            "" if row["wall_us"] is None else f"{row['wall_us']:,.0f}",
            _ratio(row.get("x_floor_wall")),
            f"{row['client_cpu_us']:,.0f}",
            _ratio(row.get("x_floor_client_cpu")),
            "" if waits is None else f"{waits:.2f}",
        )
    console.print(table)


def _render_encryption(section: dict[str, Any], console: Console) -> None:
    """Client CPU per invocation with payloads encrypted at rest, beside plain ones."""
    if not section:
        return
    if not section.get("measured"):
        console.print(f"Encryption: not measured: {section.get('reason', '')}")
        return
    table = Table(
        title="Payloads encrypted at rest (request, raw response, agent result of ~1 KiB "
        "each): client CPU per invocation, medians; x plain: median of the pair-by-pair "
        "ratios"
    )
    table.add_column("in flight", justify="right")
    for column in ("plain us/call", "sealed us/call", "x plain"):
        table.add_column(column, justify="right")
    for tasks, cell in section["in_flight"].items():
        table.add_row(
            tasks,
            f"{cell['plain_client_cpu_us']['median']:,.0f}",
            f"{cell['sealed_client_cpu_us']['median']:,.0f}",
            _ratio(cell["ratio"]["median"]),
        )
    console.print(table)


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _median(ratios: dict[str, Any] | None, metric: str) -> str:
    return "" if ratios is None else f"{ratios[metric]['median']:.2f}"


def _render_scale_out(section: dict[str, Any], console: Console) -> None:
    if not section.get("measured"):
        console.print(f"Scale-out: not measured: {section.get('reason', '')}")
        return
    masters = section["masters"]
    table = Table(
        title=f"Scale-out at {section['tasks']} tasks: a {masters}-master cluster against one "
        "server, in the same run; ratios pair by pair",
        caption="implied capacity: 1e6 / Redis CPU us per invocation x masters (even spread) "
        "and / the busiest master's share; implied by the CPU, not measured",
    )
    for column in (
        "mode",
        "system",
        "invocations/s",
        "CPU us/inv client / Redis",
        "Redis CPU share per master",
        "x single (inv/s)",
        "x single (Redis CPU)",
        "implied inv/s: even / busiest",
    ):
        table.add_column(column, justify="right")
    for mode, point in section["modes"].items():
        for system, name in (("single", "1 server"), ("cluster", f"{masters} masters")):
            row = point[system]
            versus = point["cluster_x_single"] if system == "cluster" else None
            table.add_row(
                mode,
                name,
                _mid(row["invocations_per_s"]),
                f"{row['client_cpu_us']['median']:.0f} / {row['server_cpu_us']['median']:.0f}",
                " / ".join(f"{share:.2f}" for share in row["master_shares"]),
                "" if versus is None else _mid(versus["invocations_per_s"], 2),
                "" if versus is None else f"{versus['server_cpu_us']['median']:.2f}",
                f"{row['implied_capacity_per_s']:,} / {row['busiest_master_capacity_per_s']:,}",
            )
    console.print(table)
    curve = section.get("curve")
    if curve:
        points = [
            f"{p['masters']} master{'s' if p['masters'] > 1 else ''}: "
            + (
                f"{p['busiest_master_capacity_per_s']:,} inv/s ({p['x_single']:g} x one server, "
                f"target {p['target_x_single']:g})"
                if p.get("measured")
                else f"not measured ({p.get('reason', '')})"
            )
            for p in curve
        ]
        console.print("Capacity curve (writer, busiest master; implied by the CPU, not measured):")
        for line in points:
            console.print(f"  {line}", highlight=False)


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
