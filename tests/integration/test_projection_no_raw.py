"""Receipts and progress views never hold a byte of a request or raw response (a corpus)."""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

from redis.asyncio import Redis

from eventstore.store import Store
from machine.codes import ErrorCode, EvidenceStatus
from projections import ProgressWorker, ReceiptWorker
from projections.supervisor import run_workers
from tests.helpers import key_values, namespace_keys


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
