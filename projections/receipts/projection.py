"""The receipt projection: materializes each invocation's receipt from its record.

The receipt of an invocation lives at ``keys.receipt(run_id, invocation_id, generation)``
as a hash (``version``, ``receipt`` JSON, ``updated_at_ms``). It expires with its record: the
script copies the record's absolute expiry once, when it creates the receipt. It is
versioned by the record's version, so a late or repeated feed entry never regresses it.

A delivered batch (the entries of every shard read together) is settled in two round
trips: one script reads the records and streams of its invocations, and one script
stores the newest receipt of each and settles every entry (the older entries of an
invocation as stale). If that fails, the entries are settled one by one, so a bad entry
fails alone.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Final, Unpack, cast

from eventstore.errors import redis_errors
from eventstore.store import Store
from eventstore.wire import faults
from eventstore.writer import now_ms
from machine.ids import invocation_id
from projections.base import (
    BaseProjection,
    batch_outcomes,
    latest_per_invocation,
    settled_without_output,
)
from projections.feed import FeedEntry, Outcome
from projections.receipts.builder import encode_receipt
from projections.receipts.snapshot import (
    RECEIPT_FIELDS,
    ReceiptSnapshot,
    receipt_of,
    receipt_snapshot_of,
    with_shared_result,
)
from projections.scripts import (
    ReadSnapshotsScript,
    ReceiptArgs,
    ReceiptKeys,
    ReceiptPut,
    ReceiptsPutScript,
    SnapshotKeys,
    Unproduced,
)
from projections.worker.runtime import Worker, WorkerOptions

RECEIPT_PROJECTION: Final = "receipts"
_VERSION_MEMORY: Final = 65536


class ReceiptProjection(BaseProjection):
    """Builds receipts with :func:`build_receipt` and stores them version-guarded."""

    family = RECEIPT_PROJECTION

    def __init__(self, store: Store, *, generation: int = 1) -> None:
        super().__init__(store, generation=generation)
        # Version each invocation's receipt was last stored at by this process. A receipt
        # is rebuilt from the record as it is now, so the entries of earlier versions that
        # follow it carry nothing new: they are settled as stale without a rebuild.
        self._stored: OrderedDict[tuple[str, str], int] = OrderedDict()

    def _remember(self, invocation: tuple[str, str], version: int) -> None:
        self._stored.pop(invocation, None)
        self._stored[invocation] = version
        if len(self._stored) > _VERSION_MEMORY:
            self._stored.popitem(last=False)

    def receipt_key(self, run_id: str, tool_call_id: str) -> str:
        """Where this generation keeps the receipt of one invocation."""
        return self.store.keys.receipt(run_id, invocation_id(run_id, tool_call_id), self.generation)

    async def apply_batch(self, entries: Sequence[FeedEntry]) -> list[Outcome]:
        """Settle a batch of entries in one read and one script call.

        Per invocation only the entry of the highest version is built, from the record
        as it is now; the others carry nothing newer and are settled as stale with it.
        Returns the outcome of each entry, in order.
        """
        latest = latest_per_invocation(entries)
        build = [
            entry
            for invocation, entry in latest.items()
            if entry.version > self._stored.get(invocation, 0) or not entry.entry_id
        ]
        snapshots = await self._read(build)
        numbers, shards = self.shard_keys(entries)
        receipts: list[ReceiptPut] = []
        built: list[FeedEntry] = []
        expired: set[tuple[str, str]] = set()
        for entry, snapshot in zip(build, snapshots, strict=True):
            if not snapshot.fields:
                expired.add((entry.run_id, entry.tool_call_id))
                continue
            receipts.append(
                ReceiptPut(
                    ReceiptKeys(
                        receipt=self.receipt_key(entry.run_id, entry.tool_call_id),
                        record=self.store.keys.record(entry.run_id, entry.tool_call_id),
                    ),
                    ReceiptArgs(
                        shard=numbers[entry.shard],
                        entry_id=entry.entry_id,
                        version=snapshot.version,
                        receipt=encode_receipt(receipt_of(self.store, snapshot)),
                    ),
                )
            )
            built.append(entry)
        rest = settled_without_output(entries, {(e.shard, e.entry_id) for e in built}, expired)
        if faults.ARMED:  # the crash-point tests kill a worker between its read and settle
            faults.reached("before:receipts_put")
        reply = await self.scripts.receipts_put(
            ReceiptsPutScript.batch(
                group=self.name,
                now_ms=now_ms(),
                shards=shards,
                puts=receipts,
                unproduced=[Unproduced(numbers[e.shard], e.entry_id, c.value) for e, c in rest],
            )
        )
        produced: dict[tuple[int, str], Outcome] = {}
        for entry, (outcome, version) in zip(built, reply.written, strict=True):
            if outcome in (Outcome.APPLIED.value, Outcome.STALE.value):
                self._remember((entry.run_id, entry.tool_call_id), version)
            produced[(entry.shard, entry.entry_id)] = Outcome(outcome)
        return batch_outcomes(entries, produced, rest, reply.settled)

    async def _read(self, entries: Sequence[FeedEntry]) -> list[ReceiptSnapshot]:
        """The snapshots of the entries' invocations, read by one script call."""
        if not entries:
            return []
        keys = self.store.keys
        replies = await self.scripts.read_snapshots(
            ReadSnapshotsScript.reading(
                invocations=[
                    SnapshotKeys(
                        keys.record(e.run_id, e.tool_call_id), keys.stream(e.run_id, e.tool_call_id)
                    )
                    for e in entries
                ],
                fields=RECEIPT_FIELDS,
            )
        )
        observed = now_ms()
        return [
            await with_shared_result(
                self.store,
                entry.run_id,
                entry.tool_call_id,
                receipt_snapshot_of(values, stream, observed),
            )
            for entry, (values, stream) in zip(entries, replies, strict=True)
        ]

    async def applied_version(self, run_id: str, tool_call_id: str) -> int:
        """Return the version of the materialized receipt (0 when there is none)."""
        async with redis_errors():
            value = cast(
                bytes | None,
                await self.store.client.hget(self.receipt_key(run_id, tool_call_id), "version"),
            )
        return int(value) if value is not None else 0


class ReceiptWorker(Worker):
    """A :class:`Worker` running the :class:`ReceiptProjection` (group ``receipts``).

    ``await worker.wait_for(head)`` returns once the receipt reflects ``head``.
    """

    def __init__(self, store: Store, **options: Unpack[WorkerOptions]) -> None:
        super().__init__(store, ReceiptProjection(store), **options)
