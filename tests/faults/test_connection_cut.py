"""A connection killed in the middle of an append: the script ran, its reply was lost, and
redis-py's retry re-sends the same event id, which is answered as already applied — exactly
one event, one feed entry, the right version."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from eventstore import RunContext, ToolBoundary
from eventstore.audit import verify_against_events
from eventstore.server.embedded import EmbeddedRedis
from eventstore.store import Store
from eventstore.wire.scripts import Scripts
from eventstore.writer import Head
from machine.codes import ErrorCode, EvidenceStatus, Status
from projections.feed import FeedEntry
from tests.faults.proxy import CuttingProxy
from tests.helpers import record_fields
from tests.support.calls import RUN, TOOL, envelope, open_run, outcome
from tests.support.tools import FakeTool
from tests.support.waiting import wait_for


@pytest.fixture
async def cut(start_server: Any, proxy_to: Any, namespace: str) -> AsyncIterator[Any]:
    """A private server, a store reaching it through a cutting proxy, and an admin client."""
    server: EmbeddedRedis = start_server()
    proxy, port = await proxy_to(server.port)
    admin = Redis.from_url(server.url)
    store = Store.from_url(f"redis://127.0.0.1:{port}/0", namespace=namespace, shards=4)
    try:
        async with store:
            await open_run(store)
            # Loaded up front, so the lost reply is the script's, never a NOSCRIPT.
            scripts = Scripts(store.client)  # the store registers the same sources
            for script in (scripts.create, scripts.append):
                assert await admin.script_load(script.source) == script.sha
            yield store, proxy, admin
    finally:
        await admin.aclose()


async def kill_held_connection(proxy: CuttingProxy, admin: Redis) -> None:
    """Once the proxy holds the reply, CLIENT KILL the Redis connection it came on."""
    await asyncio.wait_for(proxy.reply_held.wait(), 10)
    assert proxy.victim is not None
    address = f"127.0.0.1:{proxy.victim.upstream_port}"
    [victim] = [c for c in await admin.client_list() if c["addr"] == address]
    assert await admin.execute_command("CLIENT", "KILL", "ID", victim["id"]) == 1


async def cut_during(proxy: CuttingProxy, admin: Redis, marker: bytes, write: Any) -> Head:
    """Run ``write`` with the reply to the command carrying ``marker`` lost to a kill."""
    proxy.arm(lambda chunk: b"EVALSHA" in chunk and marker in chunk)
    task = asyncio.create_task(write)
    await kill_held_connection(proxy, admin)
    head: Head = await asyncio.wait_for(task, 10)
    # The command reached Redis twice, byte for byte: the same event id was re-sent.
    assert len(proxy.forwarded) == 2 and proxy.forwarded[0] == proxy.forwarded[1]
    assert proxy.victim is not None and proxy.victim.held  # the lost reply existed
    return head


async def feed_entries(admin: Redis, store: Store, call: str) -> list[tuple[int, str]]:
    """(version, type) of every feed entry of one call, in feed order."""
    entries = await admin.xrange(store.keys.feed_of(RUN))
    return [
        (int(fields[b"v"]), FeedEntry.parse(0, entry_id.decode(), fields).event_type)
        for entry_id, fields in entries
        if fields[b"c"] == call.encode()
    ]


async def assert_exactly_once(admin: Redis, store: Store, call: str, kinds: list[str]) -> None:
    """The call's stream holds ``kinds`` once each, the feed one entry per event, and the
    record is exactly what its events fold to."""
    events = await store.events(RUN, call)
    assert [type(e.event).__name__ for e in events] == kinds
    assert [e.event.version for e in events if e.event is not None] == list(
        range(1, len(kinds) + 1)
    )
    assert await feed_entries(admin, store, call) == [
        (version, kind) for version, kind in enumerate(kinds, start=1)
    ]
    record = await record_fields(store, RUN, call)
    assert verify_against_events(record, events) == []
    assert int(record[b"version"]) == len(kinds)


async def test_each_append_survives_a_killed_connection(cut: Any) -> None:
    """Creation, raw storage and completion each lose their reply to a CLIENT KILL; each is
    re-sent with the same event id and applied exactly once."""
    store, proxy, admin = cut
    writer = store.writer

    head = await cut_during(proxy, admin, b"cut-1", writer.create(RUN, "cut-1", TOOL, b"{}"))
    assert (head.version, head.entry_id) == (1, "")
    head = await cut_during(proxy, admin, b"ProjectingStarted", writer.start_projecting(head, b"r"))
    assert (head.version, head.entry_id) == (2, "")
    head = await cut_during(
        proxy,
        admin,
        b"Completed",
        writer.complete(head, b'"ok"', EvidenceStatus.EVIDENCE_FOUND, "scope"),
    )
    assert (head.version, head.entry_id) == (3, "")

    await assert_exactly_once(
        admin, store, "cut-1", ["Preflighted", "ProjectingStarted", "Completed"]
    )
    assert await admin.lrange(store.keys.progress(RUN), 0, -1) == [f"{RUN}:cut-1".encode()]
    info = await store.run_info(RUN)
    assert info is not None and info.used_total == 1  # the budget was reserved once


async def test_boundary_call_survives_a_killed_connection(cut: Any) -> None:
    """A boundary call whose completion loses its reply still answers READY, and the store
    holds one Completed event and one feed entry for it."""
    store, proxy, admin = cut
    tool = FakeTool()
    boundary = ToolBoundary(store, {TOOL: tool.spec()})
    proxy.arm(lambda chunk: b"EVALSHA" in chunk and b"Completed" in chunk and b"cut-2" in chunk)

    call = asyncio.create_task(boundary.invoke(RunContext(RUN), envelope("cut-2")))
    await kill_held_connection(proxy, admin)
    reply = await asyncio.wait_for(call, 10)

    assert outcome(reply) == "READY" and tool.executed == 1
    assert len(proxy.forwarded) == 2 and proxy.forwarded[0] == proxy.forwarded[1]
    await assert_exactly_once(
        admin, store, "cut-2", ["Preflighted", "ProjectingStarted", "Completed"]
    )
    record = await store.get(RUN, "cut-2")
    assert record is not None and record.state.status is Status.READY


async def test_a_failure_event_survives_a_killed_connection(cut: Any) -> None:
    """A Failed event whose reply is lost is applied once: the record is ERROR at version 2
    and the run's progress list names the call once."""
    store, proxy, admin = cut
    head = await store.writer.create(RUN, "cut-3", TOOL, b"{}")
    head = await cut_during(
        proxy, admin, b"Failed", store.writer.fail(head, ErrorCode.EXECUTION_FAILED)
    )
    assert (head.version, head.entry_id) == (2, "")
    await assert_exactly_once(admin, store, "cut-3", ["Preflighted", "Failed"])
    assert await admin.lrange(store.keys.progress(RUN), 0, -1) == [f"{RUN}:cut-3".encode()]


