"""The README's front door works as written."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).parents[2] / "README.md"


def test_first_lines_give_the_demo_and_test_commands():
    """The README opens with the set-up-and-run command and the test command."""
    lines = README.read_text().splitlines()
    block = "\n".join(lines[:6])
    assert "./scripts/demo.sh" in block and "./scripts/test.sh" in block
    ci = (README.parent / ".ci" / "run").read_text()
    assert "./scripts/test.sh" in ci


def test_harness_example_runs_as_written():
    """The harness example is as short as its heading says, runs, and prints only the result."""
    text = README.read_text()
    example = re.search(
        r"## A harness in seventeen lines of code\n\n```python\n(.*?)```", text, re.S
    )
    assert example is not None
    assert len([line for line in example.group(1).splitlines() if line.strip()]) <= 17
    result = subprocess.run(
        [sys.executable, "-c", example.group(1)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    # The library writes nothing to stdout: the example's own line is all there is.
    [line] = result.stdout.splitlines()
    assert line.startswith("ToolResult(result={'titles': ['Refund policy']}")
    assert "Refunds within 30 days" not in result.stdout


def test_sync_example_runs_as_written():
    """The sync example runs from plain threads' code and prints only the bounded result."""
    text = README.read_text()
    example = re.search(r"## The same harness without asyncio\n\n```python\n(.*?)```", text, re.S)
    assert example is not None
    assert len(example.group(1).splitlines()) <= 25
    result = subprocess.run(
        [sys.executable, "-c", example.group(1)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    [line] = result.stdout.splitlines()
    assert line.startswith("ToolResult(result={'titles': ['Refund policy']}")
    assert "Refunds within 30 days" not in result.stdout


def test_the_opening_names_every_event_and_machine_exports_them():
    """Before its first example the README names each event of machine/events.py, and
    ``machine`` exports each event class."""
    import machine
    from machine.events import EVENT_CLASSES, EVENT_TYPES

    opening = README.read_text().split("\n## ", 1)[0]
    assert len(EVENT_TYPES) >= 13  # not vacuous: the lifecycle, governed and lapsed events
    for name in EVENT_TYPES:
        assert f"`{name}`" in opening, name
    for event in EVENT_CLASSES:
        assert event.__name__ in machine.__all__, event.__name__
