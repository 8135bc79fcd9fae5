"""The product's structure read from its imports: packages in dependency order, the rooms
of each (a subpackage, or a module of its own) and which rooms each imports.

Used by the layout test (``tests/unit/test_layout.py``) and drawn as text by
``scripts/structure.py``, for any checkout.
"""

from __future__ import annotations

import ast
import pathlib

#: Each package, in dependency order: one may import only those listed before it.
ORDER = ("machine", "eventstore", "projections", "canon")


def modules(root: pathlib.Path, package: str) -> list[pathlib.Path]:
    """Every Python file of one product package of the checkout at ``root``."""
    return sorted((root / package).rglob("*.py"))


def imported_packages(path: pathlib.Path) -> set[str]:
    """The top-level packages a module imports (absolute imports only; ours use no others)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def room_of(module: str) -> str:
    """The room of a dotted module name: its package's subpackage, else the module itself."""
    return ".".join(module.split(".")[:2])


def room_imports(root: pathlib.Path, package: str) -> dict[str, set[str]]:
    """Which rooms of ``package`` each room imports (absolute imports, other rooms only)."""
    graph: dict[str, set[str]] = {}
    for path in modules(root, package):
        room = room_of(".".join(path.relative_to(root).with_suffix("").parts))
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
