"""The session-wide log scan (tests/conftest.py) sees every kind of log the suite emits:
plain structlog events, events captured by capture_logs, events after a CLI reconfigures
logging in-process, and stdlib records; and it flags forbidden fragments and traces."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog
from structlog.testing import capture_logs

from canon.logs import configure_logging
from tests.conftest import LOG_SCAN, forbid_in_logs

MARKER = "LOGSCAN-SELFTEST-7c1e"
forbid_in_logs(MARKER)


@pytest.fixture
def own_leaks() -> Iterator[list[str]]:
    """The leaks this test provokes on purpose; removed afterwards so the session passes."""
    before = len(LOG_SCAN.leaks)
    provoked: list[str] = []
    yield provoked
    provoked += LOG_SCAN.leaks[before:]
    LOG_SCAN.leaks[before:] = [leak for leak in LOG_SCAN.leaks[before:] if MARKER not in leak]


def provoked_since(before: int) -> list[str]:
    """Leaks recorded since ``before`` that this module provoked."""
    return [leak for leak in LOG_SCAN.leaks[before:] if MARKER in leak]


def test_structlog_events_are_scanned(own_leaks: list[str]) -> None:
    """A structlog event carrying a forbidden fragment is flagged with the test's name."""
    before, events = len(LOG_SCAN.leaks), LOG_SCAN.structlog_events
    structlog.get_logger("scan-test").warning("probe_logged", detail=f"x {MARKER} y")
    assert LOG_SCAN.structlog_events == events + 1
    [leak] = provoked_since(before)
    assert "test_structlog_events_are_scanned" in leak


def test_captured_events_are_scanned(own_leaks: list[str]) -> None:
    """Events a test captures with capture_logs are scanned too."""
    before = len(LOG_SCAN.leaks)
    with capture_logs() as logs:
        structlog.get_logger("scan-test").info("probe_logged", detail=MARKER)
    assert len(logs) == 1
    assert len(provoked_since(before)) == 1


def test_events_after_an_in_process_cli_configuration_are_scanned(own_leaks: list[str]) -> None:
    """configure_logging (what every CLI entry point calls) keeps the scan in the chain."""
    saved = structlog.get_config()
    before = len(LOG_SCAN.leaks)
    try:
        configure_logging(json=True, level="INFO")
        structlog.get_logger("scan-test").warning("probe_logged", detail=MARKER)
    finally:
        structlog.configure(**saved)
    assert len(provoked_since(before)) == 1


def test_stdlib_records_and_traces_are_scanned(own_leaks: list[str]) -> None:
    """A stdlib record with a forbidden fragment, and one carrying a stack trace, are flagged."""
    before, records = len(LOG_SCAN.leaks), LOG_SCAN.stdlib_records
    logger = logging.getLogger("scan-test")
    logger.warning("record with %s", MARKER)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logger.exception("failed %s", MARKER)
    assert LOG_SCAN.stdlib_records == records + 2
    leaks = provoked_since(before)
    assert len(leaks) == 3  # the marker twice, the trace once
    assert any("a stack trace" in leak for leak in leaks)


def test_a_trace_in_a_structlog_event_is_flagged(own_leaks: list[str]) -> None:
    """A structlog event logged with exc_info counts as a leaked trace."""
    before = len(LOG_SCAN.leaks)
    try:
        raise ValueError("boom")
    except ValueError:
        structlog.get_logger("scan-test").exception("probe_failed", detail=MARKER)
    assert any("a stack trace" in leak for leak in provoked_since(before))
