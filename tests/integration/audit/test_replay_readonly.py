"""Replay, verify, export and status never write and never refresh a TTL (INFO commandstats)."""

from __future__ import annotations

import time
from typing import Final

import pytest
from redis.asyncio import Redis

from eventstore.store import Store
from eventstore.wire.keys import shard_of
from tests.helpers import commandstats
from tests.integration.audit.test_replay import RUN, populate, run_cli, store

pytestmark = pytest.mark.backends("single", "cluster")

__all__ = ["store"]  # the fixture, re-used from the replay tests

#: Every command the audit commands may issue: reads, connection set-up and MULTI/EXEC.
#: Redis 7 reports subcommands as ``config|get``; Redis 6.2 as ``config``.
READ_COMMANDS: Final = frozenset(
    {
        "info",
        "scan",
        "hgetall",
        "hget",
        "hmget",
        "xrange",
        "xlen",
        "xinfo",
        "xinfo|groups",
        "pttl",
        "type",
        "lrange",
        "zrevrangebyscore",
        "config",
        "config|get",
        "client",
        "client|setinfo",
        "hello",
        "ping",
        "select",
        "multi",
        "exec",
    }
)


async def _pttls(redis: Redis, namespace: str) -> dict[bytes, int]:
    keys = [key async for key in redis.scan_iter(match=f"{namespace}:*", count=1000)]
    return {key: await redis.pttl(key) for key in keys}


async def _grown(redis: Redis, before: dict[str, int]) -> set[str]:
    after = await commandstats(redis)
    return {name for name, calls in after.items() if calls > before.get(name, 0)}


@pytest.mark.not_on_cluster(
    "runs verify and status, which scan one server (per primary on a cluster), "
    "and counts commands with INFO commandstats, which is per node"
)
async def test_audit_commands_issue_only_reads_and_leave_every_expiry(
    store: Store, redis: Redis, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Across every audit command no write or expiry command runs and no PTTL is refreshed."""
    await populate(store)
    feed = store.keys.feed(shard_of(RUN, store.keys.shards))
    await redis.xgroup_create(feed, "receipts", id="0")
    await redis.hset(store.keys.record(RUN, "call-none"), "tool", "other")  # verify re-reads
    pttls = await _pttls(redis, namespace)
    started = time.monotonic()
    before = await commandstats(redis)
    for argv in (
        ("replay", RUN),
        ("replay", RUN, "call-ready", "--json"),
        ("verify",),
        ("verify", "--json", "--batch", "2"),
        ("export", RUN, "--with-payloads"),
        ("status",),
        ("status", "--json"),
    ):
        code, _, err = await run_cli(capsys, redis_url, namespace, *argv)
        assert code in (0, 1), err
    grown = await _grown(redis, before)
    elapsed_ms = (time.monotonic() - started) * 1000
    assert grown <= READ_COMMANDS, grown - READ_COMMANDS
    assert {"hgetall", "xrange", "scan", "pttl"} <= grown  # the measurement saw the reads
    after = await _pttls(redis, namespace)
    assert after.keys() == pttls.keys()
    for key, pttl in pttls.items():
        if pttl < 0:
            assert after[key] == pttl, key
        else:
            assert 0 <= pttl - after[key] <= elapsed_ms + 100, key


async def test_the_commandstats_check_sees_a_write(store: Store, redis: Redis) -> None:
    """The measurement used above does catch a write: pausing the store shows up as HSET."""
    before = await commandstats(redis)
    await store.set_paused(False)
    assert "hset" in await _grown(redis, before) - READ_COMMANDS
