"""The benchmark's archive section runs end to end on both databases, at a tiny size.

This proves the section's code path (the worker in its own process, the commit times it
reports, the bulk load through the archive's write path, every query shape, the goals
and the tables), not how fast anything is: no timing is asserted, and no goal's status.
The figures come from ``canon bench --archive-only`` (docs/performance.md). It runs
once, on a Redis server of its own (the section's path does not change with the
server's version), as the benchmark does.
"""

from __future__ import annotations

import random

from rich.console import Console

from canon.bench.archive import ArchiveOptions, measure_archive, query_shapes
from canon.bench.report import ARCHIVE_GOALS, evaluate_goals
from canon.bench.tables import render
from eventstore.server.embedded import EmbeddedRedis
from tests.support.postgres import postgres_url  # noqa: F401 (a fixture)

#: A write rate any machine keeps up with: the section's path, not its speed.
RATE_PER_S = 100.0


async def test_the_archive_section_measures_lag_search_and_sizes_on_both_databases(
    postgres_url: str,  # noqa: F811 (the fixture's name)
) -> None:
    """Every call written is archived and timed, every query shape runs on the bulk-built
    calls, the sizes are counted, and the report is judged and printed."""
    options = ArchiveOptions(
        lag_duration_s=0.3,
        lag_fractions=(1.0,),
        search_calls=300,
        queries=1,
        boundary_repeats=1,
        boundary_duration_s=0.2,
        postgres_url=postgres_url,
    )
    said: list[str] = []
    with EmbeddedRedis() as server:
        section = await measure_archive(server.url, options, said.append, rate_per_s=RATE_PER_S)

    assert section["measured"] is True and section["rate_per_s"] == RATE_PER_S
    for backend in ("sqlite", "postgresql"):
        figures = section[backend]
        assert "lag" in figures, figures
        lag = figures["lag"]["1"]
        assert lag["invocations"] > 0 and lag["pending"] == 0
        assert lag["archived"] == lag["invocations"]
        assert 0 < lag["p50_ms"] <= lag["p99_ms"] <= lag["max_ms"]
        assert lag["bytes_per_call"] > 0 and lag["worker_cpu_us_per_call"] > 0
        search = figures["search"]
        assert search["calls"] == 300 and search["bytes_per_call"] > 0
        assert set(search["queries"]) == set(query_shapes(0, random.Random()))
        for shape in search["queries"].values():
            assert 0 < shape["p50_ms"] <= shape["max_ms"]
    assert section["postgresql"]["where"] == "the given server"

    report = {"only": "archive", "quick": True, "archive": section}
    goals = evaluate_goals(report)
    assert [goal["goal"] for goal in goals] == [goal.name for goal in ARCHIVE_GOALS]
    assert {goal["status"] for goal in goals} <= {"PASS", "SHORT"}
    console = Console(record=True, width=200)
    environment = {"redis_version": "7", "server": "embedded", "cpus": 2}
    environment |= {"load_before": [0.0], "load_after": [0.0]}
    render({**report, "goals": goals, "environment": environment}, console)
    text = console.export_text()
    assert "Archive lag" in text and "Archive search" in text and "json_range" in text
