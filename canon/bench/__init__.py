"""Every benchmark: ``canon bench``'s, and the measurements ``scripts/bench.py`` runs by name.

``canon bench`` (and ``scripts/bench.py`` with no name) runs the sections, its scale-out
one on a private cluster (:mod:`.embedded_cluster`); ``scripts/bench.py governed``,
``mcp-proxy`` and ``cluster-write`` run :mod:`.governed`, :mod:`.proxy_cost` and
:mod:`.cluster_write`. See docs/performance.md for what each measures and the figures of
one machine.
"""

from canon.bench.report import evaluate_goals, goal_lines
from canon.bench.runner import SCHEMA, BenchOptions, run_archive_benchmark, run_benchmark
from canon.bench.tables import render

__all__ = [
    "SCHEMA",
    "BenchOptions",
    "evaluate_goals",
    "goal_lines",
    "render",
    "run_archive_benchmark",
    "run_benchmark",
]
