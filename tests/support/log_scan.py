"""The session-wide log scan, loaded as a plugin by tests/conftest.py.

Every structlog event (also those a test captures with ``capture_logs``) and every stdlib
log record emitted during the session is checked, as it is emitted, for fragments that
must never be logged. A hit fails the run at the end of the session, naming the test.
The check cannot pass vacuously: at session end one probe event goes through the chain
that is configured then (the one every library logger uses) and one probe record through
the stdlib root logger; the run fails unless the scan counted both. Counting the session's
events instead would depend on which tests were selected.

With pytest-xdist each worker scans what its own tests log and probes its own chain at
its end; the controller adds up what every worker saw, so one leak or one unwired probe
anywhere fails the run, and the summary line counts the whole session.

Tests import :data:`LOG_FORBIDDEN` and :func:`forbid_in_logs` from here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import structlog
import structlog.testing

#: Fragments no log may contain: the suites' payload markers, the run-token prefix, a
#: Redis key's hash tag and stack traces. Tests add their passwords with forbid_in_logs.
LOG_FORBIDDEN: list[str] = ["PAYLOAD-MARKER", "SECRET-", "cr1:", ":{s", "Traceback"]
#: Event fields that carry a stack trace or exception details.
_TRACE_FIELDS = ("exc_info", "exception", "exc_text", "stack", "stack_info")


@dataclass
class LogScan:
    """What the session's log scan has seen so far."""

    structlog_events: int = 0
    stdlib_records: int = 0
    tests: int = 0
    current_test: str = "(collection)"
    leaks: list[str] = field(default_factory=list)
    #: What the end-of-session probe found not scanned (empty: the scan is wired).
    unwired: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """What a pytest-xdist worker hands its controller at its end."""
        return {
            "structlog_events": self.structlog_events,
            "stdlib_records": self.stdlib_records,
            "tests": self.tests,
            "leaks": self.leaks,
            "unwired": self.unwired,
        }

    def add(self, worker: str, seen: dict[str, Any]) -> None:
        """Add what the worker named ``worker`` saw (its :meth:`to_json`)."""
        self.structlog_events += seen["structlog_events"]
        self.stdlib_records += seen["stdlib_records"]
        self.tests += seen["tests"]
        self.leaks += seen["leaks"]
        self.unwired += [f"{part} (worker {worker})" for part in seen["unwired"]]

    def check(self, source: str, text: str, has_trace: bool) -> None:
        """Record a leak for each forbidden fragment in ``text`` (and for a trace)."""
        found = [marker for marker in LOG_FORBIDDEN if marker in text]
        if has_trace:
            found.append("a stack trace")
        for marker in found:
            self.leaks.append(f"{self.current_test}: {source} contains {marker!r}: {text[:400]}")


LOG_SCAN = LogScan()


def forbid_in_logs(*fragments: str) -> None:
    """Add fragments (a test's passwords, markers) that no log of the session may contain."""
    LOG_FORBIDDEN.extend(fragment for fragment in fragments if fragment not in LOG_FORBIDDEN)


def scan_event(_logger: Any, _method: str, event_dict: Any) -> Any:
    """structlog processor: scan the event as it goes by, unchanged."""
    LOG_SCAN.structlog_events += 1
    trace = any(event_dict.get(name) for name in _TRACE_FIELDS)
    LOG_SCAN.check("structlog event", repr(dict(event_dict)), trace)
    return event_dict


class ScanHandler(logging.Handler):
    """stdlib handler on the root logger: scan every record that reaches it."""

    def emit(self, record: logging.LogRecord) -> None:
        LOG_SCAN.stdlib_records += 1
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is still scanned by its raw parts
            message = f"{record.msg!r} {record.args!r}"
        trace = bool(record.exc_info or record.exc_text or record.stack_info)
        LOG_SCAN.check(f"log record {record.name}", message, trace)


def _with_scan(processors: Any) -> list[Any]:
    """The processors with :func:`scan_event` just before the last one (the renderer)."""
    chain = [processor for processor in processors if processor is not scan_event]
    return [*chain[:-1], scan_event, *chain[-1:]]


_original_configure = structlog.configure
_original_capture = structlog.testing.LogCapture.__call__


