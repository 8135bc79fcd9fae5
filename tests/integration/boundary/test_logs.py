"""Safe errors and logs: no payload, token, exception text, Redis key or trace ever leaks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import timedelta
from typing import Any

import msgspec
import pytest
import structlog
from structlog.testing import capture_logs

from eventstore import Limits, Projection, RunContext, Store, ToolBoundary, ToolCall, ToolEnvelope
from eventstore.server.embedded import EmbeddedRedis, ServerBinary
from machine.codes import ErrorCode
from machine.ids import invocation_id
from tests.support.calls import RUN, TOOL, outcome
from tests.support.tools import FakeTool

pytestmark = pytest.mark.backends("single", "cluster")

#: Recognisable secret markers, one per place a secret can hide.
REQUEST = "SECRET-REQUEST-d41c"
RAW = "SECRET-RAW-9be2"
RESULT = "SECRET-RESULT-77a0"
EXCEPTION = "SECRET-EXCEPTION-5c1f"
EVIDENCE = "SECRET-EVIDENCE-e03b"
SCOPE = "SECRET-SCOPE-31aa"
SECRETS = (REQUEST, RAW, RESULT, EXCEPTION, EVIDENCE, SCOPE)
FINISHED_FIELDS = {"run_id", "tool_call_id", "invocation_id", "status", "error_code", "version"}


class Leaky:
    """A value JSON cannot encode whose repr carries a secret."""

    def __repr__(self) -> str:
        return f"Leaky({RAW} {RESULT})"


def leaks(text: bytes | str, forbidden: tuple[str, ...], namespace: str) -> list[str]:
    """Which forbidden markers, key fragments or trace words appear in ``text``."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    markers = (*forbidden, namespace, "canon:", "{s", "Traceback", 'File "')
    return [marker for marker in markers if marker in text]


def assert_clean(
    logs: list[dict[str, Any]], replies: list[Any], token: str, namespace: str, *, result_ok: bool
) -> None:
    """Nothing secret in any captured entry; a READY reply carries only its result and scope."""
    assert logs, "nothing was logged"
    for entry in logs:
        assert not leaks(repr(entry), (*SECRETS, token), namespace), entry
        assert not {"exc_info", "exception", "stack_info"} & entry.keys(), entry
    for reply in replies:
        allowed = (RESULT, SCOPE) if result_ok and outcome(reply) == "READY" else ()
        forbidden = tuple(secret for secret in (*SECRETS, token) if secret not in allowed)
        assert not leaks(msgspec.json.encode(reply), forbidden, namespace), reply


def finished(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``invocation_finished`` entries, in order."""
    return [entry for entry in logs if entry["event"] == "invocation_finished"]


def named(logs: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    """The entries called ``event``, in order."""
    return [entry for entry in logs if entry["event"] == event]


def secret_call(call_id: str, tool: str = TOOL, **overrides: Any) -> ToolEnvelope:
    """An envelope whose input carries the request secret."""
    fields: dict[str, Any] = {
        "run_id": RUN,
        "tool_call_id": call_id,
        "tool": tool,
        "arguments": {"query": REQUEST, "password": REQUEST},
    }
    fields.update(overrides)
    return ToolEnvelope(**fields)


def projection(result: Any = RESULT, evidence: Any = "EVIDENCE_FOUND") -> Any:
    """A projector returning ``result`` with ``evidence`` and a secret scope."""

    def project(raw: Any, call: ToolCall) -> Projection:
        return Projection(result=result, evidence_status=evidence, scope=SCOPE)

    return project


@pytest.fixture
async def opened(make_store: Any) -> tuple[Store, str]:
    """A store with small limits and the run opened; returns the store and the run token."""
    store: Store = make_store(limits=Limits(raw_bytes=4096, result_bytes=1024))
    opened_run = await store.open_run(RUN, deadline=timedelta(minutes=5))
    return store, opened_run.access_token


#: Post-creation failures: tool name → (FakeTool, code, expected version).
_FAILURES: dict[str, tuple[FakeTool, ErrorCode, int]] = {
    "throws": (
        FakeTool(raw=RAW, raise_in_executor=RuntimeError(f"{EXCEPTION} {REQUEST}")),
        ErrorCode.EXECUTION_FAILED,
        2,
    ),
    "raw_huge": (FakeTool(raw=RAW * 1000), ErrorCode.RESULT_TOO_LARGE, 2),
    "raw_unencodable": (FakeTool(raw={"x": Leaky()}), ErrorCode.SERIALIZATION_FAILED, 2),
    "projector_throws": (
        FakeTool(raw=RAW, raise_in_projector=ValueError(f"{EXCEPTION} {RAW}")),
        ErrorCode.PROJECTION_FAILED,
        3,
    ),
    "projector_wrong_type": (
        FakeTool(raw=RAW, project=lambda raw, call: {"result": RESULT, "raw": raw}),
        ErrorCode.PROJECTION_FAILED,
        3,
    ),
    "bad_evidence": (
        FakeTool(raw=RAW, project=projection(evidence=EVIDENCE)),
        ErrorCode.INVALID_EVIDENCE_STATUS,
        3,
    ),
    "result_huge": (
        FakeTool(raw=RAW, project=projection(result=RESULT * 100)),
        ErrorCode.RESULT_TOO_LARGE,
        3,
    ),
    "result_unencodable": (
        FakeTool(raw=RAW, project=projection(result=[Leaky()])),
        ErrorCode.SERIALIZATION_FAILED,
        3,
    ),
}


async def test_success_and_every_post_creation_error_log_safely(
    opened: tuple[Store, str], namespace: str
):
    """A success and every failure after creation log one invocation_finished with ids, status,
    code, version and duration, and neither logs nor replies carry request, raw, result,
    exception text, token or Redis key."""
    store, token = opened
    tools = {"ok": FakeTool(raw=RAW, project=projection())}
    tools.update({name: tool for name, (tool, _, _) in _FAILURES.items()})
    boundary = ToolBoundary(store, {name: tool.spec() for name, tool in tools.items()})
    calls = [secret_call(f"call-{i}", name) for i, name in enumerate(tools)]

    with capture_logs() as logs:
        replies = [await boundary.invoke(RunContext(RUN), call) for call in calls]

    expected = [("READY", None, 3)] + [
        ("ERROR", code.value, version) for _, code, version in _FAILURES.values()
    ]
    assert [outcome(reply) for reply in replies] == ["READY"] + [
        code.value for _, code, _ in _FAILURES.values()
    ]
    entries = finished(logs)
    assert [(e["status"], e["error_code"], e["version"]) for e in entries] == expected
    for entry, call in zip(entries, calls, strict=True):
        assert entry.keys() >= FINISHED_FIELDS
        assert (entry["run_id"], entry["tool_call_id"]) == (RUN, call.tool_call_id)
        assert entry["invocation_id"] == invocation_id(RUN, call.tool_call_id)
        assert isinstance(entry["duration_ms"], float) and entry["duration_ms"] >= 0
    assert_clean(logs, replies, token, namespace, result_ok=True)


async def test_expired_record_logs_safely(make_store: Any, namespace: str):
    """A record that expires while the tool runs answers RECORD_EXPIRED and logs nothing secret."""
    store: Store = make_store(ttl=timedelta(milliseconds=200))
    token = (await store.open_run(RUN, deadline=timedelta(minutes=5))).access_token

    async def slow(arguments: dict[str, Any], call: ToolCall) -> Any:
        await asyncio.sleep(0.4)
        return RAW

    tool = FakeTool(project=projection())
    spec = msgspec.structs.replace(tool.spec(), executor=slow)

    with capture_logs() as logs:
        reply = await ToolBoundary(store, {TOOL: spec}).invoke(RunContext(RUN), secret_call("c1"))

    assert outcome(reply) == "RECORD_EXPIRED" and tool.projected == 0
    [entry] = finished(logs)
    assert (entry["status"], entry["error_code"], entry["version"]) == (
        "ERROR",
        "RECORD_EXPIRED",
        1,
    )
    assert_clean(logs, [reply], token, namespace, result_ok=False)


async def test_preflight_errors_log_safely(opened: tuple[Store, str], namespace: str):
    """Preflight refusals log invocation_finished with version 0, naming the run and the code
    and no invocation id (none exists), and never log an unsafe id, an unknown tool name or
    the input."""
    store, token = opened
    tool = FakeTool(raw=RAW, project=projection())
    boundary = ToolBoundary(store, {TOOL: tool.spec(), "locked": tool.spec(authorized=False)})
    calls = {
        ErrorCode.INVALID_TOOL_CALL_ID: secret_call(f"bad {REQUEST}"),
        ErrorCode.RUN_MISMATCH: secret_call("c1", run_id=f"run-{REQUEST}"),
        ErrorCode.INVALID_INPUT: secret_call("c2", arguments=[REQUEST, float("nan")]),
        ErrorCode.REQUEST_TOO_LARGE: secret_call("c3", arguments={"q": REQUEST * 10_000}),
        ErrorCode.UNKNOWN_TOOL: secret_call("c4", tool=f"tool-{REQUEST}"),
        ErrorCode.UNAUTHORIZED: secret_call("c5", tool="locked"),
    }

    with capture_logs() as logs:
        replies = [await boundary.invoke(RunContext(RUN), call) for call in calls.values()]
        await boundary.invoke(RunContext(RUN), secret_call("c6"))
        replies.append(await boundary.invoke(RunContext(RUN), secret_call("c6")))

    assert [outcome(reply) for reply in replies] == [
        *(code.value for code in calls),
        "DUPLICATE_TOOL_CALL",
    ]
    entries = finished(logs)
    assert [e["version"] for e in entries] == [0] * 6 + [3, 0]
    assert entries[0]["tool_call_id"] is None and entries[0]["invocation_id"] is None
    assert [e["invocation_id"] for e in entries] == [None] * 6 + [invocation_id(RUN, "c6"), None]
    assert [(e["run_id"], e["error_code"]) for e in entries[:6]] == [
        (RUN, code.value) for code in calls
    ]
    assert entries[1]["run_id"] == RUN  # the context run, never the envelope run
    assert entries[4]["tool"] is None
    assert tool.executed == 1
    assert_clean(logs, replies, token, namespace, result_ok=False)


@pytest.fixture
def private_server(server_binary: ServerBinary) -> Iterator[EmbeddedRedis]:
    """A private Redis of each supported version, stopped after the test."""
    with EmbeddedRedis(server_binary) as server:
        yield server


@pytest.fixture
async def private_store(private_server: EmbeddedRedis, namespace: str) -> AsyncIterator[Store]:
    """A short-timeout store on the private server."""
    store = Store.from_url(private_server.url, namespace=namespace, timeout_s=0.3)
    try:
        yield store
    finally:
        await store.aclose()


@pytest.mark.not_on_cluster(
    "stops a single server of its own (server_binary); not a cluster scenario"
)
async def test_store_outage_logs_safely(
    private_store: Store, private_server: EmbeddedRedis, namespace: str
):
    """Redis dying mid-call and Redis down before a call both answer STORE_UNAVAILABLE and log
    no Redis error text, key, address or trace."""
    token = (await private_store.open_run(RUN, deadline=timedelta(minutes=5))).access_token

    def killing(arguments: dict[str, Any], call: ToolCall) -> Any:
        private_server.kill()
        return RAW

    tool = FakeTool(project=projection())
    spec = msgspec.structs.replace(tool.spec(), executor=killing)
    boundary = ToolBoundary(private_store, {TOOL: spec})
    address = f"127.0.0.1:{private_server.port}"

    with capture_logs() as logs:
        replies = [
            await boundary.invoke(RunContext(RUN), secret_call("c1")),
            await boundary.invoke(RunContext(RUN), secret_call("c2")),
        ]

    assert [outcome(reply) for reply in replies] == ["STORE_UNAVAILABLE"] * 2
    assert [e["version"] for e in finished(logs)] == [1, 0]
    assert_clean(logs, replies, token, namespace, result_ok=False)
    for entry in logs:
        text = repr(entry)
        for fragment in (address, "Connection refused", "Error 111", "redis.exceptions"):
            assert fragment not in text, entry


@pytest.fixture
def log_level() -> Iterator[Callable[[int], None]]:
    """Sets the lowest level structlog lets through; the saved configuration comes back after."""
    saved = structlog.get_config()

    def set_level(level: int) -> None:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level))

    yield set_level
    structlog.configure(**saved)


IDS = ("run_id", "tool_call_id", "invocation_id")


async def test_each_committed_lifecycle_event_is_logged_at_debug_with_its_version(
    opened: tuple[Store, str], namespace: str, log_level: Callable[[int], None]
):
    """At DEBUG every event the boundary writes is logged with its name, version and ids; a
    success ends in Completed at INFO, a tool or projector failure in Failed at WARNING."""
    store, token = opened
    log_level(logging.DEBUG)
    tools = {
        "ok": FakeTool(raw=RAW, project=projection()),
        "throws": _FAILURES["throws"][0],
        "projector_throws": _FAILURES["projector_throws"][0],
    }
    boundary = ToolBoundary(store, {name: tool.spec() for name, tool in tools.items()})
    calls = [secret_call(f"call-{name}", name) for name in tools]

    with capture_logs() as logs:
        replies = [await boundary.invoke(RunContext(RUN), call) for call in calls]

    assert [outcome(reply) for reply in replies] == [
        "READY",
        "EXECUTION_FAILED",
        "PROJECTION_FAILED",
    ]
    committed = named(logs, "event_committed")
    assert [
        (e["tool_call_id"], e["event_type"], e["version"], e["error_code"]) for e in committed
    ] == [
        ("call-ok", "Preflighted", 1, None),
        ("call-ok", "ProjectingStarted", 2, None),
        ("call-ok", "Completed", 3, None),
        ("call-throws", "Preflighted", 1, None),
        ("call-throws", "Failed", 2, "EXECUTION_FAILED"),
        ("call-projector_throws", "Preflighted", 1, None),
        ("call-projector_throws", "ProjectingStarted", 2, None),
        ("call-projector_throws", "Failed", 3, "PROJECTION_FAILED"),
    ]
    for entry in committed:
        assert entry["log_level"] == "debug"
        assert (entry["run_id"], entry["invocation_id"]) == (
            RUN,
            invocation_id(RUN, entry["tool_call_id"]),
        )
    assert [(e["log_level"], e["event_type"], e["version"]) for e in finished(logs)] == [
        ("info", "Completed", 3),
        ("warning", "Failed", 2),
        ("warning", "Failed", 3),
    ]
    assert_clean(logs, replies, token, namespace, result_ok=True)


async def test_a_refusal_is_logged_with_its_code_and_no_version(
    opened: tuple[Store, str], namespace: str, log_level: Callable[[int], None]
):
    """A call refused in preflight or by the creation script logs invocation_refused with its
    stage and error code, no version and no committed event; its final line names no event.
    Both lines name the run, the call and the code, and no invocation id: a refused call
    has none (the duplicate's id is the first call's record, not this call's)."""
    store, token = opened
    log_level(logging.DEBUG)
    tool = FakeTool(raw=RAW, project=projection())
    boundary = ToolBoundary(store, {TOOL: tool.spec()})
    await boundary.invoke(RunContext(RUN), secret_call("first"))

    with capture_logs() as logs:
        replies = [
            await boundary.invoke(RunContext(RUN), secret_call("c1", tool=f"tool-{REQUEST}")),
            await boundary.invoke(RunContext(RUN), secret_call("first")),
        ]

    assert [outcome(reply) for reply in replies] == ["UNKNOWN_TOOL", "DUPLICATE_TOOL_CALL"]
    refused = named(logs, "invocation_refused")
    assert [(e["tool_call_id"], e["stage"], e["error_code"]) for e in refused] == [
        ("c1", "preflight", "UNKNOWN_TOOL"),
        ("first", "create", "DUPLICATE_TOOL_CALL"),
    ]
    for entry in refused:
        assert "version" not in entry and "event_type" not in entry
        assert entry["log_level"] == "info"
        assert (entry["run_id"], entry["invocation_id"]) == (RUN, None)
    assert named(logs, "event_committed") == []
    assert [
        (e["log_level"], e["event_type"], e["version"], e["run_id"], e["error_code"])
        for e in finished(logs)
    ] == [
        ("info", None, 0, RUN, "UNKNOWN_TOOL"),
        ("info", None, 0, RUN, "DUPLICATE_TOOL_CALL"),
    ]
    assert [e["invocation_id"] for e in [*refused, *finished(logs)]] == [None] * 4
    assert tool.executed == 1
    assert_clean(logs, replies, token, namespace, result_ok=False)


async def test_at_info_a_successful_call_logs_exactly_one_line(
    opened: tuple[Store, str], log_level: Callable[[int], None]
):
    """At INFO (production) a successful call logs only invocation_finished, naming its last
    event, version and duration."""
    store, _ = opened
    log_level(logging.INFO)
    boundary = ToolBoundary(store, {TOOL: FakeTool(raw=RAW, project=projection()).spec()})

    with capture_logs() as logs:
        for i in range(3):
            await boundary.invoke(RunContext(RUN), secret_call(f"call-{i}"))

    assert [(e["event"], e["log_level"], e["event_type"], e["version"]) for e in logs] == [
        ("invocation_finished", "info", "Completed", 3)
    ] * 3
    assert all(entry["duration_ms"] >= 0 for entry in logs)


async def test_with_debug_off_no_debug_line_is_even_built(opened: tuple[Store, str]):
    """With DEBUG off the boundary never calls ``debug``: no per-event fields are built."""
    store, _ = opened
    debug_calls: list[str] = []
    info_logger: Any = structlog.make_filtering_bound_logger(logging.INFO)

    class CountingDebug(info_logger):  # type: ignore[misc,valid-type]
        def debug(self, event: str, *args: Any, **fields: Any) -> None:
            debug_calls.append(event)

    saved = structlog.get_config()
    structlog.configure(wrapper_class=CountingDebug)
    try:
        boundary = ToolBoundary(store, {TOOL: FakeTool(raw=RAW, project=projection()).spec()})
        with capture_logs() as logs:
            reply = await boundary.invoke(RunContext(RUN), secret_call("c1"))
    finally:
        structlog.configure(**saved)

    assert outcome(reply) == "READY"
    assert debug_calls == []
    assert [entry["event"] for entry in logs] == ["invocation_finished"]
