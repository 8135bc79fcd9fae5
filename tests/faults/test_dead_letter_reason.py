"""A dead letter says why, even when the process that saw the failures was SIGKILLed and
another one dead-lettered the entry: the last failure reason travels with the delivery."""

from __future__ import annotations

import asyncio
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from eventstore.server.embedded import EmbeddedRedis
from eventstore.store import Store
from eventstore.wire.keys import shard_of
from machine.codes import EvidenceStatus

RUN = "run-dl"
SHARDS = 2


async def _failures_logged(log_path: Path, process: Any, count: int, timeout_s: float) -> None:
    """Wait until the worker process logged ``count`` failed receipt entries."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = (await asyncio.to_thread(log_path.read_bytes)).splitlines()
        failed = [line for line in lines if b"entry_failed" in line and b'"receipts"' in line]
        if len(failed) >= count:
            return
        assert process.poll() is None, "the worker process exited before it was killed"
        assert time.monotonic() < deadline, "the worker did not fail the entries"
        await asyncio.sleep(0.02)


async def _settled_by_first_worker(store: Store, process: Any, timeout_s: float) -> None:
    """Wait until the worker process was handed every feed entry of both projections and
    has recorded a failure reason for each entry it still holds.

    Killing it earlier could catch an entry between its delivery and its failure record:
    that entry's dead letter would then rightly say "unknown".
    """
    deadline = time.monotonic() + timeout_s
    while not await _every_held_entry_has_a_reason(store):
        assert process.poll() is None, "the worker process exited before it was killed"
        assert time.monotonic() < deadline, "the worker did not settle the entries"
        await asyncio.sleep(0.02)


async def _every_held_entry_has_a_reason(store: Store) -> bool:
    for shard in range(SHARDS):
        feed = store.keys.feed(shard)
        last = await store.client.xrevrange(feed, count=1)
        if not last:
            continue
        groups = {group["name"]: group for group in await store.client.xinfo_groups(feed)}
        for projection in (b"receipts", b"progress"):
            group = groups.get(projection)
            if group is None or _stream_id(group["last-delivered-id"]) < _stream_id(last[0][0]):
                return False
            pending = await store.client.xpending_range(feed, projection, "-", "+", 100)
            for entry in pending:
                entry_id = entry["message_id"].decode()
                key = store.keys.failure(shard, projection.decode(), entry_id)
                if not await store.client.exists(key):
                    return False
    return True


def _stream_id(entry_id: bytes) -> tuple[int, int]:
    milliseconds, sequence = entry_id.split(b"-")
    return int(milliseconds), int(sequence)


async def test_a_dead_letter_keeps_the_reason_seen_by_a_killed_worker(
    start_server: Any, spawn_workers: Any, namespace: str
) -> None:
    """Worker A fails an invocation's three feed entries and is SIGKILLed; worker B takes
    them over past max deliveries and dead-letters them with A's error type, not unknown."""
    server: EmbeddedRedis = start_server()
    async with Store.from_url(server.url, namespace=namespace, shards=SHARDS) as store:
        await store.open_run(RUN, deadline=timedelta(minutes=5))
        head = await store.writer.create(RUN, "c1", "search", b'{"q":1}')
        head = await store.writer.start_projecting(head, b'{"raw":1}')
        await store.writer.complete(head, b'{"a":1}', EvidenceStatus.EVIDENCE_FOUND, "s")
        # A record that names no invocation and has no stream: building its receipt raises.
        await store.client.delete(store.keys.stream(RUN, "c1"))
        await store.client.hdel(store.keys.record(RUN, "c1"), "run_id", "tool_call_id", "tool")
        common = [
            f"--redis-url={server.url}",
            f"--namespace={namespace}",
            f"--shards={SHARDS}",
            "--max-deliveries=1",
        ]

        first, first_log = spawn_workers(*common, "--consumer=a", "--min-idle-ms=600000")
        await _failures_logged(first_log, first, 3, timeout_s=30)
        await _settled_by_first_worker(store, first, timeout_s=30)
        first.send_signal(signal.SIGKILL)
        assert await asyncio.to_thread(first.wait, 10) == -signal.SIGKILL

        second, second_log = spawn_workers(*common, "--consumer=b", "--min-idle-ms=0", "--burst")
        assert await asyncio.to_thread(second.wait, 60) == 0, second_log.read_text()

        dead = await store.client.xrange(store.keys.dead_letters(shard_of(RUN, SHARDS)))
        receipts = [fields for _, fields in dead if fields[b"projection"] == b"receipts"]
        assert len(receipts) == 3
        # The error type the first worker logged for a record that names no run.
        assert {fields[b"error"] for fields in receipts} == {b"InvalidArgument"}
        assert {fields[b"deliveries"] for fields in receipts} == {b"2"}
        assert not [fields for _, fields in dead if fields[b"error"] == b"unknown"]
