"""The receipt projection: materializes each invocation's receipt from its record.

The receipt of an invocation lives at ``keys.receipt(run_id, invocation_id, generation)``
as a hash (``version``, ``receipt`` JSON, ``updated_at_ms``). It expires with its record: the
script copies the record's absolute expiry once, when it creates the receipt. It is
versioned by the record's version, so a late or repeated feed entry never regresses it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final, Unpack, cast

from eventstore.errors import redis_errors
from eventstore.keys import shard_of
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.ids import invocation_id
from projections.base import BaseProjection
from projections.feed import FeedEntry, Outcome
from projections.receipts import encode_receipt
from projections.runtime import Worker, WorkerOptions
from projections.snapshot import read_snapshot, receipt_of

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

    async def apply(self, entry: FeedEntry) -> Outcome:
        """Rebuild the entry's receipt from the record as it is now; store it if newer."""
        invocation = (entry.run_id, entry.tool_call_id)
        if entry.version <= self._stored.get(invocation, 0):
            return await self.settle(entry.shard, entry.entry_id, Outcome.STALE.value)
        outcome = await self._project(entry.run_id, entry.tool_call_id, entry.shard, entry.entry_id)
        if outcome is None:
            return await self.settle(entry.shard, entry.entry_id, "expired")
        return outcome

    async def project_record(self, run_id: str, tool_call_id: str) -> Outcome:
        """Store the receipt of the record as it is now, settling no feed entry (rebuilds)."""
        shard = shard_of(run_id, self.store.keys.shards)
        return await self._project(run_id, tool_call_id, shard, "") or Outcome.EXPIRED

    async def _project(
        self, run_id: str, tool_call_id: str, shard: int, entry_id: str
    ) -> Outcome | None:
        store, keys = self.store, self.store.keys
        snapshot = await read_snapshot(store, run_id, tool_call_id)
        if not snapshot.fields:
            return None
        outcome, stored_version = await self.scripts.receipt_put(
            [
                self.receipt_key(run_id, tool_call_id),
                keys.record(run_id, tool_call_id),
                self.position_key(shard),
                keys.feed(shard),
            ],
            group=self.name,
            entry_id=entry_id,
            version=snapshot.version,
            body=encode_receipt(receipt_of(store, snapshot)),
            now=now_ms(),
        )
        if outcome in (Outcome.APPLIED.value, Outcome.STALE.value) and stored_version.isdigit():
            self._remember((run_id, tool_call_id), int(stored_version))
        return Outcome(outcome)

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
