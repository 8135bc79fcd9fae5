"""Within a repeat, each goal's mode runs beside the floor it is compared with."""

from __future__ import annotations

import pytest

from canon.bench.modes import MODES, run_order

#: The goals' pairs whose margins are narrow: (the mode judged, its floor).
CLOSE_PAIRS = [
    ("boundary", "minimal_naive"),
    ("boundary", "minimal_sync"),
    ("writer", "script_floor"),
]


@pytest.mark.parametrize("repeat", range(4))
def test_every_mode_runs_once_a_repeat(repeat: int):
    """A repeat runs each mode exactly once, whatever its direction."""
    assert sorted(run_order(repeat)) == sorted(mode.key for mode in MODES)


@pytest.mark.parametrize(("judged", "floor"), CLOSE_PAIRS)
@pytest.mark.parametrize("repeat", range(4))
def test_a_judged_mode_runs_next_to_its_floor(judged: str, floor: str, repeat: int):
    """The two windows of a goal's pair are neighbours, so they see the same machine."""
    order = run_order(repeat)

    assert abs(order.index(judged) - order.index(floor)) == 1


@pytest.mark.parametrize(("judged", "floor"), CLOSE_PAIRS)
def test_each_mode_of_a_pair_runs_first_in_every_other_repeat(judged: str, floor: str):
    """Forward, then backward: a steady drift adds as much to the floor as to the mode."""
    firsts = [run_order(r).index(judged) < run_order(r).index(floor) for r in range(4)]

    assert firsts in ([True, False, True, False], [False, True, False, True])