def _configure_with_scan(*args: Any, **kwargs: Any) -> None:
    # Whoever configures structlog in-process (canon.logging_setup, a CLI run) keeps the scan.
    if kwargs.get("processors") is not None:
        kwargs["processors"] = _with_scan(kwargs["processors"])
    _original_configure(*args, **kwargs)


def _capture_with_scan(self: Any, logger: Any, method: str, event_dict: Any) -> Any:
    scan_event(logger, method, event_dict)
    return _original_capture(self, logger, method, event_dict)


_SCAN_HANDLER = ScanHandler(level=logging.NOTSET)


def pytest_configure(config: pytest.Config) -> None:
    """Install the log scan for the whole session."""
    structlog.configure = _configure_with_scan  # type: ignore[assignment]
    structlog.testing.LogCapture.__call__ = _capture_with_scan  # type: ignore[method-assign]
    processors = structlog.get_config()["processors"]
    processors[:] = _with_scan(processors)  # in place: bound loggers hold this list
    logging.getLogger().addHandler(_SCAN_HANDLER)
    # Library events that take the stdlib path (structlog not configured yet) are built
    # at every level, so the scan sees them too.
    logging.getLogger("canon").setLevel(logging.DEBUG)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the log scan."""
    structlog.configure = _original_configure  # type: ignore[assignment]
    structlog.testing.LogCapture.__call__ = _original_capture  # type: ignore[method-assign]
    logging.getLogger().removeHandler(_SCAN_HANDLER)
    logging.getLogger("canon").setLevel(logging.NOTSET)


@pytest.fixture(autouse=True)
def _no_cli_log_handler_left() -> Iterator[None]:
    """Remove the root handler a ``canon`` command run in-process installs for its process
    (here the test session), once the test is over. Only that one, by name: a test that
    cuts the scan's own handler off must still fail the session."""
    yield
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h.get_name() == "canon.stdlib"]:
        root.removeHandler(handler)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Name the running test in leak reports; count the tests run."""
    LOG_SCAN.current_test = item.nodeid
    LOG_SCAN.tests += 1


def probe_scan() -> list[str]:
    """Send one probe through each logging path; return the paths the scan did not see.

    The structlog probe runs the processors configured now (the list every library logger
    binds to) at CRITICAL, which every level filter lets through, into a logger that
    returns its output instead of printing it.
    """
    unwired: list[str] = []
    config = structlog.get_config()
    events = LOG_SCAN.structlog_events
    probe = structlog.wrap_logger(
        structlog.ReturnLogger(),
        processors=config["processors"],
        wrapper_class=config["wrapper_class"],
        context_class=config["context_class"],
    )
    probe.critical("log_scan_probed")
    if LOG_SCAN.structlog_events == events:
        unwired.append("structlog events")
    records = LOG_SCAN.stdlib_records
    logging.getLogger("tests.log_scan").critical("log scan probe")
    if LOG_SCAN.stdlib_records == records:
        unwired.append("stdlib log records")
    return unwired


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist controller: add up what a finished worker's scan saw."""
    seen, name = getattr(node, "workeroutput", {}).get("log_scan"), node.gateway.id
    if seen is None:  # a worker that crashed before its end reported nothing
        LOG_SCAN.unwired.append(f"every log of worker {name}")
    else:
        LOG_SCAN.add(name, seen)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if any log leaked, or if the scan no longer receives the logs."""
    LOG_SCAN.current_test = "(session end)"
    LOG_SCAN.unwired += probe_scan()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: its controller decides
        workeroutput["log_scan"] = LOG_SCAN.to_json()
    if LOG_SCAN.leaks or LOG_SCAN.unwired:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Report what the log scan saw and every leak it found."""
    scan = LOG_SCAN
    terminalreporter.write_line(
        f"log scan: {scan.structlog_events} structlog events, {scan.stdlib_records} log "
        f"records, {scan.tests} tests, {len(scan.leaks)} leaks"
    )
    if scan.unwired:
        terminalreporter.write_line(
            f"log scan FAILED: a probe of {' and '.join(scan.unwired)} was not scanned; "
            "the scan is not receiving the logs",
            red=True,
        )
    for leak in scan.leaks[:50]:
        terminalreporter.write_line(f"log scan FAILED: {leak}", red=True)
