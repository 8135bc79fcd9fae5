"""The session-wide log scan (tests/support/log_scan.py) sees every kind of log the suite emits:
plain structlog events, events captured by capture_logs, events after a CLI reconfigures
logging in-process, and stdlib records; and it flags forbidden fragments and traces.

Its end-of-session probe is tested on sessions of their own: a child pytest process runs
the real scan plugin (as its conftest) on a few generated test files.
"""

from __future__ import annotations

import logging
import pathlib
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest
import structlog
from structlog.testing import capture_logs

from canon.logging_setup import configure_logging
from tests.support.log_scan import LOG_SCAN, forbid_in_logs, probe_scan

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


def test_the_session_probe_reaches_the_scan() -> None:
    """In this very session, the probe's structlog event and stdlib record are both scanned."""
    events, records = LOG_SCAN.structlog_events, LOG_SCAN.stdlib_records
    assert probe_scan() == []
    assert (LOG_SCAN.structlog_events, LOG_SCAN.stdlib_records) == (events + 1, records + 1)


_CHILD_SETTINGS = """[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = session
asyncio_default_test_loop_scope = session
filterwarnings = error
"""

_QUIET_TESTS = """import pytest

@pytest.mark.parametrize("number", range(200))
def test_logs_nothing(number):
    assert number >= 0
"""

_UNWIRING_TESTS = {
    "structlog": """import structlog

def test_takes_the_scan_out_of_the_chain():
    processors = structlog.get_config()["processors"]
    processors[:] = [p for p in processors if getattr(p, "__name__", "") != "scan_event"]
""",
    "stdlib": """import logging

def test_takes_the_scan_off_the_root_logger():
    root = logging.getLogger()
    for handler in [h for h in root.handlers if type(h).__name__ == "ScanHandler"]:
        root.removeHandler(handler)
""",
}


_LEAKING_TESTS = """import pytest
import structlog

@pytest.mark.parametrize("number", range(20))
def test_logs_one_event(number):
    detail = "PAYLOAD-MARKER" if number == 13 else "nothing to see"
    structlog.get_logger("child").info("probe_logged", detail=detail)
"""


def run_child_session(
    tmp_path: pathlib.Path, tests: str, *options: str
) -> subprocess.CompletedProcess[str]:
    """Run pytest in a child process on ``tests`` with the suite's log scan as its conftest.

    ``options`` go to pytest (``-n 2``: two pytest-xdist workers, as the suite runs).
    """
    plugin = pathlib.Path(__file__).parents[1] / "support" / "log_scan.py"
    shutil.copy(plugin, tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text(_CHILD_SETTINGS)
    (tmp_path / "test_child.py").write_text(tests)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options, str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def test_a_focused_run_of_tests_that_log_nothing_passes(tmp_path: pathlib.Path) -> None:
    """200 passing tests without a single log event: the scan does not fail the run.

    (The scan used to demand 500 events from any session of 200 tests or more.)
    """
    child = run_child_session(tmp_path, _QUIET_TESTS)
    assert child.returncode == 0, child.stdout[-2000:]
    assert "200 passed" in child.stdout
    assert "log scan FAILED" not in child.stdout


@pytest.mark.parametrize("path", _UNWIRING_TESTS)
def test_a_scan_that_stops_receiving_logs_fails_the_run(tmp_path: pathlib.Path, path: str) -> None:
    """A test that cuts the scan off a logging path passes, but the session fails, naming it."""
    child = run_child_session(tmp_path, _UNWIRING_TESTS[path])
    assert child.returncode == pytest.ExitCode.TESTS_FAILED, child.stdout[-2000:]
    assert "1 passed" in child.stdout
    assert "log scan FAILED: a probe of" in child.stdout
    assert "the scan is not receiving the logs" in child.stdout


def test_with_workers_a_leak_in_either_worker_fails_the_run(tmp_path: pathlib.Path) -> None:
    """Under two pytest-xdist workers the controller adds up both scans: the one leak fails
    the run, named with its test, and the summary counts every test of the session."""
    child = run_child_session(tmp_path, _LEAKING_TESTS, "-n", "2")
    assert child.returncode == pytest.ExitCode.TESTS_FAILED, child.stdout[-2000:]
    assert "20 passed" in child.stdout
    assert "20 tests, 1 leaks" in child.stdout
    assert "log scan FAILED: test_child.py::test_logs_one_event[13]" in child.stdout


@pytest.mark.parametrize("path", _UNWIRING_TESTS)
def test_with_workers_a_scan_cut_off_in_a_worker_fails_the_run(
    tmp_path: pathlib.Path, path: str
) -> None:
    """A worker whose scan stops receiving logs fails the whole run, which names the worker."""
    child = run_child_session(tmp_path, _UNWIRING_TESTS[path], "-n", "2")
    assert child.returncode == pytest.ExitCode.TESTS_FAILED, child.stdout[-2000:]
    assert "1 passed" in child.stdout
    assert "log scan FAILED: a probe of" in child.stdout
    assert "(worker gw" in child.stdout
