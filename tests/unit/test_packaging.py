"""What ships: the built wheel carries every Lua script and typing marker."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).parents[2]


def test_wheel_contains_every_lua_script_and_py_typed(tmp_path: pathlib.Path):
    """A script or marker missing from the package data fails here, not at a user's site."""
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
    assert expected, "no Lua scripts found in the source tree"
    assert expected <= names, sorted(expected - names)
