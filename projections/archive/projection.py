"""The archive projection: every finished invocation, its events and its run, into the archive.

A consumer group ``archive`` over the shard feeds, run by the same worker runtime as the
receipts and progress (reclaim, dead letters, drain, lag, burst mode). A delivered batch
is settled in three steps: one Redis read (each invocation's record and stream, the
touched runs' registry entries, and their new refusals), one database transaction (the
output and the worker's position on each shard, together), and one XACK per feed. A
crash between the commit and the acknowledgement delivers the batch again; the archive's
writes are idempotent (:mod:`.store`), so that second delivery changes nothing.

Only invocations in a terminal state (READY, ERROR) are archived, each time an event is
committed to one (a later event, such as a reconciliation, archives it again at its new
version); entries of calls still in flight are settled without output. Run events and
refusals are archived with the run whenever one of its calls is, and by a sweep of the
run indexes (:meth:`ArchiveWorker.sweep_runs`) for runs whose calls did not change.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Final, Unpack, cast

from eventstore.errors import redis_errors
from eventstore.reader import stored_events
from eventstore.runs import refusal_of
from eventstore.sealing import DATA_KEY_FIELD
from eventstore.store import Store
from machine.ids import invocation_id
from projections.archive.database import ArchiveDatabase
from projections.archive.store import (
    Archive,
    ArchiveBatch,
    ArchivedInvocation,
    RunSnapshot,
)
from projections.base import BaseProjection, latest_per_invocation
from projections.feed import FeedEntry, Outcome
from projections.worker.lag import parse_entry_id
from projections.worker.runtime import Worker, WorkerOptions

#: The projection's name and consumer group.
ARCHIVE_PROJECTION: Final = "archive"
_TERMINAL: Final = frozenset({b"READY", b"ERROR"})
#: Runs whose refusal log position this process remembers (least recent out).
_RUN_MEMORY: Final = 65536


class ArchiveProjection(BaseProjection):
    """Writes finished invocations, their events and their runs into an archive."""

    family = ARCHIVE_PROJECTION

    def __init__(
        self, store: Store, archive: ArchiveDatabase | None = None, *, generation: int = 1
    ) -> None:
        super().__init__(store, generation=generation)
        if archive is None:
            raise ValueError("the archive projection needs an archive database")
        self.database = archive
        self.archive = Archive(archive, store.keys.namespace)
        # Per run: its refusal counts' total and the last refusal log entry archived, so
        # the log is read only when the run refused something new.
        self._refusals: OrderedDict[str, tuple[int, str]] = OrderedDict()

    def at_generation(self, generation: int) -> ArchiveProjection:
        """The archive has one generation; a copy writing it."""
        return type(self)(self.store, self.database, generation=generation)

    async def apply_batch(self, entries: Sequence[FeedEntry]) -> list[Outcome]:
        """Archive a batch: one Redis read, one transaction, one acknowledgement per feed."""
        latest = latest_per_invocation(entries)
        invocations, gone = await self._read_invocations(list(latest))
        runs = await self.read_runs(sorted({run_id for run_id, _ in latest}))
        batch = ArchiveBatch(
            runs=runs,
            invocations=[inv for inv in invocations if inv.fields.get(b"status") in _TERMINAL],
        )
        for entry in entries:
            if entry.entry_id:
                position = parse_entry_id(entry.entry_id)
                batch.positions[entry.shard] = max(
                    batch.positions.get(entry.shard, position), position
                )
        before = await self.archive.versions([inv.invocation_id for inv in batch.invocations])
        written = await self.archive.write(batch)
        self._remember_refusals(runs)
        acked = await self._acknowledge(entries)
        outcomes = []
        for entry in entries:
            invocation = (entry.run_id, entry.tool_call_id)
            inv_id = invocation_id(*invocation)
            if entry.entry_id and not acked.get((entry.shard, entry.entry_id), False):
                outcomes.append(Outcome.DUPLICATE)
            elif invocation in gone:
                outcomes.append(Outcome.EXPIRED)
            elif latest[invocation] is entry and before.get(inv_id, 0) < written.get(inv_id, 0):
                outcomes.append(Outcome.APPLIED)
            else:
                outcomes.append(Outcome.STALE)
        return outcomes

    async def _read_invocations(
        self, wanted: Sequence[tuple[str, str]]
    ) -> tuple[list[ArchivedInvocation], set[tuple[str, str]]]:
        """Read each invocation's record and stream (one MULTI on one server)."""
        if not wanted:
            return [], set()
        keys = self.store.keys
        atomic = self.store.cluster is None
        async with redis_errors(), self.store.client.pipeline(transaction=atomic) as pipe:
            for run_id, call in wanted:
                pipe.hgetall(keys.record(run_id, call))
                pipe.xrange(keys.stream(run_id, call))
            replies = await pipe.execute()
        found: list[ArchivedInvocation] = []
        gone: set[tuple[str, str]] = set()
        for index, (run_id, call) in enumerate(wanted):
            fields = cast(dict[bytes, bytes], replies[2 * index])
            if not fields:
                gone.add((run_id, call))
                continue
            version = int(fields.get(b"version", b"0") or 0)
            entries = cast(list[tuple[bytes, dict[bytes, bytes]]], replies[2 * index + 1])
            # A later event may have landed between the two reads on a cluster: the
            # record's version says which events it was folded from.
            found.append(
                ArchivedInvocation(
                    run_id=run_id,
                    tool_call_id=call,
                    fields=fields,
                    events=stored_events(entries[:version]),
                )
            )
        return found, gone

    async def read_runs(self, run_ids: Sequence[str]) -> list[RunSnapshot]:
        """Read the runs' registry entries, and their refusals not archived yet.

        A run's refusal log is read only when its refusal counts changed since this
        process last archived it, and only after the last entry archived then.
        """
        if not run_ids:
            return []
        keys = self.store.keys
        async with redis_errors(), self.store.client.pipeline(transaction=False) as pipe:
            for run_id in run_ids:
                pipe.hgetall(keys.run(run_id))
            replies = cast(list[dict[bytes, bytes]], await pipe.execute())
        # The wrapped data key is bytes: kept apart, as Redis holds it, never decoded.
        data_key = DATA_KEY_FIELD.encode()
        runs = [
            {k.decode(): v.decode("utf-8", "replace") for k, v in raw.items() if k != data_key}
            for raw in replies
        ]
        reads: dict[str, str] = {}
        for run_id, fields in zip(run_ids, runs, strict=True):
            known = self._refusals.get(run_id)
            if _refused(fields) and (known is None or known[0] != _refused(fields)):
                reads[run_id] = known[1] if known else "-"
        logs: dict[str, list[tuple[bytes, dict[bytes, bytes]]]] = {}
        if reads:
            async with redis_errors(), self.store.client.pipeline(transaction=False) as pipe:
                for run_id, after in reads.items():
                    pipe.xrange(
                        keys.refusals(run_id), min=after if after == "-" else f"({after}", max="+"
                    )
                logs = dict(zip(reads, await pipe.execute(), strict=True))
        return [
            RunSnapshot(
                run_id=run_id,
                fields=fields,
                refusals=[refusal_of(entry_id, entry) for entry_id, entry in logs.get(run_id, [])],
                data_key=raw.get(data_key),
            )
            for run_id, fields, raw in zip(run_ids, runs, replies, strict=True)
        ]

    def _remember_refusals(self, runs: Sequence[RunSnapshot]) -> None:
        """Remember, per run, its refusal total and the newest refusal archived."""
        for run in runs:
            refused = _refused(run.fields)
            if not refused:
                continue
            known = self._refusals.pop(run.run_id, None)
            last = run.refusals[-1].entry_id if run.refusals else (known[1] if known else "-")
            self._refusals[run.run_id] = (refused, last)
            if len(self._refusals) > _RUN_MEMORY:
                self._refusals.popitem(last=False)

    async def _acknowledge(self, entries: Sequence[FeedEntry]) -> dict[tuple[int, str], bool]:
        """XACK every entry (one pipeline); whether each was still pending here."""
        settled = [entry for entry in entries if entry.entry_id]
        if not settled:
            return {}
        keys = self.store.keys
        async with redis_errors(), self.store.client.pipeline(transaction=False) as pipe:
            for entry in settled:
                pipe.xack(keys.feed(entry.shard), self.name, entry.entry_id)
            replies = await pipe.execute()
        return {
            (entry.shard, entry.entry_id): bool(int(reply))
            for entry, reply in zip(settled, replies, strict=True)
        }

    async def applied_version(self, run_id: str, tool_call_id: str) -> int:
        """The version of the invocation the archive holds (0 for none)."""
        return await self.archive.applied_version(invocation_id(run_id, tool_call_id))


