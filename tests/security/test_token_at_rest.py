"""A run's access token is stored only as its SHA-256: no key, field, value, list item,
string or stream entry of the namespace holds the token, even after the run was used."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

from redis.asyncio import Redis

from eventstore.store import Store
from machine.codes import EvidenceStatus
from projections import ProgressWorker, ReceiptWorker
from tests.helpers import RAW, REQUEST, RESULT, TOOL, key_values, namespace_keys

RUN = "run-token-at-rest"


async def everything_stored(redis: Redis, namespace: str) -> list[bytes]:
    """Every key name of the namespace and every byte string stored under each key."""
    stored: list[bytes] = []
    for key in await namespace_keys(redis, namespace):
        stored.append(key)
        stored += await key_values(redis, key)
    return stored


async def test_the_access_token_is_stored_only_as_its_sha256(
    make_store: Any, redis: Redis, namespace: str
) -> None:
    """After open_run, a finished call, both projections and a token check, the token and
    its secret part appear nowhere in Redis; its SHA-256 hex digest does."""
    store: Store = make_store(shards=2)
    opened = await store.open_run(RUN, deadline=timedelta(minutes=5), tools={TOOL: None})
    token = opened.access_token
    secret = token.rsplit(":", 1)[1]
    assert len(secret) >= 32  # distinctive: a match could not be a coincidence
    head = await store.writer.create(RUN, "call-1", TOOL, REQUEST)
    head = await store.writer.start_projecting(head, RAW)
    await store.writer.complete(head, RESULT, EvidenceStatus.EVIDENCE_FOUND, "docs")
    await ReceiptWorker(store, consumer="w").run(burst=True)
    await ProgressWorker(store, consumer="w").run(burst=True)
    assert await store.runs.authenticate(token) == RUN

    stored = await everything_stored(redis, namespace)
    assert len(stored) > 20  # records, streams, feed, run, receipt, view, positions
    for forbidden in (token, secret):
        leaks = [value for value in stored if forbidden.encode() in value]
        assert leaks == [], "the plaintext token is stored"
    digest = hashlib.sha256(token.encode()).hexdigest().encode()
    assert digest in stored
    assert await redis.hget(store.keys.run(RUN), "token_sha256") == digest
