"""A result identical to the raw response is stored once, and every reader resolves it.

The record's ``result`` field then holds :data:`machine.results.SAME_AS_RAW` (bytes once),
the events keep the result's digest and size (digests everywhere), and the reader, a
replayed retry, receipts (built on demand, inspected, materialized by the worker), replay,
verify and export each see the result as it was. A small or different result is stored as
it is.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from eventstore import Projection, RunContext, Store, ToolBoundary, ToolEnvelope, ToolSpec
from eventstore.audit.export import export_run
from eventstore.audit.replay import replay_invocation
from eventstore.audit.verify import NamespaceVerifier
from eventstore.boundary.contracts import ToolCall, ToolResult
from machine.events import payload_digest
from machine.ids import invocation_id
from machine.results import SAME_AS_RAW
from projections import ReceiptWorker
from projections.archive.source import archived_receipt
from projections.receipts.inspection import inspect_invocation
from projections.receipts.snapshot import read_receipt_snapshot, receipt_of

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-shared-result"
#: A file read as an MCP server answers it: the result is the raw response, unchanged.
FILE = {"content": [{"type": "text", "text": "line of a file\n" * 200}]}


def read_file(arguments: dict[str, Any], call: ToolCall) -> Any:
    return FILE if arguments.get("big", True) else {"content": []}


def as_is(raw: Any, call: ToolCall) -> Projection:
    return Projection(result=raw, evidence_status="EVIDENCE_FOUND", scope="files")


@pytest.fixture
async def recorded(make_store: Any) -> tuple[Store, ToolBoundary]:
    store: Store = make_store()
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    spec = ToolSpec(executor=read_file, projector=as_is)
    boundary = ToolBoundary(store, {"read_file": spec}, on_duplicate="replay")
    reply = await boundary.invoke(
        RunContext(RUN),
        ToolEnvelope(run_id=RUN, tool_call_id="c1", tool="read_file", arguments={}),
    )
    assert isinstance(reply, ToolResult) and reply.result == FILE
    return store, boundary


async def test_the_record_keeps_the_bytes_once_and_the_reader_resolves_them(
    recorded: tuple[Store, ToolBoundary], redis: Redis
) -> None:
    """``result`` holds the marker, ``raw`` the bytes; ``store.get`` gives both whole."""
    store, _ = recorded
    key = store.keys.record(RUN, "c1")
    raw, stored = await redis.hmget(key, ["raw", "result"])
    assert stored == SAME_AS_RAW and json.loads(raw) == FILE
    record = await store.get(RUN, "c1")
    assert record is not None and record.result == raw
    assert record.state.result_sha256 == payload_digest(raw)
    assert record.state.result_bytes == len(raw)


async def test_a_replayed_retry_gets_the_result(recorded: tuple[Store, ToolBoundary]) -> None:
    """The same call again (``on_duplicate="replay"``) is answered from the record."""
    _, boundary = recorded
    again = await boundary.invoke(
        RunContext(RUN),
        ToolEnvelope(run_id=RUN, tool_call_id="c1", tool="read_file", arguments={}),
    )
    assert isinstance(again, ToolResult) and again.result == FILE


async def test_receipts_agree_built_inspected_and_materialized(
    recorded: tuple[Store, ToolBoundary], redis: Redis
) -> None:
    """The on-demand receipt, the inspected one and the worker's all hold the result."""
    store, _ = recorded
    built = receipt_of(store, await read_receipt_snapshot(store, RUN, "c1"))
    inspected = await inspect_invocation(store, RUN, invocation_id(RUN, "c1"))
    for receipt in (built, inspected):
        assert receipt.journal_state.value == "completed", receipt
        assert receipt.result is not None and receipt.result["agent_result"] == FILE
    await ReceiptWorker(store, consumer="w").run(burst=True)
    body = await redis.hget(store.keys.receipt(RUN, invocation_id(RUN, "c1")), "receipt")
    assert body is not None
    materialized = json.loads(body)
    assert materialized["journal_state"] == "completed"
    assert materialized["result"]["agent_result"] == FILE


async def test_replay_verify_and_export_see_the_result(
    recorded: tuple[Store, ToolBoundary], redis: Redis
) -> None:
    """Replay's verdict is intact, verify finds no problem, export's payload is the result."""
    store, _ = recorded
    replayed = await replay_invocation(store, RUN, "c1")
    assert replayed is not None and replayed.verdict.intact, replayed.problems
    if store.cluster is None:  # verify scans one server (see docs/architecture.md)
        summary = await NamespaceVerifier(store).run()
        assert summary.problems == 0 and summary.invocations == 1
    lines = [line async for line in export_run(store, RUN, with_payloads=True)]
    [record] = [line for line in lines if line["kind"] == "record"]
    assert json.loads(record["payloads"]["result"]["text"]) == FILE
    assert record["stored_payload_bytes"]["result"] == len(SAME_AS_RAW)


async def test_a_small_result_is_stored_as_it_is(
    recorded: tuple[Store, ToolBoundary], redis: Redis
) -> None:
    """Under the sharing threshold the result keeps its own copy."""
    store, boundary = recorded
    await boundary.invoke(
        RunContext(RUN),
        ToolEnvelope(run_id=RUN, tool_call_id="c2", tool="read_file", arguments={"big": False}),
    )
    stored = await redis.hget(store.keys.record(RUN, "c2"), "result")
    assert stored == b'{"content":[]}'


async def test_the_console_judges_a_record_by_the_limits_it_was_written_under(
    make_open_store: Any,
) -> None:
    """A store with limits of its own records them in the namespace; the console, opened
    with the library's defaults, judges its 40 KB result by them, not by 16 KiB."""
    from machine.limits import Limits
    from projections.console.views import invocation_page, payloads_page

    big = Limits(
        request_bytes=4 << 20, raw_bytes=16 << 20, result_bytes=16 << 20, record_bytes=40 << 20
    )
    writer: Store = await make_open_store(limits=big)
    await writer.open_run(RUN, deadline=timedelta(minutes=5))
    page = {"content": [{"type": "text", "text": "y" * 40_000}]}
    spec = ToolSpec(executor=lambda arguments, call: page, projector=as_is)
    reply = await ToolBoundary(writer, {"read_file": spec}).invoke(
        RunContext(RUN),
        ToolEnvelope(run_id=RUN, tool_call_id="c-big", tool="read_file", arguments={}),
    )
    assert isinstance(reply, ToolResult)
    console: Store = await make_open_store()
    assert await console.namespace_limits() == big
    inv = invocation_id(RUN, "c-big")
    view = await invocation_page(console, RUN, inv)
    assert view is not None
    assert dict(view.sizes)["agent result"].endswith("within the 16 MiB agent result limit")
    shown = await payloads_page(console, RUN, inv)
    assert shown is not None
    sizes = [payload.size_shown for payload in shown[1] if payload.size is not None]
    assert sizes and all("within" in size for size in sizes), sizes


async def test_an_archived_receipt_holds_the_result(recorded: tuple[Store, ToolBoundary]) -> None:
    """The archive keeps the record as stored (the marker); the receipt ``canon inspect
    --archive`` gives from it holds the result, as the live one does."""
    store, _ = recorded
    fields = await store.reader.fields(RUN, "c1")
    assert fields[b"result"] == SAME_AS_RAW
    receipt = archived_receipt(fields, await store.reader.events(RUN, "c1"))
    assert receipt.journal_state.value == "completed", receipt
    assert receipt.result is not None and receipt.result["agent_result"] == FILE
