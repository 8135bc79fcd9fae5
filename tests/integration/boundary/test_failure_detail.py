"""The failure detail of a raising tool: kept in the record for the harness, nowhere else.

Every test raises an exception whose message holds :data:`MARKER`; the traceback then
holds it too. It must be in the record's ``failure_detail`` (digest in the Failed event)
and in none of: the agent's reply, the receipt (HTTP API and materialized), the run's
progress facts, or any log (the session's log scan fails on the marker and on
"Traceback").
"""

from __future__ import annotations

import asyncio
import hashlib
from datetime import timedelta
from typing import Any

import httpx
import msgspec
import pytest
from redis.asyncio import Redis

from eventstore import RunContext, Store, ToolBoundary, ToolSpec, reply_to_builtins
from eventstore.audit import replay_invocation
from eventstore.errors import InvalidArgument
from machine.codes import ErrorCode
from machine.events import Failed
from machine.failure_detail import FailureDetail, decode_failure_detail
from machine.ids import invocation_id
from machine.limits import Limits
from projections import ProgressWorker, ReceiptWorker, create_app, observed_facts
from projections.progress import read_view
from projections.worker.supervisor import ReceiptServer
from tests.support.calls import RUN, TOOL, assert_safe_error, envelope
from tests.support.log_scan import forbid_in_logs
from tests.support.tools import FakeTool

#: In every raised message (and so every traceback); forbidden in every log of the session.
MARKER = "FAILURE-DETAIL-MARKER-7f3a"
forbid_in_logs(MARKER)


class BackendDown(Exception):
    """The exception the tests' tools raise."""


async def opened(store: Store) -> str:
    """Open the tests' run; return its access token."""
    return (await store.open_run(RUN, deadline=timedelta(minutes=5))).access_token


async def stored_detail(store: Store, call: str) -> tuple[bytes | None, Failed]:
    """The record's failure_detail bytes and the invocation's Failed event."""
    fields = await store.reader.fields(RUN, call)
    events = await store.reader.events(RUN, call)
    failed = events[-1].event
    assert isinstance(failed, Failed)
    return fields.get(b"failure_detail"), failed


def assert_digest_in_event(data: bytes, failed: Failed) -> None:
    """The Failed event carries the detail's SHA-256 and size."""
    assert failed.failure_detail_sha256 == hashlib.sha256(data).hexdigest()
    assert failed.failure_detail_bytes == len(data)


async def test_a_raising_executor_keeps_type_message_and_traceback(store: Store) -> None:
    """EXECUTION_FAILED: the record holds the detail; the agent sees the fixed message only."""
    await opened(store)
    tool = FakeTool(raise_in_executor=BackendDown(f"index offline {MARKER}"))
    reply = await ToolBoundary(store, {TOOL: tool.spec()}).invoke(RunContext(RUN), envelope("c1"))

    assert_safe_error(reply, ErrorCode.EXECUTION_FAILED)
    assert MARKER not in msgspec.json.encode(reply_to_builtins(reply)).decode()
    data, failed = await stored_detail(store, "c1")
    assert data is not None
    assert list(msgspec.json.decode(data)) == ["type", "message", "traceback", "cut_bytes"]
    detail = decode_failure_detail(data)
    assert detail is not None
    assert detail.type == f"{__name__}.BackendDown"
    assert detail.message == f"index offline {MARKER}"
    assert detail.traceback.startswith("Traceback (most recent call last):")
    assert "in executor" in detail.traceback and MARKER in detail.traceback
    assert detail.cut_bytes == 0
    assert_digest_in_event(data, failed)
    replay = await replay_invocation(store, RUN, "c1")
    assert replay is not None and replay.verdict.intact, replay.problems
    assert replay.failure_detail == detail


async def test_a_raising_projector_keeps_its_detail(store: Store) -> None:
    """PROJECTION_FAILED after the raw response is stored: the detail is the projector's."""
    await opened(store)
    tool = FakeTool(raise_in_projector=KeyError(MARKER))
    reply = await ToolBoundary(store, {TOOL: tool.spec()}).invoke(RunContext(RUN), envelope("c1"))

    assert_safe_error(reply, ErrorCode.PROJECTION_FAILED)
    data, failed = await stored_detail(store, "c1")
    detail = decode_failure_detail(data or b"")
    assert detail is not None and detail.type == "KeyError"
    assert MARKER in detail.message and "in projector" in detail.traceback
    assert_digest_in_event(data or b"", failed)
    assert failed.version == 3  # Preflighted, ProjectingStarted, Failed
    replay = await replay_invocation(store, RUN, "c1")
    assert replay is not None and replay.verdict.intact, replay.problems


