"""What ships: the built wheel carries every module, Lua script, template and typing marker."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).parents[2]
PACKAGES = ("machine", "eventstore", "projections", "canon")
#: Not the package's sources: the stacks' virtualenvs (.venv-stacks) are large and may be
#: being installed while this runs (scripts/test.sh), so the copy never walks them.
_NOT_SOURCE = (
    ".git",
    ".venv",
    ".venv-stacks",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
)


def test_wheel_contains_every_module_script_template_and_py_typed(tmp_path: pathlib.Path):
    """A module of a subpackage, a script, a template or a marker missing from the wheel
    fails here, not at a user's site."""
    # From a copy without build/: a stale build/lib of an earlier build would otherwise be
    # packed too and hide a module the package list leaves out.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        p.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for p in (ROOT / package).rglob("scripts/*.lua")
    }
    expected |= {f"{package}/py.typed" for package in PACKAGES}
    templates = {
        p.relative_to(ROOT).as_posix() for p in ROOT.glob("projections/console/templates/*.html")
    }
    modules = {
        p.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for p in (ROOT / package).rglob("*.py")
    }
    assert templates and modules and expected, "nothing found in the source tree"
    expected |= templates | modules
    assert expected <= names, sorted(expected - names)