async def test_a_creation_resent_after_its_record_expired_is_expired_not_a_duplicate(
    start_server: Any, proxy_to: Any, namespace: str
) -> None:
    """A creation's reply is held until its short-lived record has expired, then its
    connection is killed: the retry re-sends the same event, which finds the record gone and
    the run naming this very event. The agent is told RECORD_EXPIRED (an id it used once is
    no duplicate), the tool never runs and the budget is spent once; a second call of the
    id is still a duplicate."""
    server: EmbeddedRedis = start_server()
    proxy, port = await proxy_to(server.port)
    admin = Redis.from_url(server.url)
    url = f"redis://127.0.0.1:{port}/0"
    store = Store.from_url(url, namespace=namespace, shards=4, ttl=timedelta(milliseconds=200))
    try:
        async with store:
            await open_run(store)
            create = Scripts(store.client).create  # loaded: the lost reply is the script's
            assert await admin.script_load(create.source) == create.sha
            tool = FakeTool()
            boundary = ToolBoundary(store, {TOOL: tool.spec()})
            proxy.arm(lambda chunk: b"EVALSHA" in chunk and b"cut-4" in chunk)
            call = asyncio.create_task(boundary.invoke(RunContext(RUN), envelope("cut-4")))
            await asyncio.wait_for(proxy.reply_held.wait(), 10)
            record = store.keys.invocation(RUN, "cut-4").record
            await wait_for(lambda: admin.exists(record), timeout_s=10)  # created ...
            await wait_for(lambda: _gone(admin, record), timeout_s=10)  # ... and expired
            await kill_held_connection(proxy, admin)
            reply = await asyncio.wait_for(call, 10)

            assert outcome(reply) == ErrorCode.RECORD_EXPIRED.value and tool.executed == 0
            assert len(proxy.forwarded) == 2 and proxy.forwarded[0] == proxy.forwarded[1]
            info = await store.run_info(RUN)
            assert info is not None and info.used_total == 1
            again = await boundary.invoke(RunContext(RUN), envelope("cut-4"))
            assert outcome(again) == ErrorCode.DUPLICATE_TOOL_CALL.value
    finally:
        await admin.aclose()


async def _gone(admin: Redis, key: str) -> bool:
    """Whether ``key`` no longer exists (EXISTS expires a key past its time)."""
    return await admin.exists(key) == 0
