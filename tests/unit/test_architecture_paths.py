"""docs/architecture.md's table of packages and its layout block name files that exist."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).parents[2]
PAGE = ROOT / "docs" / "architecture.md"
#: A name of a file or folder as the page writes it: ``http_api.py``, ``scripts/*.lua``,
#: ``templates/``, ``canon/integrations/``.
_PATH = re.compile(r"^[\w*.-]+(?:/[\w*.-]+)*(?:\.(?:py|lua|js)|/)$")
_TOPS = ("machine/", "eventstore/", "projections/", "canon/", "tests/", "docs/")


def _exists(folder: str, name: str) -> bool:
    """Whether ``name`` (from the root when it starts with a package, else in ``folder``)
    names at least one file or folder."""
    base = ROOT if name.startswith(_TOPS) else ROOT / folder
    return any(base.glob(name.rstrip("/"))) if "*" in name else (base / name).exists()


def table_paths() -> list[tuple[str, str]]:
    """Each (folder, name) the package table names in backticks.

    A name is in its row's package, or in the folder the row named last (``the adapters
    in `canon/integrations/` (`openai.py`, ...)``).
    """
    text = PAGE.read_text()
    table = text.split("| package | what it holds | I/O |", 1)[1].split("\n\n", 1)[0]
    found: list[tuple[str, str]] = []
    for row in table.splitlines()[2:]:
        cells = row.split(" | ")
        folder = cells[0].strip("| `")
        found.append(("", folder))
        inside = folder
        for token in re.findall(r"`([^`]+)`", " | ".join(cells[1:])):
            if not _PATH.match(token):
                continue
            if token.endswith("/") and token.startswith(_TOPS):
                inside = token
            found.append((folder if _exists(folder, token) else inside, token))
    return found


def layout_paths() -> list[tuple[str, str]]:
    """Each (folder, name) of the layout block under "The parts": its folders, and the
    files named in a folder's description."""
    text = PAGE.read_text().split("## The parts", 1)[1]
    block = text.split("```\n", 2)[1]
    found: list[tuple[str, str]] = []
    folders: dict[int, str] = {}
    folder = ""
    for line in block.splitlines():
        named = re.match(r"^( *)([\w]+/)\s", line)
        if named is not None:
            depth = len(named.group(1))
            parent = folders.get(depth - 2, "") if depth else ""
            folder = parent + named.group(2)
            folders[depth] = folder
            found.append(("", folder))
        for token in re.findall(r"[\w]+\.py", line):
            found.append((folder, token))
    return found


def test_the_page_names_enough_paths_to_check() -> None:
    """The parsing finds the table's rows and the layout's folders (not vacuous)."""
    assert len(table_paths()) > 100
    assert ("", "eventstore/wire/") in layout_paths()
    assert ("projections/", "http_api.py") in layout_paths()


@pytest.mark.parametrize(("folder", "name"), table_paths(), ids=lambda value: value)
def test_every_path_the_table_names_exists(folder: str, name: str) -> None:
    """A file the table credits with a job is where it says."""
    assert _exists(folder, name), f"{folder}{name}"


@pytest.mark.parametrize(("folder", "name"), layout_paths(), ids=lambda value: value)
def test_every_path_the_layout_names_exists(folder: str, name: str) -> None:
    """A folder of the layout block, and each file named in its description, exists."""
    assert _exists(folder, name), f"{folder}{name}"


def rooms() -> list[str]:
    """Each package and each folder of one holding an ``__init__.py`` (a room)."""
    found: list[str] = []
    for package in ("machine", "eventstore", "projections", "canon"):
        found.append(f"{package}/")
        found.extend(
            f"{package}/{init.parent.relative_to(ROOT / package)}/"
            for init in sorted((ROOT / package).glob("*/__init__.py"))
        )
    return found


@pytest.mark.parametrize("room", rooms())
def test_the_layout_names_every_room(room: str) -> None:
    """Every room of the code is in the layout block (a new folder is drawn there)."""
    block = PAGE.read_text().split("## The parts", 1)[1].split("```\n", 2)[1]
    assert re.search(rf"(?<![\w/]){re.escape(room.split('/')[-2])}/", block), room
