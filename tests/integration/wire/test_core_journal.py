"""Bytes once and a tamper-evident journal: payloads live in the record, digests in events."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import msgspec
import pytest
from redis.asyncio import Redis

from eventstore.audit import verify_against_events
from eventstore.reader import StoredEvent
from eventstore.store import Store
from machine.codes import ErrorCode, EvidenceStatus
from machine.events import GENESIS_HASH, encode_event, event_hash
from machine.fold import fold_all, state_from_record
from tests.helpers import (
    RAW,
    REQUEST,
    RESULT,
    TOOL,
    key_values,
    make_event,
    namespace_keys,
    record_fields,
)

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-1"
MARKERS = {
    "request": b"REQ-MARKER-7f3a9c",
    "raw": b"RAW-MARKER-2b8e41",
    "result": b"RES-MARKER-c05d6e",
}


@pytest.fixture
async def store(make_open_store: Any) -> Store:
    """A store with one open run."""
    store: Store = await make_open_store(shards=4, ttl=timedelta(minutes=5))
    await store.open_run(RUN, deadline=timedelta(minutes=5), budget=10)
    return store


async def write_ready(store: Store, tool_call_id: str = "call-1") -> None:
    """Write one invocation through the legal path to READY."""
    head = await store.writer.create(RUN, tool_call_id, TOOL, REQUEST)
    head = await store.writer.start_projecting(head, RAW)
    await store.writer.complete(head, RESULT, EvidenceStatus.EVIDENCE_FOUND, "docs")


async def audit(store: Store, tool_call_id: str = "call-1") -> list[str]:
    """The audit verdict on one invocation as it is stored now."""
    fields = await record_fields(store, RUN, tool_call_id)
    return verify_against_events(fields, await store.events(RUN, tool_call_id))


async def test_payload_bytes_are_stored_in_the_record_only(store: Store, redis: Redis) -> None:
    """Request, raw and result bytes appear in the record hash and in no other key."""
    payloads = {name: b'{"m":"' + marker + b'"}' for name, marker in MARKERS.items()}
    head = await store.writer.create(RUN, "call-1", TOOL, payloads["request"])
    head = await store.writer.start_projecting(head, payloads["raw"])
    await store.writer.complete(head, payloads["result"], EvidenceStatus.NO_EVIDENCE, "docs")
    head = await store.writer.create(RUN, "call-2", TOOL, payloads["request"])
    await store.writer.fail(head, ErrorCode.EXECUTION_FAILED)
    ready, failed = (store.keys.record(RUN, call).encode() for call in ("call-1", "call-2"))
    holders = {"request": {ready, failed}, "raw": {ready}, "result": {ready}}
    keys = await namespace_keys(redis, store.keys.namespace)
    kinds = {(await redis.type(key)).decode() for key in keys}
    assert {"hash", "stream", "list"} <= kinds
    assert len(keys) >= 7  # 2 records, 2 streams, feed, run, progress (and meta)
    for key in keys:
        values = b"\x00".join(await key_values(redis, key))
        for name, marker in MARKERS.items():
            assert (marker in values) == (key in holders[name]), f"{name} bytes in {key!r}"


async def test_stored_events_form_a_hash_chain(store: Store) -> None:
    """Each event names the previous event's stored hash; stored h is the hash of its bytes."""
    await write_ready(store)
    stored = await store.events(RUN, "call-1")
    assert [s.event.version for s in stored if s.event] == [1, 2, 3]
    previous = GENESIS_HASH
    for entry in stored:
        assert entry.event is not None
        assert entry.event.prev_hash == previous
        assert entry.stored_hash == event_hash(entry.data) == entry.computed_hash
        previous = entry.stored_hash
    record = await store.get(RUN, "call-1")
    assert record is not None and record.state.last_hash == previous