async def test_a_tools_own_cancellation_keeps_its_detail(store: Store) -> None:
    """A CancelledError of the tool (not its caller's) is a tool failure, with a detail."""
    await opened(store)

    async def cancels(arguments: Any, call: Any) -> Any:
        raise asyncio.CancelledError(MARKER)

    spec = ToolSpec(executor=cancels, projector=FakeTool().projector)
    reply = await ToolBoundary(store, {TOOL: spec}).invoke(RunContext(RUN), envelope("c1"))

    assert_safe_error(reply, ErrorCode.EXECUTION_FAILED)
    data, failed = await stored_detail(store, "c1")
    detail = decode_failure_detail(data or b"")
    assert detail is not None
    assert detail.type == "asyncio.exceptions.CancelledError" and detail.message == MARKER
    assert_digest_in_event(data or b"", failed)


async def test_a_long_message_and_traceback_are_cut_within_the_limit(make_store: Any) -> None:
    """Deep recursion and a 20 KB message: cut to failure_detail_bytes, cut_bytes > 0."""
    limit = 2048
    store: Store = make_store(shards=1, limits=Limits(failure_detail_bytes=limit))
    await opened(store)

    def deep(n: int) -> Any:
        if n:
            return deep(n - 1)
        raise BackendDown(MARKER + "x" * 20_000)

    async def executor(arguments: Any, call: Any) -> Any:
        return deep(80)

    spec = ToolSpec(executor=executor, projector=FakeTool().projector)
    reply = await ToolBoundary(store, {TOOL: spec}).invoke(RunContext(RUN), envelope("c1"))

    assert_safe_error(reply, ErrorCode.EXECUTION_FAILED)
    data, failed = await stored_detail(store, "c1")
    assert data is not None and len(data) <= limit
    detail = decode_failure_detail(data)
    assert detail is not None and detail.cut_bytes > 20_000
    assert detail.message.startswith(MARKER)
    assert detail.traceback.endswith("x\n"), "the traceback keeps its end"
    assert_digest_in_event(data, failed)
    replay = await replay_invocation(store, RUN, "c1")
    assert replay is not None and replay.verdict.intact, replay.problems


async def test_the_record_limit_still_holds_beside_the_detail(make_store: Any) -> None:
    """A projector failing beside a raw response near the record limit keeps a smaller detail."""
    room = 300
    tool = FakeTool(raw={"rows": "r" * 1000}, raise_in_projector=BackendDown(MARKER * 50))
    stored = len(b'{"q":1}') + len(msgspec.json.encode(tool.raw))
    store: Store = make_store(shards=1, limits=Limits(record_bytes=stored + room))
    await opened(store)
    reply = await ToolBoundary(store, {TOOL: tool.spec()}).invoke(RunContext(RUN), envelope("c1"))

    assert_safe_error(reply, ErrorCode.PROJECTION_FAILED)
    data, _ = await stored_detail(store, "c1")
    assert data is not None and len(data) <= room
    fields = await store.reader.fields(RUN, "c1")
    assert len(fields[b"request"]) + len(fields[b"raw"]) + len(data) <= stored + room
    detail = decode_failure_detail(data)
    assert detail is not None and detail.cut_bytes > 0


async def test_type_keeps_the_type_name_only(store: Store) -> None:
    """``failure_detail="type"``: the type name, an empty message and traceback."""
    await opened(store)
    tool = FakeTool(raise_in_executor=BackendDown(MARKER))
    boundary = ToolBoundary(store, {TOOL: tool.spec()}, failure_detail="type")
    await boundary.invoke(RunContext(RUN), envelope("c1"))

    data, failed = await stored_detail(store, "c1")
    assert data is not None and MARKER.encode() not in data
    assert decode_failure_detail(data) == FailureDetail(
        type=f"{__name__}.BackendDown", message="", traceback="", cut_bytes=0
    )
    assert_digest_in_event(data, failed)


