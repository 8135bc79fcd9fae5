"""Byte limits, counted in UTF-8: right at each limit passes, one byte over fails closed."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from eventstore import Limits, Projection, RunContext, Store, ToolBoundary, ToolCall, ToolResult
from eventstore.audit import replay_invocation
from machine.codes import ErrorCode, EvidenceStatus, Status
from machine.events import Failed, payload_digest
from machine.failure_detail import SIZE_LIMIT_TYPE, decode_failure_detail
from machine.limits import LimitHit, LimitName
from tests.support.calls import RUN, TOOL, assert_safe_error, envelope, open_run, outcome
from tests.support.tools import FakeTool

pytestmark = pytest.mark.backends("single", "cluster")

#: One character of each UTF-8 width.
WIDE = {"2-byte": "é", "3-byte": "€", "4-byte": "🚀"}
widths = pytest.mark.parametrize("char", list(WIDE.values()), ids=list(WIDE))


def text_of(size: int, char: str) -> str:
    """Text of exactly ``size`` UTF-8 bytes: as many ``char`` as fit, padded with ASCII."""
    width = len(char.encode())
    text = char * (size // width) + "a" * (size % width)
    assert len(text.encode()) == size
    assert len(text) < size or width == 1 or size < width
    return text


async def assert_size_detail(
    store: Store, name: LimitName, limit_bytes: int, actual_bytes: int, call: str = "call_1"
) -> None:
    """The record keeps, harness-only, the limit that was hit, its size and the size
    measured against it, under the digest its Failed event names; the replay shows it."""
    fields = await store.reader.fields(RUN, call)
    data = fields[b"failure_detail"]
    detail = decode_failure_detail(data)
    assert detail is not None and detail.type == SIZE_LIMIT_TYPE and detail.traceback == ""
    assert detail.limit == LimitHit(name=name, limit_bytes=limit_bytes, actual_bytes=actual_bytes)
    assert f"{actual_bytes} B, over the {name.value} limit of {limit_bytes} B" in detail.message
    failed = (await store.reader.events(RUN, call))[-1].event
    assert isinstance(failed, Failed) and failed.failure_detail_sha256 == payload_digest(data)
    replay = await replay_invocation(store, RUN, call)
    assert replay is not None and replay.verdict.intact and replay.failure_detail == detail


def test_default_limits_are_pinned():
    """The documented defaults; changing one must be a deliberate change of this test."""
    assert msgspec.structs.asdict(Limits()) == {
        "request_bytes": 64 * 1024,
        "raw_bytes": 1024 * 1024,
        "result_bytes": 16 * 1024,
        "record_bytes": 1024 * 1024 + 96 * 1024,
        "scope_bytes": 512,
        "json_depth": 32,
        "fact_count": 100,
        "facts_bytes": 64 * 1024,
        "failure_detail_bytes": 8 * 1024,
    }


async def test_store_uses_the_default_limits(store: Store):
    """A store built without limits applies the defaults."""
    assert store.settings.limits == Limits()


@pytest.mark.parametrize("value", [0, -1])
def test_limits_must_be_positive(value: int):
    """A zero or negative limit is refused when the limits are built."""
    with pytest.raises(ValueError, match="request_bytes"):
        Limits(request_bytes=value)


@widths
async def test_request_right_at_its_limit_passes(make_store: Any, char: str):
    """A canonical request of exactly request_bytes UTF-8 bytes is stored complete."""
    limit = 300
    store = make_store(limits=Limits(request_bytes=limit))
    await open_run(store)
    arguments = {"q": text_of(limit - len(b'{"q":""}'), char)}

    reply = await ToolBoundary(store, {TOOL: FakeTool().spec()}).invoke(
        RunContext(RUN), envelope(arguments=arguments)
    )

    assert outcome(reply) == "READY"
    record = await store.get(RUN, "call_1")
    assert record is not None and len(record.request) == limit
    assert msgspec.json.decode(record.request) == arguments


@widths
async def test_request_one_byte_over_its_limit_is_refused(make_store: Any, char: str):
    """One byte over request_bytes is REQUEST_TOO_LARGE, though it has fewer characters."""
    limit = 300
    store = make_store(limits=Limits(request_bytes=limit))
    await open_run(store)
    tool = FakeTool()
    arguments = {"q": text_of(limit - len(b'{"q":""}') + 1, char)}

    reply = await ToolBoundary(store, {TOOL: tool.spec()}).invoke(
        RunContext(RUN), envelope(arguments=arguments)
    )

    assert_safe_error(
        reply,
        ErrorCode.REQUEST_TOO_LARGE,
        "The tool request is larger than the 300 B request limit.",
    )
    assert tool.executed == 0
    assert await store.get(RUN, "call_1") is None


async def test_request_limit_counts_canonical_bytes_not_input_text(make_store: Any):
    """JSON text padded with whitespace is measured after canonicalization."""
    limit = 100
    store = make_store(limits=Limits(request_bytes=limit))
    await open_run(store)
    compact = {"q": text_of(limit - len(b'{"q":""}'), "€")}
    padded = '{   "q"   :   ' + msgspec.json.encode(compact["q"]).decode() + "   }" + " " * 50

    reply = await ToolBoundary(store, {TOOL: FakeTool().spec()}).invoke(
        RunContext(RUN), envelope(arguments=padded)
    )

    assert outcome(reply) == "READY"
    record = await store.get(RUN, "call_1")
    assert record is not None and len(record.request) == limit


@widths
@pytest.mark.parametrize("kind", ["str", "bytes"])
async def test_raw_right_at_its_limit_is_stored_complete(make_store: Any, char: str, kind: str):
    """A raw response of exactly raw_bytes UTF-8 bytes is stored byte for byte and projected."""
    limit = 1000
    store = make_store(limits=Limits(raw_bytes=limit))
    await open_run(store)
    text = text_of(limit, char)
    tool = FakeTool(raw=text if kind == "str" else text.encode())

    reply = await ToolBoundary(store, {TOOL: tool.spec()}).invoke(RunContext(RUN), envelope())

    assert outcome(reply) == "READY" and tool.projected == 1
    record = await store.get(RUN, "call_1")
    assert record is not None and record.raw == text.encode()
    assert record.state.raw_bytes == limit


@widths
@pytest.mark.parametrize("kind", ["str", "bytes", "json"])
async def test_raw_one_byte_over_its_limit_fails_closed(make_store: Any, char: str, kind: str):
    """One byte over raw_bytes is ERROR/RESULT_TOO_LARGE: raw not stored, projector not run."""
    limit = 1000
    store = make_store(limits=Limits(raw_bytes=limit))
    await open_run(store)
    raw: Any
    if kind == "json":  # a JSON raw response is measured as its encoding: ["..."] adds 4 bytes
        raw = [text_of(limit + 1 - 4, char)]
        assert len(msgspec.json.encode(raw)) == limit + 1
    else:
        text = text_of(limit + 1, char)
        raw = text if kind == "str" else text.encode()
    tool = FakeTool(raw=raw)

    reply = await ToolBoundary(store, {TOOL: tool.spec()}).invoke(RunContext(RUN), envelope())

    assert_safe_error(
        reply,
        ErrorCode.RESULT_TOO_LARGE,
        "The raw tool response is larger than the 1000 B raw response limit.",
    )
    assert tool.executed == 1 and tool.projected == 0
    record = await store.get(RUN, "call_1")
    assert record is not None
    assert (record.state.status, record.state.error_code) == (
        Status.ERROR,
        ErrorCode.RESULT_TOO_LARGE,
    )
    assert record.raw is None and record.result is None
    assert record.state.rejected_bytes == limit + 1
    await assert_size_detail(store, LimitName.RAW, limit, limit + 1)


@widths
async def test_agent_result_right_at_its_limit_is_returned(make_store: Any, char: str):
    """An agent result whose JSON is exactly result_bytes (a str gets 2 bytes of quotes) is
    returned and stored."""
    limit = 500
    store = make_store(limits=Limits(result_bytes=limit))
    await open_run(store)
    result = text_of(limit - 2, char)
    tool = FakeTool(result=result)

    reply = await ToolBoundary(store, {TOOL: tool.spec()}).invoke(RunContext(RUN), envelope())

    assert isinstance(reply, ToolResult) and reply.result == result
    record = await store.get(RUN, "call_1")
    assert record is not None and record.result == msgspec.json.encode(result)
    assert record.state.result_bytes == limit


@widths
async def test_agent_result_one_byte_over_its_limit_fails_closed(make_store: Any, char: str):
    """One byte over result_bytes is ERROR/RESULT_TOO_LARGE and nothing of it is returned."""
    limit = 500
    store = make_store(limits=Limits(result_bytes=limit))
    await open_run(store)
    result = {"r": text_of(limit + 1 - len(b'{"r":""}'), char)}
    assert len(msgspec.json.encode(result)) == limit + 1
    tool = FakeTool(result=result)

    reply = await ToolBoundary(store, {TOOL: tool.spec()}).invoke(RunContext(RUN), envelope())

    assert_safe_error(
        reply,
        ErrorCode.RESULT_TOO_LARGE,
        "The tool result is larger than the 500 B agent result limit.",
    )
    assert char.encode() not in msgspec.json.encode(reply)
    record = await store.get(RUN, "call_1")
    assert record is not None
    assert (record.state.status, record.state.evidence_status, record.state.error_code) == (
        Status.ERROR,
        EvidenceStatus.ERROR,
        ErrorCode.RESULT_TOO_LARGE,
    )
    assert record.result is None
    assert record.raw is not None  # stored before the projection, harness-only
    assert record.state.rejected_bytes == limit + 1
    await assert_size_detail(store, LimitName.RESULT, limit, limit + 1)


def record_parts(total: int, char: str) -> tuple[dict[str, str], str, str, str]:
    """Request, raw, result and scope whose stored bytes add up to exactly ``total``."""
    request = {"q": text_of(100 - len(b'{"q":""}'), char)}
    raw = text_of(200, char)
    result = text_of(150 - 2, char)
    scope = text_of(total - 450, char)
    return request, raw, result, scope


@widths
@pytest.mark.parametrize("over", [0, 1], ids=["at-limit", "one-over"])
async def test_whole_record_limit(make_store: Any, char: str, over: int):
    """request + raw + result + scope exactly at record_bytes is READY; one byte over is
    ERROR/RESULT_TOO_LARGE with no result stored or returned."""
    limit = 500
    store = make_store(limits=Limits(record_bytes=limit))
    await open_run(store)
    request, raw, result, scope = record_parts(limit + over, char)
    tool = FakeTool(raw=raw, result=result, scope=scope)

    reply = await ToolBoundary(store, {TOOL: tool.spec()}).invoke(
        RunContext(RUN), envelope(arguments=request)
    )

    record = await store.get(RUN, "call_1")
    assert record is not None
    if over:
        assert_safe_error(
            reply,
            ErrorCode.RESULT_TOO_LARGE,
            "The tool call's payloads together are larger than the 500 B record limit.",
        )
        assert (record.state.status, record.result) == (Status.ERROR, None)
        # The detail fits in what the record limit leaves beside request and raw.
        data = (await store.reader.fields(RUN, "call_1")).get(b"failure_detail", b"")
        assert len(record.request) + len(record.raw or b"") + len(data) <= limit
        detail = decode_failure_detail(data)
        assert detail is not None
        assert detail.limit == LimitHit(name=LimitName.RECORD, limit_bytes=500, actual_bytes=501)
    else:
        assert isinstance(reply, ToolResult) and reply.scope == scope
        assert record.state.status is Status.READY
        stored = len(record.request) + len(record.raw or b"") + len(record.result or b"")
        assert stored + len(record.state.scope.encode()) == limit


async def test_request_and_raw_over_the_record_limit_store_no_raw(make_store: Any):
    """When request + raw alone pass record_bytes, the raw response is not stored and the
    projector never runs."""
    limit = 500
    store = make_store(limits=Limits(record_bytes=limit))
    await open_run(store)
    request = {"q": text_of(100 - len(b'{"q":""}'), "🚀")}
    tool = FakeTool(raw=text_of(limit - 100 + 1, "🚀"))

    reply = await ToolBoundary(store, {TOOL: tool.spec()}).invoke(
        RunContext(RUN), envelope(arguments=request)
    )

    assert_safe_error(
        reply,
        ErrorCode.RESULT_TOO_LARGE,
        "The tool call's payloads together are larger than the 500 B record limit.",
    )
    assert tool.projected == 0
    record = await store.get(RUN, "call_1")
    assert record is not None and record.raw is None and record.state.status is Status.ERROR
    await assert_size_detail(store, LimitName.RECORD, limit, limit + 1)


@widths
@pytest.mark.parametrize("over", [0, 1], ids=["at-limit", "one-over"])
async def test_scope_limit(make_store: Any, char: str, over: int):
    """A scope of exactly scope_bytes is kept; one byte over is ERROR/RESULT_TOO_LARGE."""
    limit = 64
    store = make_store(limits=Limits(scope_bytes=limit))
    await open_run(store)
    scope = text_of(limit + over, char)

    def project(raw: Any, call: ToolCall) -> Projection:
        return Projection(result="r", evidence_status=EvidenceStatus.NO_EVIDENCE, scope=scope)

    reply = await ToolBoundary(store, {TOOL: FakeTool(project=project).spec()}).invoke(
        RunContext(RUN), envelope()
    )

    record = await store.get(RUN, "call_1")
    assert record is not None
    if over:
        assert_safe_error(
            reply,
            ErrorCode.RESULT_TOO_LARGE,
            "The scope of the tool result is larger than the 64 B scope limit.",
        )
        assert record.state.status is Status.ERROR and record.state.scope != scope
        await assert_size_detail(store, LimitName.SCOPE, limit, limit + 1)
    else:
        assert isinstance(reply, ToolResult) and reply.scope == scope
        assert record.state.scope == scope
