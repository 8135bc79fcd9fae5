"""The layout holds: dependencies point one way (machine <- eventstore <- projections <-
canon) and no product module grows past 400 lines."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).parents[2]
#: Each package, in dependency order: one may import only those listed before it.
ORDER = ("machine", "eventstore", "projections", "canon")
MAX_LINES = 400


def modules(package: str) -> list[pathlib.Path]:
    """Every Python file of one product package."""
    return sorted((ROOT / package).rglob("*.py"))


def imported_packages(path: pathlib.Path) -> set[str]:
    """The top-level packages a module imports (absolute imports only; ours use no others)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", ORDER)
def test_dependencies_point_one_way(package: str) -> None:
    """A package imports none of the packages built on it (no arrow back up)."""
    above = set(ORDER[ORDER.index(package) + 1 :])
    assert modules(package), package
    wrong = {
        str(path.relative_to(ROOT)): sorted(imported_packages(path) & above)
        for path in modules(package)
        if imported_packages(path) & above
    }
    assert wrong == {}


def test_no_product_module_is_over_400_lines() -> None:
    """Modules own one thing; one past 400 lines is split."""
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for package in ORDER
        for path in modules(package)
    }
    assert len(sizes) > 50
    assert {path: lines for path, lines in sizes.items() if lines > MAX_LINES} == {}
