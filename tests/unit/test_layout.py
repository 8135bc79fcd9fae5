"""The layout holds: dependencies point one way (machine <- eventstore <- projections <-
canon), and inside a package its rooms (a subpackage, or a module of its own) import each
other without a cycle."""

from __future__ import annotations

import ast
import pathlib
import runpy

import pytest

from tests.support import structure
from tests.support.structure import ORDER, cycle_in, imported_packages, room_imports

ROOT = pathlib.Path(__file__).parents[2]


def modules(package: str) -> list[pathlib.Path]:
    """Every Python file of one product package."""
    return structure.modules(ROOT, package)


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


@pytest.mark.parametrize("package", ["eventstore", "projections"])
def test_rooms_import_each_other_without_a_cycle(package: str) -> None:
    """A room may use a room below it, never one that uses it back (no cycle at any depth)."""
    graph = room_imports(ROOT, package)
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


#: Where output may be configured or written: the command's entry and what only it runs,
#: and the library's one logger. Everything else is library code inside someone's harness.
_MAY_PRINT_OR_CONFIGURE = (
    "eventstore/logs.py",
    "canon/cli.py",
    "canon/logging_setup.py",
    "canon/command_errors.py",
    "canon/connection.py",
    "canon/operator_credentials.py",
    "canon/service.py",
    "canon/commands/",
    "canon/demo/",
    "canon/bench/",
)


def _writes_output(path: pathlib.Path) -> list[str]:
    """The calls of ``path`` that take a logger of their own or print: ``line: call``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        function = node.func
        if isinstance(function, ast.Name) and function.id == "print":
            found.append(f"{node.lineno}: print")
        elif (
            isinstance(function, ast.Attribute)
            and function.attr == "get_logger"
            and isinstance(function.value, ast.Name)
            and function.value.id == "structlog"
        ):
            found.append(f"{node.lineno}: structlog.get_logger")
    return found


@pytest.mark.parametrize("package", ORDER)
def test_library_code_logs_through_the_one_logger_and_never_prints(package: str) -> None:
    """Library modules take their logger from eventstore.logs.get_logger (quiet unless the
    application configured logging) and never print: only the command's own modules do."""
    wrong = {}
    for path in modules(package):
        name = str(path.relative_to(ROOT))
        if name.startswith(_MAY_PRINT_OR_CONFIGURE):
            continue
        calls = _writes_output(path)
        if calls:
            wrong[name] = calls
    assert wrong == {}


def test_the_structure_script_draws_every_package_and_finds_a_cycle(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``scripts/structure.py`` prints each package with its rooms and exits 0 on this
    checkout; on a tree whose two rooms import each other it names the cycle, exit 1."""
    script = runpy.run_path(str(ROOT / "scripts" / "structure.py"))
    assert script["main"]([str(ROOT)]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines() if not line.startswith(" ")] == [
        *ORDER,
        "cycles:",
    ]
    assert "  eventstore.boundary " in out and out.endswith("cycles: none\n")
    for package in ORDER:
        (tmp_path / package).mkdir()
    (tmp_path / "eventstore" / "a.py").write_text("from eventstore.b import x\n")
    (tmp_path / "eventstore" / "b.py").write_text("from eventstore.a import y\n")
    assert script["main"]([str(tmp_path)]) == 1
    assert "CYCLE: eventstore.a -> eventstore.b -> eventstore.a" in capsys.readouterr().out
