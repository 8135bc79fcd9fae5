"""Receipts, progress lists, views and facts never hold a request, raw response or result."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from redis.asyncio import Redis

from eventstore import RunContext, ToolBoundary, ToolEnvelope, ToolResult
from eventstore.store import Store
from machine.codes import ErrorCode, EvidenceStatus
from projections import ProgressWorker, ReceiptWorker, observed_facts, read_view
from projections.worker.supervisor import run_workers
from tests.helpers import key_values, namespace_keys
from tests.support.tools import FakeTool

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-z"


async def test_no_projection_key_holds_request_or_raw_bytes(
    make_store: Any, redis: Redis, namespace: str
) -> None:
    """Across a corpus of calls in every state, only record keys hold the payload markers."""
    store: Store = make_store(shards=4)
    markers: list[bytes] = []
    for run in ("run-x", "run-y"):
        await store.open_run(run, deadline=timedelta(minutes=5))
        for i, outcome in enumerate(("found", "none", "error", "open", "executing")):
            raw_marker = f"RAWMARK-{secrets.token_hex(8)}".encode()
            request_marker = f"REQMARK-{secrets.token_hex(8)}".encode()
            markers.append(request_marker)
            head = await store.writer.create(
                run, f"call-{i}", "search", b'{"q":"' + request_marker + b'"}'
            )
            if outcome == "executing":
                continue
            markers.append(raw_marker)
            head = await store.writer.start_projecting(head, b'{"leak":"' + raw_marker + b'"}')
            if outcome == "found":
                await store.writer.complete(head, b'{"n":1}', EvidenceStatus.EVIDENCE_FOUND, "s")
            elif outcome == "none":
                await store.writer.complete(head, b"[]", EvidenceStatus.NO_EVIDENCE, "s")
            elif outcome == "error":
                await store.writer.fail(head, ErrorCode.RESULT_TOO_LARGE, rejected_bytes=99)

    workers = [ReceiptWorker(store, consumer="w"), ProgressWorker(store, consumer="w")]
    await run_workers(workers, burst=True, handle_signals=False)

    keys = await namespace_keys(redis, namespace)
    projected = [k for k in keys if b":receipt:" in k or b":rview:" in k]
    assert len([k for k in projected if b":receipt:" in k]) == 10
    assert len([k for k in projected if b":rview:" in k]) == 2
    outside_records = [k for k in keys if b":inv:" not in k]
    assert set(projected) <= set(outside_records)
    for key in outside_records:
        blob = b"\x00".join(await key_values(redis, key))
        leaked = [m for m in markers if m in blob]
        assert not leaked, f"{key!r} holds payload bytes"
    records = b"\x00".join(
        [b"\x00".join(await key_values(redis, k)) for k in keys if b":inv:" in k]
    )
    assert all(marker in records for marker in markers)


async def test_neither_tracker_nor_facts_hold_a_raw_response_or_an_agent_result(
    make_store: Any, redis: Redis, namespace: str
) -> None:
    """After real boundary calls (found and none), the progress list, the run view and the
    facts hold neither the raw response nor the agent result; a fact carries only the result's
    digest and size, and the record alone keeps both payloads."""
    store: Store = make_store(shards=2)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    raw_marker = f"RAWMARK-{secrets.token_hex(8)}"
    result_marker = f"RESULTMARK-{secrets.token_hex(8)}"
    results = {
        EvidenceStatus.EVIDENCE_FOUND: {"summary": result_marker, "rows": [1, 2]},
        EvidenceStatus.NO_EVIDENCE: {"summary": result_marker, "rows": []},
    }
    tools = {
        evidence.value: FakeTool(raw={"body": raw_marker}, result=result, evidence=evidence)
        for evidence, result in results.items()
    }
    boundary = ToolBoundary(store, {name: tool.spec() for name, tool in tools.items()})
    for name in tools:
        reply = await boundary.invoke(
            RunContext(RUN),
            ToolEnvelope(run_id=RUN, tool_call_id=f"call-{name}", tool=name, arguments={"q": 1}),
        )
        assert isinstance(reply, ToolResult) and reply.result["summary"] == result_marker
    await ProgressWorker(store, consumer="w").run(burst=True)

    tracker = [store.keys.progress(RUN).encode(), store.keys.run_view(RUN).encode()]
    assert set(tracker) <= set(await namespace_keys(redis, namespace))
    facts = await observed_facts(store, RunContext(RUN))
    view = await read_view(store, RUN)
    assert view is not None and len(view.facts) == len(facts) == 2
    blobs = {key.decode(): b"\x00".join(await key_values(redis, key)) for key in tracker}
    blobs["facts"] = msgspec.json.encode(facts)
    for where, blob in blobs.items():
        for marker in (raw_marker, result_marker):
            assert marker.encode() not in blob, f"{where} holds {marker}"
    for fact, result in zip(facts, results.values(), strict=True):
        stored = msgspec.json.encode(result)
        assert (fact.result_sha256, fact.result_bytes) == (
            hashlib.sha256(stored).hexdigest(),
            len(stored),
        )
    records = [
        k
        for k in await namespace_keys(redis, namespace)
        if k.endswith(b"-EVIDENCE_FOUND") and b":inv:" in k
    ]
    [record] = records
    assert result_marker.encode() in b"\x00".join(await key_values(redis, record))
