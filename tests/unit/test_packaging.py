"""What ships: the built wheel carries every package, Lua script, template and typing marker."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).parents[2]
PACKAGES = ("machine", "eventstore", "projections", "canon")


def test_wheel_contains_every_module_script_template_and_py_typed(tmp_path: pathlib.Path):
    """A module, script, template or marker missing from the wheel fails here, not at a
    user's site."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {p.relative_to(ROOT).as_posix() for p in ROOT.glob("*/scripts/*.lua")}
    expected |= {f"{package}/py.typed" for package in ("machine", "eventstore", "projections")}
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
