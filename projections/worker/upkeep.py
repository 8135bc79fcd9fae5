"""What a following worker does beside reading: its periodic duties.

:class:`~projections.worker.runtime.Worker` runs these beside its reading lanes. Each runs until
``leave`` is set (the worker stops, or leaves its group for another generation) and
survives a Redis failure with a warning, so a duty never takes the worker's reading down
with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from eventstore.errors import StoreUnavailable
from eventstore.logs import get_logger
from eventstore.store import Store
from projections.generations import Generational, current_generation
from projections.metrics import Metrics
from projections.worker.lag import ShardLag, trim_feeds

log = get_logger("canon.projections")


async def pause_unless(leave: asyncio.Event, seconds: float) -> None:
    """Wait ``seconds``, or less if ``leave`` is set meanwhile."""
    try:
        await asyncio.wait_for(leave.wait(), seconds)
    except TimeoutError:
        return


async def watch_generation(
    store: Store,
    projection: Generational,
    consumer: str,
    leave: asyncio.Event,
    interval_s: float = 1.0,
) -> None:
    """Set ``leave`` once readers have been switched to another generation."""
    while not leave.is_set():
        await pause_unless(leave, interval_s)
        if leave.is_set():
            return
        try:
            wanted = await current_generation(store, projection.family)
        except StoreUnavailable:
            continue
        if wanted != projection.generation:
            log.info(
                "generation_switched",
                projection=projection.family,
                generation=wanted,
                consumer=consumer,
            )
            leave.set()


async def trim_periodically(
    store: Store, name: str, leave: asyncio.Event, interval_s: float = 60.0
) -> None:
    """Trim the feeds below every group's watermark while following.

    The write scripts only trim entries older than the record TTL plus a grace period;
    this keeps a busy feed short without ever removing an entry some group still needs.
    """
    while not leave.is_set():
        await pause_unless(leave, interval_s)
        if leave.is_set():
            return
        try:
            removed = await trim_feeds(store)
        except StoreUnavailable:
            log.warning("feed_trim_failed", projection=name)
            continue
        if removed:
            log.info("feeds_trimmed", projection=name, removed=removed)


async def report_lag(
    lag: Callable[[], Awaitable[list[ShardLag]]],
    metrics: Metrics,
    name: str,
    leave: asyncio.Event,
    interval_s: float = 5.0,
) -> None:
    """Report the projection's lag, pending count and oldest unacknowledged age per shard."""
    while not leave.is_set():
        try:
            for figures in await lag():
                labels = (name, str(figures.shard))
                metrics.lag.labels(*labels).set(figures.lag)
                metrics.pending.labels(*labels).set(figures.pending)
                metrics.oldest_unacked.labels(*labels).set(figures.oldest_unacked_ms / 1000)
        except StoreUnavailable:
            log.warning("lag_read_failed", projection=name)
        await pause_unless(leave, interval_s)
