"""``canon status``: records by status, feeds, consumer lag, dead letters, memory, settings."""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis.asyncio import Redis

from eventstore.store import Store
from eventstore.wire.keys import shard_of
from tests.integration.audit.test_replay import CALLS, RUN, populate, run_cli, store

__all__ = ["store"]  # the fixture, re-used from the replay tests


async def status_json(
    capsys: pytest.CaptureFixture[str], redis_url: str, namespace: str, *extra: str
) -> tuple[int, dict[str, Any]]:
    """Run ``canon status --json`` and return its exit code and document."""
    code, out, _ = await run_cli(capsys, redis_url, namespace, "status", "--json", *extra)
    return code, json.loads(out)


async def test_status_counts_records_by_status_and_feed_entries(
    store: Store, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Records are counted by status and every committed event has one feed entry."""
    await populate(store)
    _, status = await status_json(capsys, redis_url, namespace)
    assert status["namespace"] == namespace and status["shards"] == 4
    assert status["records_by_status"] == {"ERROR": 1, "PROJECTING": 1, "READY": 2}
    assert status["records"] == len(CALLS)
    assert status["feed_entries"] == 3 + 3 + 2 + 2
    assert status["groups"] == [] and status["dead_letters"] == 0
    assert status["used_memory_human"] not in ("", "unknown")


async def test_status_shows_group_lag_pending_and_dead_letters(
    store: Store, redis: Redis, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A group that read some entries shows its pending and lag; dead letters are a warning."""
    await populate(store)
    shard = shard_of(RUN, store.keys.shards)
    feed = store.keys.feed(shard)
    await redis.xgroup_create(feed, "receipts", id="0")
    await redis.xreadgroup("receipts", "worker-1", {feed: ">"}, count=4)
    await redis.xadd(store.keys.dead_letters(shard), {"reason": "poison"})
    code, status = await status_json(capsys, redis_url, namespace)
    assert code == 0  # it could report: warnings are in the document, not the exit code
    strict_code, _ = await status_json(capsys, redis_url, namespace, "--strict")
    assert strict_code == 1
    (group,) = status["groups"]
    assert (group["shard"], group["group"], group["consumers"]) == (shard, "receipts", 1)
    assert (group["pending"], group["lag"]) == (4, 10 - 4)
    assert status["dead_letters"] == 1
    assert any("dead-lettered" in warning for warning in status["warnings"])


async def test_status_warns_when_the_server_settings_are_unsafe(
    redis: Redis, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An eviction policy other than noeviction and appendonly off are warnings (exit 1
    with --strict)."""
    policy = (await redis.config_get("maxmemory-policy"))["maxmemory-policy"]
    await redis.config_set("maxmemory-policy", "allkeys-lru")
    try:
        code, status = await status_json(capsys, redis_url, namespace, "--strict")
    finally:
        await redis.config_set("maxmemory-policy", policy)
    assert code == 1
    assert status["maxmemory_policy"] == "allkeys-lru"
    assert any("not noeviction" in warning for warning in status["warnings"])
    appendonly = (await redis.config_get("appendonly"))["appendonly"]
    assert status["appendonly"] == appendonly
    assert any("appendonly" in w for w in status["warnings"]) == (appendonly != "yes")


async def test_status_warns_when_settings_make_records_cost_more(
    redis: Redis, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Settings that make records cost more than documented are listed with their fix."""
    value = (await redis.config_get("hash-max-ziplist-value"))["hash-max-ziplist-value"]
    await redis.config_set("hash-max-ziplist-value", "64")
    try:
        code, status = await status_json(capsys, redis_url, namespace, "--strict")
    finally:
        await redis.config_set("hash-max-ziplist-value", value)
    assert code == 1
    assert any("set hash-max-listpack-value 8192" in w for w in status["warnings"])


async def test_human_status_prints_tables_and_warnings(
    store: Store, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The human form shows the counts, the no-group note and memory in readable lines."""
    await populate(store)
    code, out, _ = await run_cli(capsys, redis_url, namespace, "status", "--strict")
    assert code in (0, 1)
    assert f"namespace {namespace}" in out
    assert "records by status" in out and "READY" in out
    assert "no consumer groups yet" in out
    assert "memory used:" in out and "maxmemory-policy: noeviction" in out
    assert ("WARNING" in out) == (code == 1)


async def test_human_status_lists_only_rows_that_say_something(
    store: Store, redis: Redis, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Groups with nothing pending and no lag are one line that counts them, while a group
    with work is listed; --json keeps every row."""
    await populate(store)
    shard = shard_of(RUN, store.keys.shards)
    for each in range(store.keys.shards):
        await redis.xgroup_create(store.keys.feed(each), "receipts", id="$", mkstream=True)
    await redis.xgroup_create(store.keys.feed(shard), "progress", id="0")
    _, out, _ = await run_cli(capsys, redis_url, namespace, "status")
    lines = out.splitlines()
    assert sum("progress" in line for line in lines) == 1  # the one group with lag
    assert f"{store.keys.shards} more groups: nothing pending, no lag" in out
    assert not any("receipts" in line for line in lines)
    _, document = await status_json(capsys, redis_url, namespace)
    assert len(document["groups"]) == store.keys.shards + 1


async def test_status_shows_the_cost_settings_it_read(
    redis: Redis, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user allowed CONFIG GET sees each cost setting's value by its 7.x name (6.2's
    ziplist names are read as their aliases), never ``unknown``, in JSON and in the table."""
    expected = {}
    for name, alias in (
        ("stream-node-max-bytes", "stream-node-max-bytes"),
        ("hash-max-listpack-value", "hash-max-ziplist-value"),
        ("hash-max-listpack-entries", "hash-max-ziplist-entries"),
    ):
        expected[name] = (await redis.config_get(alias))[alias]
    _, status = await status_json(capsys, redis_url, namespace)
    assert status["server_settings"] == expected
    assert "unknown" not in status["server_settings"].values()
    assert not any("could not be read" in warning for warning in status["warnings"])
    _, out, _ = await run_cli(capsys, redis_url, namespace, "status")
    assert f"stream-node-max-bytes: {expected['stream-node-max-bytes']}" in out
