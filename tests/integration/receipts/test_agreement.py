"""A record that disagrees with its journal is never served as completed: not by the API
(a materialized receipt is re-checked on every read), not by the receipt worker. One whose
only disagreement is a malformed stored result (not JSON, or other bytes than the digest
its Completed event names) is evidence_degraded with no result: ``result: null``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import httpx
import msgspec
import pytest
from redis.asyncio import Redis

from eventstore.store import Store
from machine.codes import EvidenceStatus
from machine.ids import invocation_id
from projections import ReceiptWorker, create_app
from projections.receipts.builder import RECONCILIATION_TEXT, decode_receipt

RUN = "run-agree"
Tamper = Callable[[Redis, Store], Awaitable[Any]]


async def _delete_stream(redis: Redis, store: Store) -> None:
    await redis.delete(store.keys.stream(RUN, "c1"))


async def _unknown_stage(redis: Redis, store: Store) -> None:
    await redis.hset(store.keys.record(RUN, "c1"), "stage", "FINISHED")


async def _replaced_result(redis: Redis, store: Store) -> None:
    # Same size, valid JSON, another digest: only the bytes changed.
    await redis.hset(store.keys.record(RUN, "c1"), "result", b'{"answer":41}')


async def _result_not_json(redis: Redis, store: Store) -> None:
    await redis.hset(store.keys.record(RUN, "c1"), "result", b'{"answer":')


TAMPERS = pytest.mark.parametrize(
    "tamper",
    [_delete_stream, _unknown_stage],
    ids=["stream_deleted", "unknown_stage"],
)
RESULT_TAMPERS = pytest.mark.parametrize(
    "tamper", [_replaced_result, _result_not_json], ids=["other_json", "not_json"]
)


@pytest.fixture
async def api(make_store: Any) -> AsyncIterator[tuple[Store, httpx.AsyncClient, str]]:
    """One READY call, the receipt API over it and the run's token."""
    store: Store = make_store(shards=2)
    token = (await store.open_run(RUN, deadline=timedelta(minutes=5))).access_token
    head = await store.writer.create(RUN, "c1", "search", b'{"q":1}')
    head = await store.writer.start_projecting(head, b'{"raw":"RAW"}')
    await store.writer.complete(head, b'{"answer":42}', EvidenceStatus.EVIDENCE_FOUND, "s")
    transport = httpx.ASGITransport(app=create_app(store))
    async with httpx.AsyncClient(transport=transport, base_url="http://canon") as client:
        yield store, client, token


async def _served(client: httpx.AsyncClient, token: str) -> dict[str, Any]:
    response = await client.get(
        f"/v1/invocations/{invocation_id(RUN, 'c1')}/receipt",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _assert_degraded(receipt: dict[str, Any]) -> None:
    """evidence_degraded, and nothing that reads as a success."""
    assert receipt["journal_state"] == "evidence_degraded"
    assert receipt["result"] == {
        "state": "reconciliation_required",
        "ok": False,
        "auto_retry_allowed": False,
        "text": RECONCILIATION_TEXT,
    }
    assert receipt["result_source"] == "journal"
    assert receipt["evidence_status"] == "PENDING"


def _assert_no_result(receipt: dict[str, Any]) -> None:
    """evidence_degraded with no result: neither a success nor an unresolved call."""
    assert receipt["journal_state"] == "evidence_degraded"
    assert (receipt["result"], receipt["result_source"]) == (None, "none")
    assert (receipt["dispatch_state"], receipt["evidence_status"]) == ("attempted", "PENDING")


@TAMPERS
async def test_a_materialized_receipt_is_not_served_once_the_record_disagrees(
    api: tuple[Store, httpx.AsyncClient, str], redis: Redis, tamper: Tamper
) -> None:
    """The worker stored a completed receipt; after the record or stream is tampered with,
    the API serves evidence_degraded, not the stored success."""
    store, client, token = api
    await ReceiptWorker(store, consumer="w").run(burst=True)
    assert (await _served(client, token))["journal_state"] == "completed"

    await tamper(redis, store)

    _assert_degraded(await _served(client, token))


@TAMPERS
async def test_the_worker_materializes_a_disagreeing_record_as_degraded(
    api: tuple[Store, httpx.AsyncClient, str], redis: Redis, tamper: Tamper
) -> None:
    """Tampered before the worker sees it: the stored receipt is evidence_degraded."""
    store, client, token = api
    await tamper(redis, store)

    await ReceiptWorker(store, consumer="w").run(burst=True)

    key = store.keys.receipt(RUN, invocation_id(RUN, "c1"))
    stored = decode_receipt(await redis.hget(key, "receipt"))
    _assert_degraded(msgspec.to_builtins(stored))
    _assert_degraded(await _served(client, token))


@RESULT_TAMPERS
async def test_a_malformed_stored_result_is_served_as_no_result(
    api: tuple[Store, httpx.AsyncClient, str], redis: Redis, tamper: Tamper
) -> None:
    """The worker stored a completed receipt; once the stored result is replaced by bytes
    that are not the Completed event's (invalid JSON, or other valid JSON), the API serves
    evidence_degraded with result null and source none, not the stored success and not
    reconciliation_required."""
    store, client, token = api
    await ReceiptWorker(store, consumer="w").run(burst=True)
    assert (await _served(client, token))["journal_state"] == "completed"

    await tamper(redis, store)

    _assert_no_result(await _served(client, token))


@RESULT_TAMPERS
async def test_the_worker_materializes_a_malformed_result_as_no_result(
    api: tuple[Store, httpx.AsyncClient, str], redis: Redis, tamper: Tamper
) -> None:
    """Replaced before the worker sees it: the stored receipt has result null, source
    none, evidence_degraded, and the API serves the same."""
    store, client, token = api
    await tamper(redis, store)

    await ReceiptWorker(store, consumer="w").run(burst=True)

    key = store.keys.receipt(RUN, invocation_id(RUN, "c1"))
    stored = decode_receipt(await redis.hget(key, "receipt"))
    _assert_no_result(msgspec.to_builtins(stored))
    _assert_no_result(await _served(client, token))


async def test_an_agreeing_materialized_receipt_is_still_served(
    api: tuple[Store, httpx.AsyncClient, str], redis: Redis
) -> None:
    """The check costs no fallback for an intact record: the stored receipt is what is served."""
    store, client, token = api
    await ReceiptWorker(store, consumer="w").run(burst=True)
    key = store.keys.receipt(RUN, invocation_id(RUN, "c1"))
    stored = msgspec.json.decode(await redis.hget(key, "receipt"))
    stored["result"]["scope"] = "materialized"
    await redis.hset(key, "receipt", msgspec.json.encode(stored))

    assert (await _served(client, token))["result"]["scope"] == "materialized"