class ArchiveWorker(Worker):
    """A :class:`Worker` running the :class:`ArchiveProjection` (group ``archive``).

    Besides the feed, it sweeps the run indexes every ``run_sweep_s`` seconds (and once
    at the end of a burst), archiving each run whose registry entry changed since it was
    last seen: a close, a pause, a refusal of a run none of whose calls changed.
    """

    def __init__(
        self,
        store: Store,
        archive: ArchiveDatabase,
        *,
        run_sweep_s: float = 10.0,
        **options: Unpack[WorkerOptions],
    ) -> None:
        super().__init__(store, ArchiveProjection(store, archive), **options)
        self.run_sweep_s = run_sweep_s
        # What each run's registry entry looked like when last archived by this process.
        self._seen: OrderedDict[str, int] = OrderedDict()

    @property
    def archive(self) -> Archive:
        """The archive this worker writes."""
        projection = cast(ArchiveProjection, self.projection)
        return projection.archive

    async def run(self, *, burst: bool = False) -> None:
        """Consume the feeds (see :meth:`Worker.run`), sweeping the run indexes meanwhile."""
        if burst:
            await super().run(burst=True)
            await self.sweep_runs()
            return
        sweeper = asyncio.create_task(self._sweep_periodically())
        try:
            await super().run(burst=False)
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper

    async def _sweep_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.run_sweep_s)
            try:
                await self.sweep_runs()
            except Exception as exc:  # an outage: the next sweep tries again
                from eventstore.logs import get_logger

                get_logger("canon.projections").warning(
                    "run_sweep_failed", projection=self.name, error=type(exc).__name__
                )

    async def sweep_runs(self, *, batch: int = 500) -> int:
        """Archive every indexed run whose registry entry changed; return how many were.

        Reads each owned shard's run index and the runs' registry entries, in pipelines of
        ``batch``; a run whose entry is as this process last archived it is skipped.
        """
        store = self.store
        projection = cast(ArchiveProjection, self.projection)
        keys = store.keys
        run_ids: list[str] = []
        for shard in self.shards:
            async with redis_errors():
                members = cast(list[bytes], await store.client.zrange(keys.run_index(shard), 0, -1))
            run_ids += [member.decode() for member in members]
        archived = 0
        for start in range(0, len(run_ids), batch):
            chunk = run_ids[start : start + batch]
            snapshots = await projection.read_runs(chunk)
            changed = [
                snapshot
                for snapshot in snapshots
                if snapshot.fields
                and (snapshot.refusals or self._seen.get(snapshot.run_id) != _fingerprint(snapshot))
            ]
            if not changed:
                continue
            await projection.archive.write(ArchiveBatch(runs=changed))
            projection._remember_refusals(changed)
            for snapshot in changed:
                self._seen.pop(snapshot.run_id, None)
                self._seen[snapshot.run_id] = _fingerprint(snapshot)
                if len(self._seen) > _RUN_MEMORY:
                    self._seen.popitem(last=False)
            archived += len(changed)
        return archived


def _refused(fields: dict[str, str]) -> int:
    """How many refusals a run hash counts in all."""
    return sum(int(value) for name, value in fields.items() if name.startswith("refused:"))


def _fingerprint(snapshot: RunSnapshot) -> int:
    # The wrapped data key counts: a rewrap is archived even when nothing else changed.
    return hash((tuple(sorted(snapshot.fields.items())), snapshot.data_key))
