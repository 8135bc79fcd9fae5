"""The worker runtime: one consumer of one projection's group on every shard feed it owns.

A worker first drains its own pending entries on each shard (left by an earlier run under
the same consumer name), then loops: take over entries idle longer than ``min_idle_ms``
(XAUTOCLAIM; a crashed consumer's work), read new entries (XREADGROUP ``>`` with BLOCK).
On one server a single XREADGROUP covers every feed it owns, and what it delivers is
settled as one batch (one read script, one write script); on a Redis Cluster, where one
command cannot span the feeds' slots, each shard is read and settled on its own. The
projection acknowledges an entry in the same script that writes its output; an entry
whose projection raises stays pending and comes back, until its delivery count passes
``max_deliveries`` and it is moved to the shard's dead-letter stream.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections import Counter
from collections.abc import Sequence
from typing import TypedDict

from redis.asyncio import Redis

from eventstore.errors import InvalidArgument, StoreUnavailable
from eventstore.logs import get_logger
from eventstore.store import Store
from eventstore.writer import Head
from projections.feed import FeedProjection
from projections.generations import Generational, current_generation
from projections.metrics import Metrics
from projections.worker.failure_reasons import FailureLog
from projections.worker.groups import (
    Entry,
    GroupMissing,
    blocking_client,
    claim_idle,
    deliveries,
    ensure_group,
    read_group,
    read_groups,
    retire_consumer,
)
from projections.worker.handling import EntryHandler, wait_for
from projections.worker.lag import ShardLag, shard_lag
from projections.worker.outage import Outage
from projections.worker.upkeep import pause_unless, report_lag, trim_periodically, watch_generation

log = get_logger("canon.projections")


class WorkerOptions(TypedDict, total=False):
    """Keyword options of :class:`Worker` (see its arguments)."""

    consumer: str | None
    shards: Sequence[int] | None
    block_ms: int
    batch: int
    min_idle_ms: int
    max_deliveries: int
    throttle_ms: int
    metrics: Metrics | None
    generation: int | None


def default_consumer() -> str:
    """Return a consumer name unique to this process: host name and process id."""
    return f"{socket.gethostname()[:40]}-{os.getpid()}"


class Worker:
    """Runs one projection over the shard feeds as one consumer of its group.

    Args:
        store: the store whose feeds are read.
        projection: what each entry is applied to; its name is the group name.
        consumer: this consumer's name (distinct per running worker; reuse it across
            restarts so the worker drains its own pending entries first).
        shards: the shards this worker reads (default: all).
        block_ms: how long one XREADGROUP waits for new entries.
        batch: most entries read per call.
        min_idle_ms: entries pending longer than this in any consumer are taken over.
        max_deliveries: deliveries after which an entry is dead-lettered.
        throttle_ms: pause before each entry (load shaping; fault tests).
        metrics: where counters and lag figures are reported, if anywhere.
        generation: the projection generation to write; None follows the one readers
            use (:mod:`projections.generations`), switching groups when a rebuild
            switches it.

    """

    def __init__(
        self,
        store: Store,
        projection: FeedProjection,
        *,
        consumer: str | None = None,
        shards: Sequence[int] | None = None,
        block_ms: int = 1000,
        batch: int = 64,
        min_idle_ms: int = 30_000,
        max_deliveries: int = 5,
        throttle_ms: int = 0,
        metrics: Metrics | None = None,
        generation: int | None = None,
    ) -> None:
        if block_ms < 1 or batch < 1 or min_idle_ms < 0 or max_deliveries < 1:
            raise InvalidArgument("block_ms and batch must be positive, max_deliveries at least 1")
        self.store = store
        self.projection = projection
        self.consumer = consumer or default_consumer()
        self.shards = tuple(shards) if shards is not None else tuple(range(store.keys.shards))
        self.block_ms = block_ms
        self.batch = batch
        self.min_idle_ms = min_idle_ms
        self.metrics = metrics
        self.handler = EntryHandler(
            projection,
            max_deliveries=max_deliveries,
            throttle_ms=throttle_ms,
            metrics=metrics,
            failures=FailureLog(store),
        )
        self.generation = generation
        self._stop = asyncio.Event()
        # Set by stop() and when the projection's generation changes: the shard loops
        # leave, and run() either returns or follows the new generation.
        self._leave = asyncio.Event()

    @property
    def counters(self) -> Counter[str]:
        """Entries settled by outcome, plus ``failed``, ``dead`` and ``reclaimed``."""
        return self.handler.counters

    @property
    def name(self) -> str:
        """The projection's name (the consumer group)."""
        return self.projection.name

    def __repr__(self) -> str:
        counts = " ".join(f"{name}={self.counters[name]}" for name in sorted(self.counters))
        return (
            f"<{type(self).__name__} projection={self.name!r} consumer={self.consumer!r} "
            f"shards={len(self.shards)} {counts}>".replace(" >", ">")
        )

    def stop(self) -> None:
        """Ask the worker to stop once its current batches are settled."""
        self._stop.set()
        self._leave.set()

    async def ensure_groups(self) -> None:
        """Create the projection's group on every owned feed (from the feed's start)."""
        for shard in self.shards:
            await self._ensure_group(shard)

    async def _ensure_group(self, shard: int) -> None:
        await ensure_group(self.store.client, self.store.keys.feed(shard), self.name)

    async def run(self, *, burst: bool = False) -> None:
        """Consume until :meth:`stop` (or, with ``burst``, until nothing is left).

        Burst mode drains the worker's own pending entries, then takes over idle ones and
        reads new ones until a pass finds none, and returns: tests use it instead of sleeps.
        A following worker that sees its projection switched to another generation leaves
        the old group once its batches are settled and goes on in the new one.
        """
        # stop() ends one run; a later run (e.g. a burst that catches up) starts afresh.
        self._stop.clear()
        while True:
            self._leave.clear()
            await self._adopt_generation()
            await self._run_groups(burst=burst)
            await self._retire()
            if burst or self._stop.is_set():
                break
        log.info("worker_stopped", projection=self.name, consumer=self.consumer, **self.counters)

    async def _run_groups(self, *, burst: bool) -> None:
        await self.ensure_groups()
        log.info("worker_started", projection=self.name, consumer=self.consumer, burst=burst)
        if burst:
            try:
                async with asyncio.TaskGroup() as group:
                    for shard in self.shards:
                        group.create_task(self._burst_shard(shard))
            except* StoreUnavailable as failures:
                raise failures.exceptions[0] from None
            return
        lanes = self._lanes()
        client, block_ms = blocking_client(self.store, self.block_ms, len(lanes) + 1)
        try:
            async with asyncio.TaskGroup() as group:
                for lane in lanes:
                    group.create_task(self._follow_lane(lane, client, block_ms))
                if self.metrics is not None:
                    group.create_task(report_lag(self.lag, self.metrics, self.name, self._leave))
                group.create_task(trim_periodically(self.store, self.name, self._leave))
                if self.generation is None and isinstance(self.projection, Generational):
                    group.create_task(
                        watch_generation(self.store, self.projection, self.consumer, self._leave)
                    )
        finally:
            if client is not self.store.client:
                await client.aclose()

    async def _adopt_generation(self) -> None:
        """Point the projection at the generation it should write (pinned or current)."""
        projection = self.projection
        if not isinstance(projection, Generational):
            return
        wanted = self.generation or await current_generation(self.store, projection.family)
        if wanted != projection.generation:
            self.projection = projection.at_generation(wanted)
            self.handler.projection = self.projection

    async def _retire(self) -> None:
        """Remove this consumer from each group where it holds nothing pending.

        Consumer names are per process by default, so groups would otherwise collect one
        idle consumer per restart. A consumer with pending entries is kept: deleting it
        would drop them.
        """
        kept: list[int] = []
        for shard in self.shards:
            try:
                await retire_consumer(
                    self.store.client, self.store.keys.feed(shard), self.name, self.consumer
                )
            except StoreUnavailable:
                kept.append(shard)
        if kept:  # one line for them all: a worker stopped while Redis is down has many
            log.warning(
                "consumer_not_retired",
                projection=self.name,
                shards=len(kept),
                first_shard=kept[0],
            )

    async def _burst_shard(self, shard: int) -> None:
        await self._drain_own(shard)
        while not self._leave.is_set():
            claimed = await self._reclaim(shard)
            read = await self._read_new(shard, self.store.client, block_ms=None)
            if claimed == 0 and read == 0:
                return

    def _lanes(self) -> list[tuple[int, ...]]:
        """The shards each blocking read covers: all of them on one server.

        One XREADGROUP over every feed wakes the worker once for whatever arrived on any
        shard, and the batches read together share their script round trips. On a
        cluster one command cannot span the feeds' slots, so each shard is read alone.
        """
        if self.store.cluster is not None:
            return [(shard,) for shard in self.shards]
        return [self.shards] if self.shards else []

    async def _follow_lane(self, lane: tuple[int, ...], client: Redis, block_ms: int) -> None:
        loop = asyncio.get_running_loop()
        drained: set[int] = set()
        next_claim = 0.0
        outage = Outage(self.name)
        while not self._leave.is_set():
            try:
                for shard in lane:
                    if shard not in drained:
                        await self._drain_own(shard)
                        drained.add(shard)
                if loop.time() >= next_claim:
                    for shard in lane:
                        await self._reclaim(shard)
                    next_claim = loop.time() + max(self.min_idle_ms, 100) / 2000
                await self._read_lane(lane, client, block_ms=block_ms)
                outage.succeeded(shards=len(lane))
            except StoreUnavailable as exc:
                # Backing off: an outage is a few lines, not one per retry (outage.py).
                await pause_unless(self._leave, outage.failed(exc.args[0], shards=len(lane)))

    async def _read_lane(self, lane: tuple[int, ...], client: Redis, *, block_ms: int) -> None:
        """Read new entries of the lane's feeds with one XREADGROUP and settle them together."""
        if len(lane) == 1:
            await self._read_new(lane[0], client, block_ms=block_ms)
            return
        feeds = {self.store.keys.feed(shard): shard for shard in lane}
        try:
            read = await read_groups(
                client,
                dict.fromkeys(feeds, ">"),
                self.name,
                self.consumer,
                count=self.batch,
                block_ms=block_ms,
            )
        except GroupMissing:
            for shard in lane:
                if not self._leave.is_set():
                    await self._group_missing(shard)
            return
        await self.handler.handle_read({feeds[feed]: entries for feed, entries in read.items()})

    async def _read(
        self, client: Redis, shard: int, start: str, block_ms: int | None
    ) -> list[Entry]:
        feed = self.store.keys.feed(shard)
        try:
            return await read_group(
                client,
                feed,
                self.name,
                self.consumer,
                start=start,
                count=self.batch,
                block_ms=block_ms,
            )
        except GroupMissing:
            await self._group_missing(shard)
            return []

    async def _group_missing(self, shard: int) -> None:
        """Create a group deleted under us again, unless a rebuild retired its generation."""
        projection = self.projection
        if (
            self.generation is None
            and isinstance(projection, Generational)
            and await current_generation(self.store, projection.family) != projection.generation
        ):
            self._leave.set()
            return
        await self._ensure_group(shard)

    async def _deliveries(self, shard: int, entries: list[Entry]) -> dict[str, int]:
        feed = self.store.keys.feed(shard)
        return await deliveries(self.store.client, feed, self.name, self.consumer, entries)

    async def _drain_own(self, shard: int) -> None:
        """Settle the entries already delivered to this consumer name (a restart)."""
        start = "0"
        while not self._leave.is_set():
            entries = await self._read(self.store.client, shard, start, None)
            if not entries:
                return
            await self.handler.handle_all(shard, entries, await self._deliveries(shard, entries))
            start = entries[-1][0]

    async def _read_new(self, shard: int, client: Redis, *, block_ms: int | None) -> int:
        entries = await self._read(client, shard, ">", block_ms)
        await self.handler.handle_all(shard, entries, {})
        return len(entries)

    async def _reclaim(self, shard: int) -> int:
        """Take over entries idle longer than ``min_idle_ms``; return how many were claimed."""
        feed = self.store.keys.feed(shard)
        cursor, claimed = "0-0", 0
        while not self._leave.is_set():
            try:
                cursor, entries, page = await claim_idle(
                    self.store.client,
                    feed,
                    self.name,
                    self.consumer,
                    min_idle_ms=self.min_idle_ms,
                    cursor=cursor,
                    count=self.batch,
                )
            except GroupMissing:
                # Nothing of a vanished group is left to claim; without creating it again
                # here, a worker whose server came back empty would retry this forever.
                await self._group_missing(shard)
                return claimed
            claimed += page
            if entries:
                self.counters["reclaimed"] += len(entries)
                log.info("entries_reclaimed", projection=self.name, shard=shard, count=len(entries))
                await self.handler.handle_all(
                    shard, entries, await self._deliveries(shard, entries)
                )
            if len(entries) < page:
                # Entries deleted from the stream were claimed unnamed (Redis 6.2); reading
                # our own pending entries names them, and they are settled there.
                await self._drain_own(shard)
            if cursor == "0-0":
                break
        return claimed

    async def lag(self) -> list[ShardLag]:
        """Return the lag figures of this projection on every owned shard."""
        return [await shard_lag(self.store, shard, self.name) for shard in self.shards]

    async def wait_for(self, head: Head, timeout_s: float = 5.0) -> bool:
        """Wait until the projection reflects ``head`` (read-your-writes); False on timeout."""
        return await wait_for(lambda: self.projection, head, timeout_s=timeout_s)
