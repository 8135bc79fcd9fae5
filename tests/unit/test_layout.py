"""The layout holds: dependencies point one way (machine <- eventstore <- projections <-
canon), and inside a package its rooms (a subpackage, or a module of its own) import each
other without a cycle."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).parents[2]
#: Each package, in dependency order: one may import only those listed before it.
ORDER = ("machine", "eventstore", "projections", "canon")


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


def room_of(module: str) -> str:
    """The room of a dotted module name: its package's subpackage, else the module itself."""
    return ".".join(module.split(".")[:2])


def room_imports(package: str) -> dict[str, set[str]]:
    """Which rooms of ``package`` each room imports (absolute imports, other rooms only)."""
    graph: dict[str, set[str]] = {}
    for path in modules(package):
        room = room_of(".".join(path.relative_to(ROOT).with_suffix("").parts))
        targets = graph.setdefault(room, set())
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                target = room_of(node.module)
                if target.split(".")[0] == package and target not in (room, package):
                    targets.add(target)
    return graph


def cycle_in(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` as a path that starts and ends at the same room, else []."""
    done: set[str] = set()

    def visit(room: str, path: list[str]) -> list[str]:
        if room in path:
            return [*path[path.index(room) :], room]
        if room in done:
            return []
        for target in sorted(graph.get(room, ())):
            found = visit(target, [*path, room])
            if found:
                return found
        done.add(room)
        return []

    for room in sorted(graph):
        found = visit(room, [])
        if found:
            return found
    return []


@pytest.mark.parametrize("package", ["eventstore", "projections"])
def test_rooms_import_each_other_without_a_cycle(package: str) -> None:
    """A room may use a room below it, never one that uses it back (no cycle at any depth)."""
    graph = room_imports(package)
    assert len(graph) > 5, graph
    assert cycle_in(graph) == []


def test_a_cycle_is_found() -> None:
    """The cycle finder itself finds a cycle three rooms long, and none in a chain."""
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": set()}) == []


@pytest.mark.parametrize(
    ("room", "concern"),
    [
        ("eventstore.boundary", "the harness-facing call path"),
        ("eventstore.wire", "how bytes reach Redis"),
        ("eventstore.server", "the Redis server itself"),
        ("eventstore.audit", "audit"),
        ("projections.receipts", "receipts"),
        ("projections.worker", "the worker runtime"),
    ],
)
def test_each_concern_has_a_room_that_says_what_it_owns(room: str, concern: str) -> None:
    """Each concern is one folder whose docstring names it, so a reader finds its owner."""
    init = ROOT.joinpath(*room.split("."), "__init__.py")
    docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
    assert concern.lower() in docstring.lower()
