"""Verify a whole namespace: SCAN-based, batched, bounded in memory, resumable by cursor.

Each SCAN batch of record and stream keys is read with one pipeline (HGETALL, XRANGE and
two PTTLs per invocation) and checked with :func:`.checks.problems_of`. An invocation that
shows a problem is read again atomically (MULTI/EXEC on its shard) before it is reported,
so a write landing between two pipelined reads is not mistaken for tampering. Only one
batch is held at a time; problems are handed to a callback as they are found.

A SCAN may return a key twice, so a problem can be reported twice; it is never missed for
a key that exists for the whole scan. On a Redis Cluster, run it against each primary.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, Final, cast

import msgspec

from eventstore.audit.checks import problems_of
from eventstore.audit.readonly import (
    Snapshot,
    opened_snapshot,
    queue_snapshot,
    read_snapshot,
    snapshot_of,
)
from eventstore.errors import redis_errors
from eventstore.store import Store
from machine.ids import invocation_id

DEFAULT_BATCH: Final = 100
#: Status under which invocations without a record (stream only) are counted.
NO_RECORD: Final = "NO_RECORD"


class VerifyProblem(msgspec.Struct, frozen=True, kw_only=True):
    """One integrity failure of one invocation."""

    invocation_id: str
    run_id: str
    tool_call_id: str
    reason: str


class VerifySummary(msgspec.Struct, frozen=True, kw_only=True):
    """What a (possibly partial) verification saw.

    ``next_cursor`` is 0 when the scan completed, else the cursor to resume with.
    """

    keys_scanned: int
    invocations: int
    by_status: dict[str, int]
    problems: int
    complete: bool
    next_cursor: int


class NamespaceVerifier:
    """Walks one namespace's records and streams and reports every integrity problem.

    ``cursor`` always holds the SCAN cursor to resume from: after an interruption,
    starting again from it re-checks at most the batch that was in flight.
    """

    def __init__(
        self,
        store: Store,
        *,
        cursor: int = 0,
        batch: int = DEFAULT_BATCH,
        on_problem: Callable[[VerifyProblem], None] | None = None,
        on_batch: Callable[[NamespaceVerifier], None] | None = None,
    ) -> None:
        if batch < 1 or cursor < 0:
            raise ValueError("batch must be positive and cursor not negative")
        self._store = store
        self._batch = batch
        self._on_problem = on_problem
        self._on_batch = on_batch
        self.cursor = cursor
        self.keys_scanned = 0
        self.invocations = 0
        self.problems = 0
        self.by_status: Counter[str] = Counter()

    def __repr__(self) -> str:
        return (
            f"NamespaceVerifier(cursor={self.cursor}, keys_scanned={self.keys_scanned}, "
            f"invocations={self.invocations}, problems={self.problems})"
        )

    def summary(self, *, complete: bool) -> VerifySummary:
        """Return the counts so far."""
        return VerifySummary(
            keys_scanned=self.keys_scanned,
            invocations=self.invocations,
            by_status=dict(sorted(self.by_status.items())),
            problems=self.problems,
            complete=complete,
            next_cursor=0 if complete else self.cursor,
        )

    async def run(self, *, max_keys: int | None = None) -> VerifySummary:
        """Scan until done, or until at least ``max_keys`` keys were checked.

        Raises:
            StoreUnavailable: Redis failed or timed out.

        """
        store = self._store
        pattern = store.keys.invocation_scan_pattern()
        started = self.keys_scanned
        while True:
            async with redis_errors():
                next_cursor, found = await store.client.scan(
                    self.cursor, match=pattern, count=self._batch
                )
            await self._check_batch(cast(list[bytes], found))
            self.keys_scanned += len(found)
            self.cursor = int(next_cursor)
            if self._on_batch is not None:
                self._on_batch(self)
            if self.cursor == 0:
                return self.summary(complete=True)
            if max_keys is not None and self.keys_scanned - started >= max_keys:
                return self.summary(complete=False)

    async def _check_batch(self, found: list[bytes]) -> None:
        keys = self._store.keys
        wanted: dict[tuple[str, str], bool] = {}  # (run, call) -> a record key was scanned
        for raw_key in found:
            # Only keys.py knows the layout: which key is a record, which a stream.
            parsed = keys.parse_invocation_key(raw_key)
            if parsed is None:
                self._report("", "", "unrecognized_key")
                continue
            ids = (parsed.run_id, parsed.tool_call_id)
            if not parsed.placed:
                self._report(*ids, "misplaced_key")
                continue
            wanted[ids] = wanted.get(ids, False) or parsed.kind == "record"
        if not wanted:
            return
        async with redis_errors(), self._store.client.pipeline(transaction=False) as pipe:
            for ids in wanted:
                queue_snapshot(pipe, keys, *ids)
            replies: list[Any] = await pipe.execute()
        for index, (ids, from_record) in enumerate(wanted.items()):
            snapshot = await opened_snapshot(
                self._store, snapshot_of(*ids, replies[4 * index : 4 * index + 4])
            )
            # A stream whose record exists is checked when the record key comes up.
            if snapshot.fields and not from_record:
                continue
            await self._check(snapshot)

    async def _check(self, snapshot: Snapshot) -> None:
        problems = problems_of(snapshot)
        if problems:
            snapshot = await read_snapshot(self._store, snapshot.run_id, snapshot.tool_call_id)
            problems = problems_of(snapshot)
        if not snapshot.exists:
            return
        self.invocations += 1
        status = snapshot.fields.get(b"status", b"UNKNOWN") if snapshot.fields else None
        self.by_status[status.decode("utf-8", "replace") if status else NO_RECORD] += 1
        for reason in problems:
            self._report(snapshot.run_id, snapshot.tool_call_id, reason)

    def _report(self, run_id: str, tool_call_id: str, reason: str) -> None:
        self.problems += 1
        if self._on_problem is not None:
            self._on_problem(
                VerifyProblem(
                    invocation_id=invocation_id(run_id, tool_call_id) if run_id else "",
                    run_id=run_id,
                    tool_call_id=tool_call_id,
                    reason=reason,
                )
            )
