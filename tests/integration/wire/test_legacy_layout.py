"""A namespace written in the legacy key layout stays readable by every tool, and writable.

Before the layout was recorded, ``{ns}:meta`` held only the shard count and the stream key
was the record key plus ``:ev``. The ``legacy`` fixture builds such a namespace the way the
old writers did: the metadata with the shard count alone, then the writes through the
legacy layout of ``eventstore.wire.keys`` (the functions kept for reading it); the tests check
the key shapes literally, then read the namespace with replay, verify, export, status,
the workers, the receipt HTTP API and rebuild.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from eventstore import RunContext, Store, ToolBoundary
from eventstore.audit import open_read_only
from eventstore.errors import NamespaceMismatch
from eventstore.wire.keys import LAYOUT, LEGACY_LAYOUT, shard_of
from machine.codes import ErrorCode
from machine.ids import invocation_id
from projections import ProgressWorker, ReceiptWorker, create_app
from projections.rebuild import Rebuild
from projections.worker.supervisor import run_workers
from tests.integration.audit.test_replay import replay_json, run_cli
from tests.integration.audit.test_status import status_json
from tests.integration.audit.test_verify import verify_json
from tests.support.calls import TOOL, assert_safe_error, envelope, outcome
from tests.support.provider_ids import ACCEPTED
from tests.support.tools import FakeTool, namespace_keys

pytestmark = pytest.mark.backends("single", "cluster")

_VERIFY = "canon verify refuses a cluster URL: it is run against each primary in turn"

RUN = "run-legacy"
SHARDS = 4
#: Calls through the boundary: READY each. Ids without ":" are accepted in this layout.
READY_CALLS = ["call-ready", ACCEPTED["underscore-first"], ACCEPTED["gemini-3"]]
#: Calls written directly: one ERROR, one left PROJECTING.
OTHER_CALLS = {"call-fail": "ERROR", "call-open": "PROJECTING"}
ALL_CALLS = [*READY_CALLS, *OTHER_CALLS]


def old_keys(namespace: str, call: str) -> tuple[str, str]:
    """Record and stream key of ``call`` spelled as the legacy writers did, by hand."""
    tag = f"{namespace}:{{s{shard_of(RUN, SHARDS):02d}}}"
    record = f"{tag}:inv:{RUN}:{call}"
    return record, f"{record}:ev"


@dataclass
class Legacy:
    """The legacy namespace's store and the access token of its run."""

    store: Store
    token: str


@pytest.fixture
async def legacy(redis: Redis, redis_url: str, namespace: str) -> AsyncIterator[Legacy]:
    """A namespace in the legacy layout with one invocation per outcome, and its store."""
    # What the legacy check_namespace wrote: the shard count, no layout.
    await redis.hset(f"{namespace}:meta", "shards", SHARDS)
    store = Store.from_url(redis_url, namespace=namespace, shards=SHARDS, ttl=timedelta(hours=1))
    async with store:
        assert store.keys.layout == LEGACY_LAYOUT
        opened = await store.open_run(RUN, deadline=timedelta(minutes=5))
        boundary = ToolBoundary(store, {TOOL: FakeTool().spec()})
        for call in READY_CALLS:
            assert outcome(await boundary.invoke(RunContext(RUN), envelope(call, run_id=RUN))) == (
                "READY"
            )
        head = await store.writer.create(RUN, "call-fail", TOOL, b'{"q":2}')
        await store.writer.fail(head, ErrorCode.EXECUTION_FAILED)
        head = await store.writer.create(RUN, "call-open", TOOL, b'{"q":3}')
        await store.writer.start_projecting(head, b'{"raw":1}')
        yield Legacy(store, opened.access_token)


async def test_the_legacy_layout_is_detected_kept_and_spelled_as_before(
    legacy: Legacy, redis: Redis, namespace: str
) -> None:
    """The store adopts the legacy layout from the metadata, never rewrites it, writes the
    old key shapes (stream = record + ':ev'), and refuses a call id holding ':' there."""
    assert await redis.hgetall(legacy.store.keys.meta()) == {b"shards": str(SHARDS).encode()}
    invocation_keys = {
        k for k in await namespace_keys(redis, namespace) if b":inv:" in k or b":ev:" in k
    }
    expected = {key.encode() for call in ALL_CALLS for key in old_keys(namespace, call)}
    assert invocation_keys == expected
    for call in ALL_CALLS:
        record, stream = old_keys(namespace, call)
        assert (await redis.type(record), await redis.type(stream)) == (b"hash", b"stream")

    tool = FakeTool()
    before = await namespace_keys(redis, namespace)
    reply = await ToolBoundary(legacy.store, {TOOL: tool.spec()}).invoke(
        RunContext(RUN), envelope(ACCEPTED["kimi"], run_id=RUN)
    )
    assert_safe_error(reply, ErrorCode.INVALID_TOOL_CALL_ID)
    # No invocation: the one new key is the run's refusal log, holding the id by its size.
    log = legacy.store.keys.refusals(RUN).encode()
    assert tool.executed == 0
    assert await namespace_keys(redis, namespace) == sorted([*before, log])
    [refusal] = await legacy.store.refusals(RUN)
    assert (refusal.code, refusal.tool_call_id) == ("INVALID_TOOL_CALL_ID", None)
    assert refusal.tool_call_id_bytes == len(ACCEPTED["kimi"].encode())


