"""The progress projection: a bounded per-run view for dashboards.

The view of a run lives at ``keys.run_view(run_id, generation)`` and expires with the run. It counts
the run's invocations by public status and by evidence status, keeps the time of the last
change, and holds the run's observed facts (:func:`projections.facts.observed_facts`)
in execution order, extended when a call finishes. It holds ids, statuses, scopes and
digests; never a request, a raw response or an agent result.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Final, Unpack, cast

import msgspec

from eventstore.errors import redis_errors
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.codes import Status
from projections.base import (
    BaseProjection,
    batch_outcomes,
    latest_per_invocation,
    settled_without_output,
)
from projections.facts import FactScan, extend_facts
from projections.feed import FeedEntry, Outcome
from projections.generations import current_generation
from projections.scripts import Unproduced, ViewArgs, ViewKeys, ViewPut, ViewsPutScript
from projections.worker.runtime import Worker, WorkerOptions

PROGRESS_PROJECTION: Final = "progress"

_RECORD_FIELDS: Final = ("status", "evidence_status", "version", "updated_at_ms")
_TERMINAL: Final = frozenset({Status.READY.value, Status.ERROR.value})
_SCAN_MEMORY: Final = 1024
_encoder: Final = msgspec.json.Encoder()


class ProgressView(msgspec.Struct, frozen=True, kw_only=True):
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

    family = PROGRESS_PROJECTION

    def __init__(self, store: Store, *, generation: int = 1) -> None:
        super().__init__(store, generation=generation)
        # Per-run fact scans, extended as calls finish instead of recomputed from the
        # start each time (which made a long run quadratic); bounded, least recent out.
        self._scans: OrderedDict[str, FactScan] = OrderedDict()

    async def _facts(self, run_id: str) -> FactScan:
        scan = await extend_facts(self.store, run_id, self._scans.pop(run_id, None))
        self._scans[run_id] = scan
        if len(self._scans) > _SCAN_MEMORY:
            self._scans.popitem(last=False)
        return scan

    async def apply_batch(self, entries: Sequence[FeedEntry]) -> list[Outcome]:
        """Fold a batch of entries into the views in one read and one script.

        Per invocation, the record as it is now is counted with the entry of the highest
        version; the others carry nothing newer and are settled as stale with it. A run
        with a finished call in the batch has its facts extended once.
        """
        store, keys = self.store, self.store.keys
        latest = latest_per_invocation(entries)
        async with redis_errors(), store.client.pipeline(transaction=False) as pipe:
            for run_id, call in latest:
                pipe.hmget(keys.record(run_id, call), list(_RECORD_FIELDS))
            records = cast(list[list[bytes | None]], await pipe.execute())
        items: list[tuple[FeedEntry, list[str]]] = []
        expired: set[tuple[str, str]] = set()
        finished_runs: dict[str, int] = {}  # run -> index of its last finished item
        for (invocation, entry), values in zip(latest.items(), records, strict=True):
            if any(value is None for value in values):
                expired.add(invocation)
                continue
            fields = [cast(bytes, value).decode() for value in values]
            if fields[0] in _TERMINAL:
                finished_runs[entry.run_id] = len(items)
            items.append((entry, fields))
        facts: dict[int, tuple[bytes, int]] = {}
        for run_id, index in finished_runs.items():
            scan = await self._facts(run_id)
            facts[index] = (_encoder.encode(scan.facts), scan.position)
        numbers, shards = self.shard_keys(entries)
        views: list[ViewPut] = []
        for index, (entry, (status, evidence, version, updated)) in enumerate(items):
            run_facts, covered = facts.get(index, (b"", 0))
            views.append(
                ViewPut(
                    ViewKeys(
                        view=keys.run_view(entry.run_id, self.generation),
                        run=keys.run(entry.run_id),
                    ),
                    ViewArgs(
                        shard=numbers[entry.shard],
                        entry_id=entry.entry_id,
                        tool_call_id=entry.tool_call_id,
                        version=int(version),
                        status=status,
                        evidence_status=evidence,
                        updated_at_ms=int(updated),
                        facts=run_facts,
                        covered=covered,
                    ),
                )
            )
        rest = settled_without_output(entries, {(e.shard, e.entry_id) for e, _ in items}, expired)
        reply = await self.scripts.views_put(
            ViewsPutScript.batch(
                group=self.name,
                now_ms=now_ms(),
                shards=shards,
                puts=views,
                unproduced=[Unproduced(numbers[e.shard], e.entry_id, c.value) for e, c in rest],
            )
        )
        produced = {
            (entry.shard, entry.entry_id): Outcome(outcome)
            for (entry, _), (outcome, _) in zip(items, reply.written, strict=True)
        }
        return batch_outcomes(entries, produced, rest, reply.settled)

    async def applied_version(self, run_id: str, tool_call_id: str) -> int:
        """Return the invocation version the run's view reflects (0 when none)."""
        key = self.store.keys.run_view(run_id, self.generation)
        async with redis_errors():
            value = cast(bytes | None, await self.store.client.hget(key, f"v:{tool_call_id}"))
        return int(value) if value is not None else 0


async def read_view(store: Store, run_id: str) -> ProgressView | None:
    """Return a run's progress view, or None when it does not exist (read-only).

    The view is read from the generation readers currently use.
    """
    generation = await current_generation(store, PROGRESS_PROJECTION)
    key = store.keys.run_view(run_id, generation)
    async with redis_errors():
        raw = cast(dict[bytes, bytes], await store.client.hgetall(key))
    if not raw:
        return None
    fields = {k.decode(): v for k, v in raw.items()}

    def counts(prefix: str) -> dict[str, int]:
        return {
            name.removeprefix(prefix): int(value)
            for name, value in fields.items()
            if name.startswith(prefix) and int(value) > 0
        }

    return ProgressView(
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
