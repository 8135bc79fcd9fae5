"""``scripts/bench.py`` runs every benchmark: ``canon bench``'s, and three more by name.

The measurements' code lives in ``canon/bench/`` with the benchmark's; this proves the one
entry point reaches each, and that one of them runs end to end. No timing is asserted.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _bench(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``scripts/bench.py`` with ``args`` (never on a server named by REDIS_URL)."""
    env = {name: value for name, value in os.environ.items() if name != "REDIS_URL"}
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.mark.parametrize(
    ("name", "option"),
    [("governed", "--reason-chars"), ("mcp-proxy", "--protocol"), ("cluster-write", "--split")],
)
def test_each_measurement_is_reached_by_its_name(name: str, option: str) -> None:
    """``scripts/bench.py NAME --help`` is that measurement's own parser, not canon bench's."""
    done = _bench(name, "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(f"usage: scripts/bench.py {name} ")
    assert option in done.stdout


def test_without_a_name_it_is_canon_bench() -> None:
    """Any other first argument goes to ``canon bench``, as before the measurements moved."""
    done = _bench("--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: canon bench ")
    assert "--archive-only" in done.stdout


def test_the_governed_measurement_runs_and_prints_its_four_figures() -> None:
    """A small run on its private server prints each figure: median (min .. max), in µs."""
    done = _bench("governed", "--calls", "5", "--rounds", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    figures = [line.split()[0] for line in done.stdout.splitlines() if " us (" in line]
    assert figures == ["approve_redis_us", "permit_redis_us", "approve_wall_us", "permit_wall_us"]
