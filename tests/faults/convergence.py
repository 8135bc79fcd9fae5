"""Checks that the projections converged on the store: nothing pending, nothing missed,
nothing counted twice, every receipt at its record's version, every view matching records."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any, Final

import msgspec

from eventstore.store import Store
from machine.events import stored_document
from projections import read_view

GROUPS: Final = ("receipts", "progress")
#: Position-hash fields that are not per-entry counters.
_NOT_COUNTERS: Final = frozenset({b"last_entry_id", b"updated_at_ms"})


async def scan(store: Store, kind: str) -> list[bytes]:
    """Every key of one kind (``inv``, ``receipt``, ``rview``...) in the namespace."""
    pattern = store.keys.scan_pattern(kind)
    return [key async for key in store.client.scan_iter(match=pattern, count=1000)]


def _kind(store: Store, key: bytes) -> str | None:
    parsed = store.keys.parse_invocation_key(key)
    return parsed.kind if parsed is not None else None


async def records(store: Store) -> dict[tuple[str, str], dict[str, Any]]:
    """(run id, tool call id) → status, version and invocation id of every live record."""
    keys = [key for key in await scan(store, "inv") if _kind(store, key) == "record"]
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for start in range(0, len(keys), 500):
        batch = keys[start : start + 500]
        async with store.client.pipeline(transaction=False) as pipe:
            for key in batch:
                pipe.hmget(key, ["status", "version", "invocation_id"])
            replies = await pipe.execute()
        for key, (status, version, invocation) in zip(batch, replies, strict=True):
            if status is None:
                continue  # expired between SCAN and HMGET
            parsed = store.keys.parse_invocation_key(key)
            assert parsed is not None
            found[(parsed.run_id, parsed.tool_call_id)] = {
                "status": status.decode(),
                "version": int(version),
                "invocation_id": invocation.decode(),
            }
    return found


async def terminal_events(store: Store) -> Counter[str]:
    """Terminal events (Completed, Failed) found in the live invocation streams."""
    pattern = store.keys.invocation_scan_pattern()
    found = [key async for key in store.client.scan_iter(match=pattern, count=1000)]
    keys = [key for key in found if _kind(store, key) == "stream"]
    kinds: Counter[str] = Counter()
    for start in range(0, len(keys), 500):
        async with store.client.pipeline(transaction=False) as pipe:
            for key in keys[start : start + 500]:
                pipe.xrange(key)
            for entries in await pipe.execute():
                for _, fields in entries:
                    kind = stored_document(fields[b"e"])["type"]
                    if kind in ("Completed", "Failed"):
                        kinds[kind] += 1
    return kinds


async def receipts(store: Store) -> dict[str, dict[str, Any]]:
    """invocation id → version and decoded receipt of every materialized receipt."""
    keys = await scan(store, "receipt")
    found: dict[str, dict[str, Any]] = {}
    for start in range(0, len(keys), 500):
        batch = keys[start : start + 500]
        async with store.client.pipeline(transaction=False) as pipe:
            for key in batch:
                pipe.hmget(key, ["version", "receipt"])
            replies = await pipe.execute()
        for key, (version, body) in zip(batch, replies, strict=True):
            if version is not None:
                found[key.decode().rsplit(":", 1)[1]] = {
                    "version": int(version),
                    "receipt": msgspec.json.decode(body),
                }
    return found


def receipt_status(receipt: dict[str, Any]) -> str:
    """READY or ERROR as a completed receipt states it (else its journal state)."""
    result = receipt.get("result") or {}
    return {"ready": "READY", "error": "ERROR"}.get(result.get("state"), receipt["journal_state"])


async def feed_entries(store: Store) -> int:
    """Entries in all shard feeds (nothing is trimmed while a test runs)."""
    feeds = [store.keys.feed(shard) for shard in range(store.keys.shards)]
    return sum([await store.client.xlen(feed) for feed in feeds])


async def settled(store: Store, group: str) -> int:
    """Entries a group has settled: the per-entry counters of its shard positions."""
    total = 0
    for shard in range(store.keys.shards):
        position = await store.client.hgetall(store.keys.position(shard, group))
        total += sum(int(v) for k, v in position.items() if k not in _NOT_COUNTERS)
    return total


async def wait_until_caught_up(store: Store, timeout_s: float) -> None:
    """Wait until every group has settled every feed entry."""
    deadline = time.monotonic() + timeout_s
    while True:
        entries = await feed_entries(store)
        if all([await settled(store, group) >= entries for group in GROUPS]):
            return
        assert time.monotonic() < deadline, "the workers did not catch up"
        await asyncio.sleep(0.5)


async def assert_settled_once(store: Store) -> None:
    """No entry is pending in any group, none dead-lettered, and each group's per-entry
    counters add up to exactly the number of feed entries: each settled exactly once."""
    client = store.client
    entries = await feed_entries(store)
    for group in GROUPS:
        for shard in range(store.keys.shards):
            pending = await client.xpending(store.keys.feed(shard), group)
            assert pending["pending"] == 0, (group, shard, pending)
            assert await client.xlen(store.keys.dead_letters(shard)) == 0
        counted = await settled(store, group)
        assert counted == entries, (group, counted, entries)


async def assert_projections_match(store: Store) -> dict[tuple[str, str], dict[str, Any]]:
    """Every live record has a receipt at its version and no receipt outlives its record;
    every run's progress view counts exactly its records by status. Returns the records."""
    live = await records(store)
    materialized = await receipts(store)
    by_invocation = {record["invocation_id"]: record for record in live.values()}
    assert materialized.keys() == by_invocation.keys()
    for invocation, receipt in materialized.items():
        record = by_invocation[invocation]
        assert receipt["version"] == record["version"], (invocation, receipt, record)
        if record["status"] != "PROJECTING":
            assert receipt_status(receipt["receipt"]) == record["status"]
    per_run: dict[str, Counter[str]] = {}
    for (run_id, _), record in live.items():
        per_run.setdefault(run_id, Counter())[record["status"]] += 1
    for run_id, statuses in per_run.items():
        view = await read_view(store, run_id)
        assert view is not None, run_id
        assert view.by_status == dict(statuses), (run_id, view.by_status, statuses)
        assert view.invocations == sum(statuses.values())
    return live
