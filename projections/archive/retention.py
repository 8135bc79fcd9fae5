"""Retention: the archive keeps a run for a configured period after its last activity.

:func:`prune` deletes, in bounded batches (one transaction of at most ``batch`` runs
each, at most ``max_batches`` per call), every run whose last archived activity is older
than the horizon: its events, invocations, refusals, run events and row. The default
period, :data:`DEFAULT_RETENTION_DAYS`, is documented in docs/archive.md; a worker
prunes once an hour (``canon archive --retention-days``), or ``canon archive prune``
does it by hand.
"""

from __future__ import annotations

from typing import Final

from projections.archive.store import Archive, now_ms

#: How long the archive keeps a run after its last activity, by default.
DEFAULT_RETENTION_DAYS: Final = 400
#: Milliseconds in a day.
DAY_MS: Final = 86_400_000


async def prune(
    archive: Archive, *, older_than_ms: int, batch: int = 500, max_batches: int = 100
) -> int:
    """Delete runs whose last activity is older than ``older_than_ms`` ago; return how many.

    Each batch is one transaction, so a reader never sees half a run, and a long prune
    never holds a lock for long. Stops after ``max_batches``; call again for more.

    Raises:
        ArchiveUnavailable: the archive failed.

    """
    horizon = now_ms() - older_than_ms
    pruned = 0
    namespace = archive.namespace
    for _ in range(max_batches):
        async with archive.database.transaction() as tx:
            runs = [
                str(row[0])
                for row in await tx.fetch(
                    "SELECT run_id FROM runs WHERE namespace = ? AND updated_at_ms < ? "
                    "ORDER BY updated_at_ms LIMIT ?",
                    (namespace, horizon, batch),
                )
            ]
            if not runs:
                return pruned
            marks = ", ".join("?" for _ in runs)
            await tx.execute(
                f"DELETE FROM events WHERE namespace = ? AND invocation_id IN (SELECT "
                f"invocation_id FROM invocations WHERE namespace = ? AND run_id IN ({marks}))",
                (namespace, namespace, *runs),
            )
            for table in ("invocations", "refusals", "run_events", "runs"):
                await tx.execute(
                    f"DELETE FROM {table} WHERE namespace = ? AND run_id IN ({marks})",
                    (namespace, *runs),
                )
        pruned += len(runs)
        if len(runs) < batch:
            return pruned
    return pruned
