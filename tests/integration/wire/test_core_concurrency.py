"""Racing writers and retried writes: one winner, and a retry is never applied twice."""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from eventstore.errors import Refused
from eventstore.store import Store
from eventstore.writer import Head
from machine.codes import ErrorCode
from machine.events import ProjectingStarted, payload_digest
from tests.helpers import RAW, REQUEST, TOOL, make_event

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-1"
RACERS = 50


@pytest.fixture
async def store(make_open_store: Any) -> Store:
    """A store with one open run whose only tool has a budget of 100 calls."""
    store: Store = await make_open_store(shards=4, ttl=timedelta(minutes=5))
    await store.open_run(RUN, deadline=timedelta(minutes=5), tools={TOOL: 100})
    return store


async def feed_entries(store: Store, redis: Redis, tool_call_id: str) -> list[dict[bytes, bytes]]:
    """The feed entries of one invocation, in order."""
    entries = await redis.xrange(store.keys.feed_of(RUN))
    return [fields for _, fields in entries if fields[b"c"] == tool_call_id.encode()]


async def test_concurrent_creates_of_one_call_have_one_winner(store: Store, redis: Redis) -> None:
    """50 simultaneous creates of one call: one Head, 49 DUPLICATE_TOOL_CALL, budget used once."""
    outcomes = await asyncio.gather(
        *(store.writer.create(RUN, "call-1", TOOL, REQUEST) for _ in range(RACERS)),
        return_exceptions=True,
    )
    heads = [o for o in outcomes if isinstance(o, Head)]
    refusals = [o for o in outcomes if isinstance(o, Refused)]
    assert len(heads) == 1
    assert len(refusals) == RACERS - 1
    assert {r.code for r in refusals} == {ErrorCode.DUPLICATE_TOOL_CALL.value}
    assert await redis.xlen(store.keys.stream(RUN, "call-1")) == 1
    assert len(await feed_entries(store, redis, "call-1")) == 1
    info = await store.run_info(RUN)
    assert info is not None
    assert (info.used_total, info.used[TOOL], info.invocations) == (1, 1, 1)


async def test_concurrent_appends_at_one_version_have_one_winner(
    store: Store, redis: Redis
) -> None:
    """50 distinct events racing for version 2: one applied, 49 VERSION_CONFLICT."""
    head = await store.writer.create(RUN, "call-1", TOOL, REQUEST)
    events = [
        ProjectingStarted(
            event_id=os.urandom(16).hex(),
            version=2,
            at_ms=head.expires_at_ms - 60_000,
            prev_hash=head.last_hash,
            raw_sha256=payload_digest(RAW + bytes([i])),
            raw_bytes=len(RAW) + 1,
        )
        for i in range(RACERS)
    ]
    outcomes = await asyncio.gather(
        *(
            store.writer.append(event, RAW + bytes([i]), run_id=RUN, tool_call_id="call-1")
            for i, event in enumerate(events)
        ),
        return_exceptions=True,
    )
    winners = [i for i, o in enumerate(outcomes) if isinstance(o, Head)]
    refusals = [o for o in outcomes if isinstance(o, Refused)]
    assert len(winners) == 1
    assert len(refusals) == RACERS - 1
    assert {(r.code, r.current_version) for r in refusals} == {("VERSION_CONFLICT", 2)}
    assert await redis.xlen(store.keys.stream(RUN, "call-1")) == 2
    record = await store.get(RUN, "call-1")
    assert record is not None
    assert record.raw == RAW + bytes([winners[0]])
    assert record.state.raw_sha256 == events[winners[0]].raw_sha256
    assert record.state.version == 2


async def test_retried_append_is_answered_as_applied(store: Store, redis: Redis) -> None:
    """The same event sent twice: the second is applied-already, stored and announced once."""
    head = await store.writer.create(RUN, "call-1", TOOL, REQUEST)
    created = await store.get(RUN, "call-1")
    assert created is not None
    event = make_event("ProjectingStarted", created.state)
    first = await store.writer.append(event, RAW, run_id=RUN, tool_call_id="call-1")
    again = await store.writer.append(event, RAW, run_id=RUN, tool_call_id="call-1")
    assert first.entry_id != ""
    assert again.entry_id == ""
    assert (again.version, again.last_hash) == (first.version, first.last_hash)
    assert again.expires_at_ms == first.expires_at_ms == head.expires_at_ms
    stored = await store.events(RUN, "call-1")
    assert [entry.event for entry in stored][1:] == [event]
    assert len(await feed_entries(store, redis, "call-1")) == 2
    record = await store.get(RUN, "call-1")
    assert record is not None and record.state.version == 2


async def test_retried_creation_is_applied_once_and_budgeted_once(
    store: Store, redis: Redis
) -> None:
    """A retried Preflighted with its event id is answered as applied, not as a duplicate."""
    event = make_event("Preflighted", None)
    first = await store.writer.append(event, REQUEST, run_id=RUN, tool_call_id="call-1")
    again = await store.writer.append(event, REQUEST, run_id=RUN, tool_call_id="call-1")
    assert first.entry_id != ""
    assert (again.version, again.last_hash, again.entry_id) == (1, first.last_hash, "")
    assert again.expires_at_ms == first.expires_at_ms
    assert await redis.xlen(store.keys.stream(RUN, "call-1")) == 1
    assert len(await feed_entries(store, redis, "call-1")) == 1
    info = await store.run_info(RUN)
    assert info is not None
    assert (info.used_total, info.used[TOOL]) == (1, 1)
    other = make_event("Preflighted", None)
    with pytest.raises(Refused) as refused:
        await store.writer.append(other, REQUEST, run_id=RUN, tool_call_id="call-1")
    assert refused.value.code == ErrorCode.DUPLICATE_TOOL_CALL.value


async def test_concurrent_retries_of_one_event_apply_it_once(store: Store, redis: Redis) -> None:
    """The same event sent 50 times at once is applied by exactly one of them."""
    event = make_event("Preflighted", None)
    heads = await asyncio.gather(
        *(
            store.writer.append(event, REQUEST, run_id=RUN, tool_call_id="call-1")
            for _ in range(RACERS)
        )
    )
    assert sum(1 for head in heads if head.entry_id) == 1
    assert {(head.version, head.last_hash) for head in heads} == {(1, heads[0].last_hash)}
    assert await redis.xlen(store.keys.stream(RUN, "call-1")) == 1
    info = await store.run_info(RUN)
    assert info is not None and info.used_total == 1
