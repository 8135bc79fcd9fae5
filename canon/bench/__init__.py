"""The performance benchmark behind ``canon bench`` and ``scripts/bench.py``.

See docs/performance.md for what each section measures and the figures of one machine.
"""

from canon.bench.report import evaluate_goals, goal_lines
from canon.bench.runner import SCHEMA, BenchOptions, run_benchmark
from canon.bench.tables import render

__all__ = ["SCHEMA", "BenchOptions", "evaluate_goals", "goal_lines", "render", "run_benchmark"]