async def test_replay_and_export_read_the_legacy_layout(
    legacy: Legacy, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """canon replay finds and judges every call intact, export lists every record."""
    code, document = await replay_json(capsys, redis_url, namespace, RUN)
    assert code == 0 and document["intact"] is True
    assert sorted(r["tool_call_id"] for r in document["invocations"]) == sorted(ALL_CALLS)

    code, out, err = await run_cli(capsys, redis_url, namespace, "export", RUN)
    assert code == 0, err
    assert out.count('"kind":"record"') == len(ALL_CALLS)
    assert all(f'"tool_call_id":"{call}"' in out for call in ALL_CALLS)


@pytest.mark.not_on_cluster("canon status refuses a cluster URL")
async def test_status_counts_legacy_records_not_their_streams(
    legacy: Legacy, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """canon status counts each legacy record once; its ':ev' stream is not a record."""
    _, status = await status_json(capsys, redis_url, namespace)
    assert status["records_by_status"] == {"ERROR": 1, "PROJECTING": 1, "READY": 3}


@pytest.mark.not_on_cluster(_VERIFY)
async def test_verify_reads_the_legacy_layout(
    legacy: Legacy, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """canon verify is clean, each invocation counted once (record and stream together)."""
    code, problems, summary = await verify_json(capsys, redis_url, namespace)
    assert (code, problems) == (0, [])
    assert summary["invocations"] == len(ALL_CALLS)
    assert summary["by_status"] == {"ERROR": 1, "PROJECTING": 1, "READY": 3}


@pytest.mark.not_on_cluster(_VERIFY)
async def test_verify_still_tells_a_legacy_stream_from_its_record(
    legacy: Legacy, redis: Redis, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A legacy record deleted by hand leaves its ':ev' stream, reported as a stream
    without record of that very call."""
    await redis.delete(old_keys(namespace, "call-ready")[0])
    code, problems, _ = await verify_json(capsys, redis_url, namespace)
    assert code == 1
    assert [(p["tool_call_id"], p["reason"]) for p in problems] == [
        ("call-ready", "stream_without_record")
    ]


async def test_workers_and_the_receipt_api_read_the_legacy_layout(legacy: Legacy) -> None:
    """The workers project every legacy invocation; the HTTP API serves each receipt and
    the run's progress with the exact ids."""
    store = legacy.store
    workers = [ReceiptWorker(store, consumer="w"), ProgressWorker(store, consumer="w")]
    await run_workers(workers, burst=True, handle_signals=False)
    assert workers[0].counters["applied"] >= len(ALL_CALLS)
    for call in ALL_CALLS:
        receipt_key = store.keys.receipt(RUN, invocation_id(RUN, call))
        assert await store.client.exists(receipt_key), call

    transport = httpx.ASGITransport(app=create_app(store))
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        headers = {"Authorization": f"Bearer {legacy.token}"}
        for call in ALL_CALLS:
            response = await client.get(
                f"/v1/invocations/{invocation_id(RUN, call)}/receipt", headers=headers
            )
            assert response.status_code == 200, call
            assert response.json()["tool_call_id"] == call
        progress = await client.get(f"/v1/runs/{RUN}/progress", headers=headers)
    assert progress.status_code == 200
    document = progress.json()
    assert document["source"] == "view"
    assert document["by_status"] == {"ERROR": 1, "PROJECTING": 1, "READY": 3}
    assert sorted(fact["tool_call_id"] for fact in document["facts"]) == sorted(READY_CALLS)


async def test_rebuild_projects_every_legacy_record(legacy: Legacy) -> None:
    """canon rebuild's scan recognizes the legacy records (and skips their streams)."""
    report = await Rebuild(legacy.store, "receipts", grace_s=0).run()
    assert sum(report.records.values()) == len(ALL_CALLS)


async def test_a_new_namespace_records_the_layout_and_an_unknown_one_is_refused(
    make_store: Any, redis: Redis, redis_url: str, namespace: str
) -> None:
    """A store creating a namespace writes layout and shard count; a layout this version
    does not know is refused by writers and by the read-only tools."""
    async with make_store(shards=SHARDS) as store:
        assert store.keys.layout == LAYOUT
    assert await redis.hgetall(f"{namespace}:meta") == {
        b"layout": str(LAYOUT).encode(),
        b"shards": str(SHARDS).encode(),
    }
    await redis.hset(f"{namespace}:meta", "layout", 9)
    with pytest.raises(NamespaceMismatch, match="key layout"):
        async with make_store(shards=SHARDS):
            pytest.fail("entered a namespace of an unknown layout")
    with pytest.raises(NamespaceMismatch, match="key layout"):
        async with open_read_only(redis_url, namespace=namespace):
            pytest.fail("opened a namespace of an unknown layout")
