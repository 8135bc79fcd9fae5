"""The checked-in lifecycle diagram is generated from the machine and must stay current."""

from __future__ import annotations

import importlib.util
import pathlib
from types import ModuleType

import pytest

from machine import lifecycle
from machine.codes import Stage

ROOT = pathlib.Path(__file__).parents[2]
PAGE = ROOT / "docs" / "lifecycle.md"


def _renderer() -> ModuleType:
    path = ROOT / "scripts" / "render_diagram.py"
    spec = importlib.util.spec_from_file_location("render_diagram", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checked_in_diagram_matches_the_machine() -> None:
    """docs/lifecycle.md is exactly what scripts/render_diagram.py renders from the machine."""
    assert PAGE.read_text("utf-8") == _renderer().render()


def test_diagram_names_every_transition_of_the_machine() -> None:
    """Every (stage, event) -> stage pair of the machine appears as a diagram edge."""
    text = PAGE.read_text("utf-8")
    assert lifecycle.TRANSITIONS
    for (source, trigger), dest in lifecycle.TRANSITIONS.items():
        assert f"    {source.value} --> {dest.value}: {trigger}\n" in text


def test_a_changed_machine_makes_the_checked_in_diagram_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Adding a transition changes the rendering, so the page check would fail."""
    monkeypatch.setitem(lifecycle.TRANSITIONS, (Stage.READY, "Failed"), Stage.ERROR)
    renderer = _renderer()
    assert renderer.render() != PAGE.read_text("utf-8")
    assert renderer.main(["--check"]) == 1


def test_check_mode_passes_on_the_current_page() -> None:
    """``render_diagram.py --check`` exits 0 while the page is current."""
    assert _renderer().main(["--check"]) == 0
