"""The progress projection: a bounded per-run view for dashboards.

The view of a run lives at ``keys.run_view(run_id)`` and expires with the run. It counts
the run's invocations by public status and by evidence status, keeps the time of the last
change, and holds the run's observed facts (:func:`projections.facts.observed_facts`)
in execution order, extended when a call finishes. It holds ids, statuses, scopes and
digests; never a request, a raw response or an agent result.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Final, Unpack, cast

import msgspec

from eventstore.errors import redis_errors
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.codes import Status
from projections.base import BaseProjection
from projections.facts import FactScan, extend_facts
from projections.feed import FeedEntry, Outcome
from projections.runtime import Worker, WorkerOptions

PROGRESS_PROJECTION: Final = "progress"

_RECORD_FIELDS: Final = ("status", "evidence_status", "version", "updated_at_ms")
_TERMINAL: Final = frozenset({Status.READY.value, Status.ERROR.value})
_SCAN_MEMORY: Final = 1024
_encoder: Final = msgspec.json.Encoder()


class RunView(msgspec.Struct, frozen=True, kw_only=True):
    """A run's progress view as read back.

    Attributes:
        run_id: the run.
        invocations: invocations seen.
        by_status: invocation count per public status.
        by_evidence: invocation count per evidence status.
        updated_at_ms: time of the latest change the view reflects.
        facts: the run's observed facts in execution order (bounded count and bytes).

    """

    run_id: str
    invocations: int
    by_status: dict[str, int]
    by_evidence: dict[str, int]
    updated_at_ms: int
    facts: list[dict[str, Any]]


class ProgressProjection(BaseProjection):
    """Folds each committed event into its run's view, version-guarded per invocation."""

    def __init__(self, store: Store, name: str = PROGRESS_PROJECTION) -> None:
        super().__init__(store, name)
        # Per-run fact scans, extended as calls finish instead of recomputed from the
        # start each time (which made a long run quadratic); bounded, least recent out.
        self._scans: OrderedDict[str, FactScan] = OrderedDict()

    async def _facts(self, run_id: str) -> FactScan:
        scan = await extend_facts(self.store, run_id, self._scans.pop(run_id, None))
        self._scans[run_id] = scan
        if len(self._scans) > _SCAN_MEMORY:
            self._scans.popitem(last=False)
        return scan

    async def apply(self, entry: FeedEntry) -> Outcome:
        """Count the invocation's current status; recompute the facts when it finished."""
        store, keys = self.store, self.store.keys
        run_id, call = entry.run_id, entry.tool_call_id
        async with redis_errors():
            values = cast(
                list[bytes | None],
                await store.client.hmget(keys.record(run_id, call), list(_RECORD_FIELDS)),
            )
        if any(value is None for value in values):
            return await self.settle(entry.shard, entry.entry_id, "expired")
        status, evidence, version, updated = (cast(bytes, v).decode() for v in values)
        facts, covered = b"", 0
        if status in _TERMINAL:
            scan = await self._facts(run_id)
            facts, covered = _encoder.encode(scan.facts), scan.position
        outcome, _ = await self.scripts.view_put(
            [
                keys.run_view(run_id),
                keys.run(run_id),
                self.position_key(entry.shard),
                keys.feed(entry.shard),
            ],
            [
                self.name,
                entry.entry_id,
                call,
                int(version),
                status,
                evidence,
                int(updated),
                now_ms(),
                facts,
                covered,
            ],
        )
        return Outcome(outcome)

    async def applied_version(self, run_id: str, tool_call_id: str) -> int:
        """Return the invocation version the run's view reflects (0 when none)."""
        async with redis_errors():
            value = cast(
                bytes | None,
                await self.store.client.hget(self.store.keys.run_view(run_id), f"v:{tool_call_id}"),
            )
        return int(value) if value is not None else 0


async def read_view(store: Store, run_id: str) -> RunView | None:
    """Return a run's progress view, or None when it does not exist (read-only)."""
    async with redis_errors():
        raw = cast(dict[bytes, bytes], await store.client.hgetall(store.keys.run_view(run_id)))
    if not raw:
        return None
    fields = {k.decode(): v for k, v in raw.items()}

    def counts(prefix: str) -> dict[str, int]:
        return {
            name.removeprefix(prefix): int(value)
            for name, value in fields.items()
            if name.startswith(prefix) and int(value) > 0
        }

    return RunView(
        run_id=run_id,
        invocations=int(fields.get("invocations", b"0")),
        by_status=counts("status:"),
        by_evidence=counts("evidence:"),
        updated_at_ms=int(fields.get("updated_at_ms", b"0")),
        facts=msgspec.json.decode(fields.get("facts", b"[]")),
    )


class ProgressWorker(Worker):
    """A :class:`Worker` running the :class:`ProgressProjection` (group ``progress``)."""

    def __init__(self, store: Store, **options: Unpack[WorkerOptions]) -> None:
        super().__init__(store, ProgressProjection(store), **options)
