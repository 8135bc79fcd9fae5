"""``configure_logging``: JSON lines in production, readable lines in a terminal."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import structlog

from canon.logging_setup import add_utc_timestamp, configure_logging


class Terminal(io.StringIO):
    """A captured standard error that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore_structlog() -> Iterator[None]:
    """Put back the structlog configuration each test replaces (other tests depend on it);
    the root handler configure_logging adds is removed by the suite's conftest."""
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


def test_the_timestamp_is_utc_iso_8601_with_microseconds_at_a_fixed_width(
    monkeypatch: pytest.MonkeyPatch,
):
    """Each line's time is now in UTC, ``YYYY-MM-DDTHH:MM:SS.ffffffZ``, also on a whole
    second and across a change of second (the date part is kept between lines)."""
    seconds = iter(
        [1_764_650_000_000_000_000, 1_764_650_000_123_456_789, 1_764_650_061_000_001_000]
    )
    monkeypatch.setattr("time.time_ns", lambda: next(seconds))
    stamps = [add_utc_timestamp(None, "info", {})["timestamp"] for _ in range(3)]

    assert stamps == [
        "2025-12-02T04:33:20.000000Z",
        "2025-12-02T04:33:20.123456Z",
        "2025-12-02T04:34:21.000001Z",
    ]


def test_the_timestamp_reads_back_as_the_time_it_was_written(monkeypatch: pytest.MonkeyPatch):
    """Parsed as ISO 8601, a line's timestamp is the wall-clock time it was logged at."""
    before = datetime.now(UTC)
    entry = json.loads(emit_with(io.StringIO(), monkeypatch, json=True).splitlines()[0])
    after = datetime.now(UTC)

    stamped = datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00"))
    assert before - timedelta(milliseconds=1) <= stamped <= after + timedelta(milliseconds=1)


def test_json_writes_a_value_json_has_no_type_for_as_its_repr(monkeypatch: pytest.MonkeyPatch):
    """An odd field value still gives one JSON line: the value as its ``repr``."""
    monkeypatch.setattr("sys.stderr", io.StringIO())
    configure_logging(json=True)
    structlog.get_logger("test").info("odd_value", value=Decimal("1.5"), when=object)
    entry = json.loads(sys.stderr.getvalue())

    assert (entry["event"], entry["value"], entry["when"]) == ("odd_value", "1.5", repr(object))


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


def test_stdlib_records_follow_the_format_without_traces(monkeypatch: pytest.MonkeyPatch):
    """A record of another library's stdlib logger (uvicorn's, with an exception) is one
    JSON line naming its logger and the exception's type, never a traceback."""
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    configure_logging(json=True)
    try:
        raise ConnectionResetError("peer went away")
    except ConnectionResetError as exc:
        record = logging.getLogger("uvicorn.error").makeRecord(
            "uvicorn.error",
            logging.WARNING,
            __file__,
            1,
            "Invalid HTTP request received.",
            (),
            (type(exc), exc, exc.__traceback__),
        )
    # Handed to the installed handler alone: the session's log scan (also on the root
    # logger) would rightly report the trace this record carries on its way in.
    (handler,) = [h for h in logging.getLogger().handlers if h.get_name() == "canon.stdlib"]
    handler.handle(record)
    lines = stderr.getvalue().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0] and "peer went away" not in lines[0]
    event = json.loads(lines[0])
    assert event["event"] == "Invalid HTTP request received."
    assert (event["logger"], event["level"], event["error"]) == (
        "uvicorn.error",
        "warning",
        "ConnectionResetError",
    )
