"""``configure_logging``: JSON lines in production, readable lines in a terminal."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest
import structlog

from canon.logs import configure_logging


class Terminal(io.StringIO):
    """A captured standard error that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore_structlog() -> Iterator[None]:
    """Put back the structlog configuration each test replaces (other tests depend on it)."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def emit_with(stderr: io.StringIO, monkeypatch: pytest.MonkeyPatch, **options: object) -> str:
    """Configure logging onto ``stderr``, log one INFO and one DEBUG event, return the text."""
    monkeypatch.setattr("sys.stderr", stderr)
    configure_logging(**options)  # type: ignore[arg-type]
    log = structlog.get_logger("test")
    log.info("invocation_finished", run_id="run-1", version=3, token="t0ken-value")
    log.debug("event_committed", run_id="run-1", version=1)
    return stderr.getvalue()


def test_json_renders_one_object_per_line_with_the_fields(monkeypatch: pytest.MonkeyPatch):
    """json=True writes each event as one JSON object carrying its fields, level and time."""
    text = emit_with(io.StringIO(), monkeypatch, json=True)

    [line] = text.splitlines()
    entry = json.loads(line)
    assert entry["event"] == "invocation_finished"
    assert (entry["run_id"], entry["version"], entry["level"]) == ("run-1", 3, "info")
    assert entry["timestamp"].endswith("Z")


def test_json_never_writes_a_secret_field(monkeypatch: pytest.MonkeyPatch):
    """A token field is replaced before rendering, so its value never leaves the process."""
    text = emit_with(io.StringIO(), monkeypatch, json=True)

    assert json.loads(text)["token"] == "<redacted>"
    assert "t0ken-value" not in text


def test_console_renders_a_readable_line_not_json(monkeypatch: pytest.MonkeyPatch):
    """json=False writes a human-readable line: the event name and key=value fields."""
    text = emit_with(io.StringIO(), monkeypatch, json=False)

    [line] = text.splitlines()
    assert "invocation_finished" in line
    assert "run_id=run-1" in line and "version=3" in line
    assert "\x1b[" not in line, "no colour codes when standard error is not a terminal"
    with pytest.raises(ValueError):
        json.loads(line)


def test_level_sets_the_lowest_level_written(monkeypatch: pytest.MonkeyPatch):
    """level="DEBUG" lets debug events through; the default INFO drops them."""
    debug = emit_with(io.StringIO(), monkeypatch, json=True, level="DEBUG")
    default = emit_with(io.StringIO(), monkeypatch, json=True)

    assert [json.loads(line)["event"] for line in debug.splitlines()] == [
        "invocation_finished",
        "event_committed",
    ]
    assert [json.loads(line)["event"] for line in default.splitlines()] == ["invocation_finished"]


def test_by_default_a_terminal_gets_coloured_console_lines(monkeypatch: pytest.MonkeyPatch):
    """Without json=, a standard error that is a terminal gets readable, coloured lines."""
    text = emit_with(Terminal(), monkeypatch)

    [line] = text.splitlines()
    assert "invocation_finished" in line and "\x1b[" in line
    with pytest.raises(ValueError):
        json.loads(line)


def test_by_default_anything_else_gets_json(monkeypatch: pytest.MonkeyPatch):
    """Without json=, a standard error that is a file or pipe (production) gets JSON lines."""
    text = emit_with(io.StringIO(), monkeypatch)

    [line] = text.splitlines()
    assert json.loads(line)["event"] == "invocation_finished"
