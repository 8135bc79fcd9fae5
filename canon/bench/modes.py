"""The ways the throughput section writes one invocation, as data.

Each mode has a permanent key (the report's JSON), a label (the tables), the letter its
run ids start with (so the modes of one repeat never share a run) and whether plain
threads drive it instead of asyncio tasks. docs/performance.md says what each one runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class Mode:
    """One way to write invocations.

    Attributes:
        key: its name in the JSON report.
        label: its name in the tables.
        letter: first character of its run ids.
        threads: driven by N plain threads (N = the concurrency), not N asyncio tasks.

    """

    key: str
    label: str
    letter: str
    threads: bool = False


MODES: Final = (
    Mode("minimal_naive", "minimal naive", "n"),
    Mode("minimal_sync", "minimal sync", "s", threads=True),
    Mode("minimal_pipelined", "minimal pipelined", "p"),
    Mode("script_floor", "script floor", "f"),
    Mode("script_ceiling", "script ceiling", "c"),
    Mode("writer", "writer", "w"),
    Mode("boundary", "boundary", "b"),
    Mode("boundary_def_tool", "boundary def tool", "d"),
    Mode("sync_boundary", "sync boundary", "y", threads=True),
)
BY_KEY: Final = {mode.key: mode for mode in MODES}
#: The order the modes run in within one repeat: each goal's mode beside the floor it is
#: compared with (the boundary between the minimal floor, naive, and the minimal floor,
#: sync; the writer beside the script floor), since a shared machine's speed drifts over
#: seconds and a pair's two windows should see the same machine. See :func:`run_order`.
RUN_ORDER: Final = (
    "minimal_pipelined",
    "script_ceiling",
    "writer",
    "script_floor",
    "minimal_naive",
    "boundary",
    "minimal_sync",
    "boundary_def_tool",
    "sync_boundary",
)
#: The modes every other is compared with, pair by pair, in the report's ``ratios``.
REFERENCES: Final = ("minimal_naive", "minimal_sync", "script_floor")
#: The metrics those ratios are taken of.
RATIO_METRICS: Final = ("invocations_per_s", "p99_ms", "client_cpu_us", "server_cpu_us")
#: Modes whose latencies are of a whole pipeline of invocations, not of one append.
PIPELINED: Final = frozenset({"minimal_pipelined", "script_ceiling"})


def run_order(repeat: int) -> tuple[str, ...]:
    """The modes' keys in the order repeat ``repeat`` runs them: forward, then backward.

    Reversing every other repeat keeps neighbours side by side and puts each mode of a
    pair first as often as second, so a drift that is steady over a pair of repeats adds
    as much to one mode as to the other (an A-B-B-A design).
    """
    return RUN_ORDER if repeat % 2 == 0 else RUN_ORDER[::-1]
