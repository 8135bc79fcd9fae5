"""Settling delivered feed entries: apply, count, remember failures, dead-letter.

An entry whose projection raises is left pending, so it comes back (to this consumer's
next drain or to whoever claims it once idle); past ``max_deliveries`` it is moved to
the shard's dead-letter stream with the last error type seen, and acknowledged. The
error type is also kept in Redis beside the delivery
(:mod:`projections.worker.failure_reasons`), so a consumer that takes over a killed
one's entry still dead-letters it with its reason.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Final, cast

from eventstore.logs import get_logger
from eventstore.writer import Head
from projections.feed import BatchProjection, FeedEntry, FeedProjection, MalformedEntry, Outcome
from projections.metrics import Metrics
from projections.worker.failure_reasons import FailureLog
from projections.worker.groups import Entry

log = get_logger("canon.projections")

#: Last error type per failing entry, kept for dead letters; bounded.
_ERROR_MEMORY: Final = 1024


class EntryHandler:
    """Applies delivered entries to one projection and keeps the outcome counters."""

    def __init__(
        self,
        projection: FeedProjection,
        *,
        max_deliveries: int,
        throttle_ms: int = 0,
        metrics: Metrics | None = None,
        concurrency: int = 16,
        failures: FailureLog | None = None,
    ) -> None:
        self.projection = projection  # the property below
        self._slots = asyncio.Semaphore(concurrency)
        self.max_deliveries = max_deliveries
        self.throttle_ms = throttle_ms
        self.metrics = metrics
        self.counters: Counter[str] = Counter()
        self._errors: dict[str, str] = {}
        # The same reasons in Redis, for whoever dead-letters an entry after this process.
        self.failures = failures

    @property
    def projection(self) -> FeedProjection:
        """What entries are applied to (a worker moves it to a rebuilt generation)."""
        return self._projection

    @projection.setter
    def projection(self, projection: FeedProjection) -> None:
        self._projection = projection
        # Checked once: isinstance against a runtime protocol walks its members each time.
        self._batches = isinstance(projection, BatchProjection)

    @property
    def name(self) -> str:
        """The projection's name."""
        return self.projection.name

    async def handle_all(
        self, shard: int, entries: list[Entry], deliveries: Mapping[str, int]
    ) -> None:
        """Settle a batch of one shard; ``deliveries`` gives known delivery counts (default 1)."""
        await self.handle_read({shard: entries}, deliveries)

    async def handle_read(
        self, read: Mapping[int, list[Entry]], deliveries: Mapping[str, int] | None = None
    ) -> None:
        """Settle what one read delivered, by shard (several shards of one server at once).

        A batch projection settles the well-formed entries in one step; what is left is
        settled one by one. Entries of one invocation are settled in feed order;
        different invocations concurrently, at most ``concurrency`` entries at a time per
        handler. Each write is version-guarded and settles its own entry, so the order
        across invocations does not matter. ``deliveries`` (by entry id) is only given
        for a read of one shard, where entry ids are unique.
        """
        deliveries = deliveries or {}
        # A batch is always finished, even after stop(): its entries are then acked.
        rest = read
        if self._batches and not self.throttle_ms:
            rest = await self._apply_batch(cast(BatchProjection, self.projection), read, deliveries)
        lanes: dict[object, list[tuple[int, Entry]]] = {}
        for shard, entries in rest.items():
            for entry in entries:
                fields = entry[1]
                lane = (fields.get(b"r"), fields.get(b"c")) if fields else (shard, entry[0])
                lanes.setdefault(lane, []).append((shard, entry))

        async def settle_lane(lane: list[tuple[int, Entry]]) -> None:
            for shard, (entry_id, fields) in lane:
                async with self._slots:
                    await self.handle(shard, entry_id, fields, deliveries.get(entry_id, 1))

        await asyncio.gather(*(settle_lane(lane) for lane in lanes.values()))

    async def _apply_batch(
        self,
        projection: BatchProjection,
        read: Mapping[int, list[Entry]],
        deliveries: Mapping[str, int],
    ) -> Mapping[int, list[Entry]]:
        """Settle the well-formed entries of a read in one step; return the rest by shard.

        Entries that are gone, malformed or due for the dead letters are returned to be
        settled one by one, and so is the whole read when the batch step fails: a bad
        entry then fails alone, with its own delivery count.
        """
        parsed: list[FeedEntry] = []
        rest: dict[int, list[Entry]] = {}
        for shard, entries in read.items():
            for entry_id, fields in entries:
                if fields and deliveries.get(entry_id, 1) <= self.max_deliveries:
                    try:
                        parsed.append(FeedEntry.parse(shard, entry_id, fields))
                        continue
                    except MalformedEntry:
                        pass
                rest.setdefault(shard, []).append((entry_id, fields))
        if not parsed:
            return rest
        try:
            outcomes = await projection.apply_batch(parsed)
        except Exception as exc:
            # Settled one by one next: a failing entry is then counted and kept on its own.
            log.info("batch_retried_singly", projection=self.name, error=type(exc).__name__)
            return read
        for entry, outcome in zip(parsed, outcomes, strict=True):
            self._count(outcome)
            self._errors.pop(entry.entry_id, None)
        return rest

    async def handle(
        self, shard: int, entry_id: str, fields: dict[bytes, bytes] | None, deliveries: int
    ) -> None:
        """Settle one delivered entry; a failure is counted and leaves it pending."""
        projection = self.projection
        try:
            if not fields:
                self._count(await projection.settle(shard, entry_id, "gone"))
                return
            if deliveries > self.max_deliveries:
                await self._dead_letter(shard, entry_id, fields, deliveries)
                return
            entry = FeedEntry.parse(shard, entry_id, fields)
            if self.throttle_ms:
                await asyncio.sleep(self.throttle_ms / 1000)
            self._count(await projection.apply(entry))
            self._errors.pop(entry_id, None)
        except Exception as exc:
            # Any failure leaves the entry pending: it is retried, then dead-lettered.
            self.counters["failed"] += 1
            if self.metrics is not None:
                self.metrics.failures.labels(self.name).inc()
            if len(self._errors) >= _ERROR_MEMORY:
                self._errors.pop(next(iter(self._errors)))
            self._errors[entry_id] = type(exc).__name__
            if self.failures is not None:
                await self.failures.record(shard, self.name, entry_id, type(exc).__name__)
            log.warning(
                "entry_failed",
                projection=self.name,
                shard=shard,
                entry_id=entry_id,
                deliveries=deliveries,
                error=type(exc).__name__,
            )

    async def _dead_letter(
        self, shard: int, entry_id: str, fields: dict[bytes, bytes], deliveries: int
    ) -> None:
        error = self._errors.pop(entry_id, None)
        if error is None and self.failures is not None:
            error = await self.failures.last(shard, self.name, entry_id)
        error = error or "unknown"
        moved = await self.projection.dead_letter(
            shard,
            entry_id,
            fields,
            reason="max_deliveries_exceeded",
            error=error,
            deliveries=deliveries,
        )
        if not moved:
            self._count(Outcome.DUPLICATE)
            return
        self.counters["dead"] += 1
        if self.metrics is not None:
            self.metrics.dead_letters.labels(self.name).inc()
        log.warning(
            "entry_dead_lettered",
            projection=self.name,
            shard=shard,
            entry_id=entry_id,
            deliveries=deliveries,
            error=error,
        )

    def _count(self, outcome: Outcome) -> None:
        self.counters[outcome.value] += 1
        if self.metrics is not None:
            self.metrics.events_projected.labels(self.name, outcome.value).inc()
            if outcome is Outcome.EXPIRED:
                self.metrics.expired_entries.labels(self.name).inc()


async def wait_for(
    projection: Callable[[], FeedProjection], head: Head, *, timeout_s: float = 5.0
) -> bool:
    """Poll the projection until it reflects ``head.version`` of its invocation.

    ``projection`` is asked for the projection on every poll, so a worker that moves to
    a rebuilt generation meanwhile is followed there. Returns True once it reflects the
    head, False when ``timeout_s`` passes first.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    delay = 0.005
    while True:
        if await projection().applied_version(head.run_id, head.tool_call_id) >= head.version:
            return True
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
        delay = min(delay * 2, 0.1)