async def test_none_keeps_nothing_and_the_event_has_no_digest(store: Store) -> None:
    """``failure_detail="none"``: no record field, no digest or size in the Failed event."""
    await opened(store)
    tool = FakeTool(raise_in_executor=BackendDown(MARKER))
    boundary = ToolBoundary(store, {TOOL: tool.spec()}, failure_detail="none")
    await boundary.invoke(RunContext(RUN), envelope("c1"))

    data, failed = await stored_detail(store, "c1")
    fields = await store.reader.fields(RUN, "c1")
    assert data is None and b"failure_detail_sha256" not in fields
    assert failed.failure_detail_sha256 is msgspec.UNSET
    assert failed.failure_detail_bytes is msgspec.UNSET
    replay = await replay_invocation(store, RUN, "c1")
    assert replay is not None and replay.verdict.intact and replay.failure_detail_bytes is None


@pytest.mark.parametrize("policy", ["all", "", None, "FULL"])
def test_an_unknown_policy_is_refused_at_construction(store: Store, policy: Any) -> None:
    """Anything but "full", "type" or "none" is an InvalidArgument, before any call."""
    with pytest.raises(InvalidArgument, match="failure_detail"):
        ToolBoundary(store, {TOOL: FakeTool().spec()}, failure_detail=policy)


async def test_a_failure_without_an_exception_keeps_no_detail(store: Store) -> None:
    """A projector answering the wrong shape raises nothing: no detail is invented."""
    await opened(store)
    tool = FakeTool(project=lambda raw, call: "not a projection")
    reply = await ToolBoundary(store, {TOOL: tool.spec()}).invoke(RunContext(RUN), envelope("c1"))
    assert_safe_error(reply, ErrorCode.PROJECTION_FAILED)
    data, failed = await stored_detail(store, "c1")
    assert data is None and failed.failure_detail_sha256 is msgspec.UNSET


async def test_a_tampered_detail_is_a_payload_digest_mismatch(store: Store, redis: Redis) -> None:
    """Replay checks the detail's digest like the other payloads'."""
    await opened(store)
    tool = FakeTool(raise_in_executor=BackendDown(MARKER))
    await ToolBoundary(store, {TOOL: tool.spec()}).invoke(RunContext(RUN), envelope("c1"))
    await redis.hset(store.keys.record(RUN, "c1"), "failure_detail", b'{"type":"Fine"}')

    replay = await replay_invocation(store, RUN, "c1")
    assert replay is not None and not replay.verdict.intact
    assert replay.problems == ["payload_digest_mismatch:failure_detail"]
    assert replay.verdict.payload_digests_match is False
    assert replay.failure_detail is None and replay.failure_detail_bytes == 15


async def test_the_detail_is_in_no_receipt_and_no_progress_fact(
    make_store: Any, redis: Redis
) -> None:
    """The HTTP receipt, the materialized receipt and the progress facts never hold it."""
    store: Store = make_store(shards=2)
    token = await opened(store)
    tool = FakeTool(raise_in_executor=BackendDown(MARKER))
    boundary = ToolBoundary(store, {TOOL: tool.spec()})
    await boundary.invoke(RunContext(RUN), envelope("failed"))
    await ToolBoundary(store, {TOOL: FakeTool().spec()}).invoke(RunContext(RUN), envelope("ready"))
    detail, _ = await stored_detail(store, "failed")
    assert detail is not None and MARKER.encode() in detail

    await ReceiptWorker(store, consumer="w").run(burst=True)
    await ProgressWorker(store).run(burst=True)
    inv = invocation_id(RUN, "failed")
    materialized = await redis.hget(store.keys.receipt(RUN, inv), "receipt")
    assert materialized is not None and b"EXECUTION_FAILED" in materialized
    server = ReceiptServer(create_app(store))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not task.done(), "the server did not start"
            await asyncio.sleep(0.005)
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
            receipt = await client.get(f"/v1/invocations/{inv}/receipt", headers=headers)
            progress = await client.get(f"/v1/runs/{RUN}/progress", headers=headers)
    finally:
        server.stop()
        await asyncio.wait_for(task, 10)
    assert receipt.status_code == 200 and b"EXECUTION_FAILED" in receipt.content
    assert receipt.json()["invocation_id"] == inv
    assert progress.status_code == 200
    facts = msgspec.json.encode(await observed_facts(store, RunContext(RUN)))
    view = msgspec.json.encode(await read_view(store, RUN))
    for text in (materialized, receipt.content, progress.content, facts, view):
        assert MARKER.encode() not in text
        assert b"Traceback" not in text and b"BackendDown" not in text
