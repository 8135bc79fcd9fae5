"""Rebuild a projection from the records into a new generation, then switch readers to it.

For a new projection, or after a bug fix in one, its output is recomputed from the
canonical records while the live workers keep serving the current generation:

1. **Claim.** ``rebuilding:<projection>`` in the namespace metadata (HSETNX): one rebuild
   of a projection at a time; ``takeover`` replaces the claim of a rebuild that died.
2. **Open the new group** on every shard feed at its current end: every event committed
   from now on reaches the new generation through it.
3. **Project every record** (SCAN, batched) as it is now into the new generation's keys,
   settling no feed entry. An event committed during the scan may reach the output both
   ways; outputs are version-guarded per invocation, so it is counted once.
4. **Drain** the new group with a worker pinned to the new generation.
5. **Switch** with one script that checks the claim and sets ``generation:<projection>``:
   every reader moves at once, and following workers move to the new group within about
   a second, going on where the drain left it.
6. **Drain again**, so the entries committed just before the switch wait for no worker.
7. **Retire the old generation** once its group has no consumer left (following workers
   delete theirs as they move): its groups, positions and outputs are deleted. When a
   consumer stays past ``grace_s`` (a worker pinned to it, or a dead one) the old
   generation is kept; its outputs expire with their records.

Interrupted before step 5, readers stay on the old generation and the half-built one is
removed by the next rebuild's takeover.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter
from collections.abc import Callable
from typing import Final, cast

import msgspec
from redis.asyncio import Redis

from eventstore.errors import CanonError, InvalidArgument, redis_errors
from eventstore.logs import get_logger
from eventstore.store import Store
from eventstore.wire.keys import generation_kind
from eventstore.wire.replies import reply_text
from eventstore.writer import now_ms
from projections.generations import REBUILD_FIELD, current_generation, group_name
from projections.progress import ProgressProjection
from projections.receipts.projection import ReceiptProjection
from projections.scripts import (
    FOLDER,
    SwitchGenerationArgv,
    SwitchGenerationKeys,
    SwitchGenerationScript,
)
from projections.worker.lag import feed_groups
from projections.worker.runtime import Worker, default_consumer

log = get_logger("canon.projections")

#: The projections a rebuild knows, by name.
PROJECTIONS: Final[dict[str, type[ReceiptProjection] | type[ProgressProjection]]] = {
    ReceiptProjection.family: ReceiptProjection,
    ProgressProjection.family: ProgressProjection,
}
#: Key kind of each projection's output (generation 1 spelling).
OUTPUT_KINDS: Final = {ReceiptProjection.family: "receipt", ProgressProjection.family: "rview"}

SCAN_BATCH: Final = 500
_CONCURRENCY: Final = 32
_POLL_S: Final = 0.2


class RebuildInProgress(CanonError):
    """Raised when another rebuild of the same projection holds the claim."""


class RebuildReport(msgspec.Struct, frozen=True, kw_only=True):
    """What one rebuild did.

    Attributes:
        projection: the projection rebuilt.
        previous_generation: the generation readers used before.
        generation: the generation readers use now.
        records: records projected from the scan, by outcome.
        drained: feed entries settled by the rebuild's own worker, by outcome.
        old_generation_removed: the previous generation's groups and outputs are gone.
        old_keys_deleted: output keys of the previous generation deleted.
        seconds: how long the rebuild took.

    """

    projection: str
    previous_generation: int
    generation: int
    records: dict[str, int]
    drained: dict[str, int]
    old_generation_removed: bool
    old_keys_deleted: int
    seconds: float


class Rebuild:
    """One rebuild of one projection (see the module documentation for its steps).

    Args:
        store: the store whose projection is rebuilt.
        projection: ``receipts`` or ``progress``.
        takeover: replace the claim of another rebuild (one that died).
        keep_old: leave the previous generation in place after the switch.
        grace_s: how long to wait for workers to leave the previous generation.
        on_record: called with the number of records projected so far, per batch.

    """

    def __init__(
        self,
        store: Store,
        projection: str,
        *,
        takeover: bool = False,
        keep_old: bool = False,
        grace_s: float = 10.0,
        on_record: Callable[[int], None] | None = None,
    ) -> None:
        if projection not in PROJECTIONS:
            raise InvalidArgument(f"unknown projection; choose one of {', '.join(PROJECTIONS)}")
        if grace_s < 0:
            raise InvalidArgument("grace_s must not be negative")
        self.store = store
        self.projection = projection
        self.takeover = takeover
        self.keep_old = keep_old
        self.grace_s = grace_s
        self.on_record = on_record
        self._field = REBUILD_FIELD + projection

    async def run(self) -> RebuildReport:
        """Rebuild, switch and retire the previous generation; return what was done.

        Raises:
            RebuildInProgress: another rebuild holds the claim (and ``takeover`` is off).
            RebuildLost: another rebuild took the claim over before the switch.
            StoreUnavailable: Redis failed or timed out.

        """
        started = time.monotonic()
        previous = await current_generation(self.store, self.projection)
        generation, claim = await self._claim(previous)
        log.info("rebuild_started", projection=self.projection, generation=generation)
        target = PROJECTIONS[self.projection](self.store, generation=generation)
        for shard in range(self.store.keys.shards):
            await self._open_group(shard, target.name)
        records = await self._project_records(target)
        worker = Worker(
            self.store, target, consumer=f"rebuild-{default_consumer()}", generation=generation
        )
        await worker.run(burst=True)
        await SwitchGenerationScript(self.store.client, FOLDER)(
            SwitchGenerationScript.arguments(
                SwitchGenerationKeys(self.store.keys.meta()),
                SwitchGenerationArgv(
                    projection=self.projection, token=claim, generation=generation
                ),
            )
        )
        switched_at = time.monotonic()
        log.info("rebuild_switched", projection=self.projection, generation=generation)
        await worker.run(burst=True)
        removed, deleted = False, 0
        if not self.keep_old:
            old_group = group_name(self.projection, previous)
            removed = await self._await_departure(old_group, switched_at)
            if removed:
                deleted = await self._remove_generation(previous)
            else:
                log.warning("old_generation_kept", projection=self.projection, generation=previous)
        drained = {k: v for k, v in sorted(worker.counters.items()) if v}
        return RebuildReport(
            projection=self.projection,
            previous_generation=previous,
            generation=generation,
            records=dict(sorted(records.items())),
            drained=drained,
            old_generation_removed=removed,
            old_keys_deleted=deleted,
            seconds=round(time.monotonic() - started, 3),
        )

    async def _claim(self, current: int) -> tuple[int, str]:
        """Take the rebuild claim; return the new generation and the claim's value."""
        meta = self.store.keys.meta()
        async with redis_errors():
            held = cast(bytes | None, await self.store.client.hget(meta, self._field))
        abandoned = 0
        if held is not None:
            number, _, rest = held.decode().partition(":")
            abandoned = int(number) if number.isdigit() else 0
            if not self.takeover:
                raise RebuildInProgress(
                    f"a rebuild of {self.projection} into generation {number} holds the "
                    f"claim since {_iso(rest.partition(':')[0])}; pass --takeover if it died"
                )
        generation = max(current, abandoned) + 1
        claim = f"{generation}:{now_ms()}:{secrets.token_hex(8)}"
        async with redis_errors():
            if held is None:
                taken = await self.store.client.hsetnx(meta, self._field, claim)
            else:
                await self.store.client.hset(meta, self._field, claim)
                taken = True
        if not taken:
            raise RebuildInProgress(f"another rebuild of {self.projection} has just started")
        if abandoned > current:
            # The abandoned generation was never switched to: nobody reads it.
            await self._remove_generation(int(abandoned))
        return generation, claim

    async def _open_group(self, shard: int, group: str) -> None:
        """Create ``group`` at the feed's current end (a fresh one if a stale one exists)."""
        feed = self.store.keys.feed(shard)
        async with redis_errors():
            if await self._has_group(feed, group):
                await self.store.client.xgroup_destroy(feed, group)
            await self.store.client.xgroup_create(feed, group, id="$", mkstream=True)

    async def _has_group(self, feed: str, group: str) -> bool:
        return any(
            reply_text(info["name"]) == group for info in await feed_groups(self.store, feed)
        )

    async def _project_records(
        self, target: ReceiptProjection | ProgressProjection
    ) -> Counter[str]:
        """Project every record of the namespace into ``target``, in SCAN batches."""
        outcomes: Counter[str] = Counter()
        slots = asyncio.Semaphore(_CONCURRENCY)

        async def project(ids: tuple[str, str]) -> None:
            async with slots:
                outcome = await target.project_record(*ids)
            outcomes[outcome.value] += 1

        batch: list[tuple[str, str]] = []
        async with redis_errors():
            async for key in self.store.client.scan_iter(
                match=self.store.keys.scan_pattern("inv"), count=SCAN_BATCH
            ):
                ids = self.store.keys.record_ids(cast(bytes, key))
                if ids is not None:
                    batch.append(ids)
                if len(batch) >= SCAN_BATCH:
                    await asyncio.gather(*(project(ids) for ids in batch))
                    batch.clear()
                    self._progress(outcomes)
        await asyncio.gather(*(project(ids) for ids in batch))
        self._progress(outcomes)
        return outcomes

    def _progress(self, outcomes: Counter[str]) -> None:
        if self.on_record is not None:
            self.on_record(sum(outcomes.values()))

    async def _await_departure(self, group: str, switched_at: float) -> bool:
        """Wait until ``group`` has no consumer left; False when ``grace_s`` passes first.

        Following workers leave a retired generation's group by deleting their consumer
        once their batches are settled. A consumer that stays is a worker pinned to the
        old generation, or one that died: either way the group is kept, not pulled away.
        """
        deadline = switched_at + self.grace_s
        while True:
            consumers = 0
            for shard in range(self.store.keys.shards):
                feed = self.store.keys.feed(shard)
                if await self._has_group(feed, group):
                    async with redis_errors():
                        consumers += len(await self.store.client.xinfo_consumers(feed, group))
            if consumers == 0:
                return True
            if time.monotonic() >= deadline:
                log.warning("old_generation_in_use", group=group, consumers=consumers)
                return False
            await asyncio.sleep(_POLL_S)

    async def _remove_generation(self, generation: int) -> int:
        """Delete one generation's groups, positions and outputs; return keys deleted."""
        keys, client = self.store.keys, self.store.client
        group = group_name(self.projection, generation)
        async with redis_errors():
            for shard in range(keys.shards):
                feed = keys.feed(shard)
                if await self._has_group(feed, group):
                    await client.xgroup_destroy(feed, group)
                await client.delete(keys.position(shard, group))
        kind = generation_kind(OUTPUT_KINDS[self.projection], generation)
        deleted = 0
        async with redis_errors():
            found = client.scan_iter(match=keys.scan_pattern(kind), count=SCAN_BATCH)
            batch: list[bytes] = []
            async for key in found:
                batch.append(cast(bytes, key))
                if len(batch) >= SCAN_BATCH:
                    deleted += await _unlink(client, batch)
                    batch.clear()
            deleted += await _unlink(client, batch)
        log.info(
            "generation_removed", projection=self.projection, generation=generation, keys=deleted
        )
        return deleted


async def _unlink(client: Redis, keys: list[bytes]) -> int:
    """UNLINK keys one command each (they may live in different cluster slots)."""
    if not keys:
        return 0
    async with client.pipeline(transaction=False) as pipe:
        for key in keys:
            # execute_command: a cluster pipeline's own unlink() is a coroutine that splits
            # keys by slot instead of queueing the command.
            pipe.execute_command("UNLINK", key)
        return sum(int(n) for n in await pipe.execute())


def _iso(ms: str) -> str:
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(ms) / 1000))
    except ValueError:
        return "an unknown time"