async def test_refolding_the_events_reproduces_the_record(store: Store) -> None:
    """fold_all over the stored events gives exactly the state the record holds."""
    await write_ready(store)
    head = await store.writer.create(RUN, "call-2", TOOL, REQUEST)
    await store.writer.fail(head, ErrorCode.RESULT_TOO_LARGE, rejected_bytes=99_999)
    for call in ("call-1", "call-2"):
        stored = await store.events(RUN, call)
        folded = fold_all((s.event, s.stored_hash) for s in stored if s.event is not None)
        fields = await record_fields(store, RUN, call)
        assert folded == state_from_record({k.decode(): v.decode() for k, v in fields.items()})
        assert await audit(store, call) == []


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("status", b"ERROR", "tampered_field:status"),
        ("request_sha256", b"0" * 64, "tampered_field:request_sha256"),
        ("version", b"4", "tampered_field:version"),
        ("evidence_status", b"NO_EVIDENCE", "tampered_field:evidence_status"),
        ("e2", b"forged-event-id", "tampered_field:e2"),
        ("invocation_id", b"f" * 64, "tampered_field:invocation_id"),
        ("error_code", b"EXECUTION_FAILED", "tampered_field:error_code"),
        ("request", b'{"q":"other"}', "payload_digest_mismatch:request"),
        ("raw", RAW + b" ", "payload_digest_mismatch:raw"),
        ("result", b"", "payload_digest_mismatch:result"),
    ],
)
async def test_a_tampered_record_field_is_detected(
    store: Store, redis: Redis, field: str, value: bytes, problem: str
) -> None:
    """Changing one record field makes the audit name exactly that field."""
    await write_ready(store)
    await redis.hset(store.keys.record(RUN, "call-1"), field, value)
    assert await audit(store) == [problem]


async def test_a_deleted_payload_is_detected(store: Store, redis: Redis) -> None:
    """A record that lost a payload its events vouch for fails the digest check."""
    await write_ready(store)
    await redis.hdel(store.keys.record(RUN, "call-1"), "raw")
    assert await audit(store) == ["payload_digest_mismatch:raw"]


async def test_audit_reports_missing_halves(store: Store, redis: Redis) -> None:
    """A record without its stream, and a stream without its record, are each named."""
    await write_ready(store, "call-1")
    await write_ready(store, "call-2")
    await redis.delete(store.keys.stream(RUN, "call-1"))
    await redis.delete(store.keys.record(RUN, "call-2"))
    assert await audit(store, "call-1") == ["record_without_stream"]
    assert await audit(store, "call-2") == ["stream_without_record"]
    assert await audit(store, "call-3") == []


async def test_audit_finds_journal_tampering(store: Store) -> None:
    """Edited, re-hashed, undecodable, missing, repeated and illegal events are each named."""
    await write_ready(store)
    fields = await record_fields(store, RUN, "call-1")
    stored = await store.events(RUN, "call-1")
    first, second, third = stored
    assert verify_against_events(fields, stored) == []

    edited = msgspec.structs.replace(second, data=second.data + b" ")
    assert verify_against_events(fields, [first, edited, third]) == [
        "hash_mismatch:2",
        "broken_chain:3",
    ]
    rehashed = msgspec.structs.replace(second, stored_hash="a" * 64)
    assert verify_against_events(fields, [first, rehashed, third]) == ["hash_mismatch:2"]
    garbage = msgspec.structs.replace(second, data=b"{not json", event=None)
    assert verify_against_events(fields, [first, garbage, third]) == [
        "hash_mismatch:2",
        "undecodable_event:2",
        "broken_chain:3",
    ]
    assert verify_against_events(fields, [first, third]) == [
        "broken_chain:2",
        "illegal_transition:2",
    ]
    assert verify_against_events(fields, [first, second, third, third]) == [
        "broken_chain:4",
        "illegal_transition:4",
    ]
    ready = state_from_record({k.decode(): v.decode() for k, v in fields.items()})
    late = make_event("Failed", ready, run_id=RUN)
    data = encode_event(late)
    chained = StoredEvent(entry_id="0-4", data=data, stored_hash=event_hash(data), event=late)
    assert verify_against_events(fields, [*stored, chained]) == ["illegal_transition:4"]


async def test_audit_accepts_text_fields(store: Store) -> None:
    """The record may be given with str fields, as a decoded client returns them."""
    await write_ready(store)
    fields = await record_fields(store, RUN, "call-1")
    text = {k.decode(): v.decode() for k, v in fields.items()}
    assert verify_against_events(text, await store.events(RUN, "call-1")) == []
    text["scope"] = "elsewhere"
    assert verify_against_events(text, await store.events(RUN, "call-1")) == [
        "tampered_field:scope"
    ]


async def test_an_unknown_record_field_is_reported(store: Store, redis: Redis) -> None:
    """A field no event wrote is named as tampered, whatever it is called."""
    await write_ready(store)
    await redis.hset(store.keys.record(RUN, "call-1"), "approved", "1")
    await redis.hset(store.keys.record(RUN, "call-1"), "e9", "x")
    assert await audit(store) == ["tampered_field:e9", "tampered_field:approved"]
