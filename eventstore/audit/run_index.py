"""Recent runs, newest first, from the per-shard run indexes (never a SCAN of the keyspace).

``open_run.lua`` adds each run to its shard's index (``{ns}:{sNN}:runs``, scored by open
time). :func:`list_runs` merges the shards' indexes newest first, skips entries whose run
hash is gone (expired between two trims), and counts each run's calls by status from its
records. A page ends with a cursor (``<open ms>:<run id>``) naming where the next one
starts. Only reads: ZREVRANGEBYSCORE, ZCOUNT, HGETALL and HGET.
"""

from __future__ import annotations

import heapq
from collections import Counter
from typing import Final, Literal, cast

import msgspec

from eventstore.errors import InvalidArgument, redis_errors
from eventstore.runs import refused_counts
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.codes import Status
from machine.ids import is_run_id

#: Longest page of :func:`list_runs`.
MAX_LIMIT: Final = 500
RunStatus = Literal["active", "closed", "expired"]


class RunSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One run as listed: its status, calls by outcome and budget use.

    Attributes:
        run_id: the run.
        status: ``active`` (open, before its deadline), ``closed`` (closed by the
            harness) or ``expired`` (its deadline passed while open).
        opened_at_ms: when it was opened.
        deadline_ms: its deadline.
        expires_at_ms: when its registry entry (and its last record) expires.
        calls: calls by status (READY, ERROR, PROJECTING) among its records still stored.
        budget_used: invocations it created.
        budget_total: its run budget, None for none.
        refused: calls turned away before any record existed, counted per error code.

    """

    run_id: str
    status: RunStatus
    opened_at_ms: int
    deadline_ms: int
    expires_at_ms: int
    calls: dict[str, int]
    budget_used: int
    budget_total: int | None
    refused: dict[str, int] = msgspec.field(default_factory=dict)


class RunPage(msgspec.Struct, frozen=True, kw_only=True):
    """One page of runs, newest first, and the cursor of the next page (None: no more)."""

    runs: list[RunSummary]
    cursor: str | None


def format_cursor(opened_at_ms: int, run_id: str) -> str:
    """The cursor that starts a page right after this run (run ids hold no ``:``)."""
    return f"{opened_at_ms}:{run_id}"


def parse_cursor(cursor: str) -> tuple[int, str]:
    """Return ``(opened_at_ms, run_id)`` of a cursor.

    Raises:
        InvalidArgument: the cursor is not one :func:`format_cursor` makes.

    """
    ms, _, run_id = cursor.partition(":")
    if not (ms.isascii() and ms.isdigit() and len(ms) <= 16 and is_run_id(run_id)):
        raise InvalidArgument("the cursor is not one a page of runs ended with")
    return int(ms), run_id


def run_status(fields: dict[str, bytes], at_ms: int) -> RunStatus:
    """The listed status of a run hash's fields at ``at_ms``."""
    if fields.get("active") != b"1":
        return "closed"
    return "expired" if int(fields["deadline_ms"]) <= at_ms else "active"


async def _candidates(
    store: Store, count: int, after: tuple[int, str] | None
) -> list[tuple[int, str]]:
    """The newest ``count + 1`` index entries older than ``after``, across the shards.

    Each shard gives ``count + 1`` (plus its ties at the cursor's time): the one past
    ``count`` tells whether another page follows, even when one shard holds them all.
    """
    keys = store.keys
    top = "+inf" if after is None else after[0]
    async with redis_errors(), store.client.pipeline(transaction=False) as pipe:
        for shard in range(keys.shards):
            if after is not None:
                # Entries tied with the cursor's time may come first: fetch past them.
                pipe.zcount(keys.run_index(shard), after[0], after[0])
        ties = [int(n) for n in await pipe.execute()] if after is not None else []
        for shard in range(keys.shards):
            extra = ties[shard] if ties else 0
            pipe.zrevrangebyscore(
                keys.run_index(shard), top, "-inf", start=0, num=count + 1 + extra, withscores=True
            )
        replies = cast(list[list[tuple[bytes, float]]], await pipe.execute())
    per_shard = []
    for entries in replies:
        shard_entries = [(int(score), member.decode()) for member, score in entries]
        if after is not None:
            shard_entries = [entry for entry in shard_entries if entry < after]
        per_shard.append(shard_entries)
    merged = heapq.merge(*per_shard, reverse=True)
    return [entry for _, entry in zip(range(count + 1), merged, strict=False)]


async def _summaries(
    store: Store, entries: list[tuple[int, str]], at_ms: int
) -> list[RunSummary | None]:
    keys = store.keys
    async with redis_errors(), store.client.pipeline(transaction=False) as pipe:
        for _, run_id in entries:
            pipe.hgetall(keys.run(run_id))
        hashes = cast(list[dict[bytes, bytes]], await pipe.execute())
        for (_, run_id), raw in zip(entries, hashes, strict=True):
            for name, call in raw.items():
                if name.startswith(b"inv:") and keys.accepts_tool_call_id(call.decode()):
                    pipe.hget(keys.record(run_id, call.decode()), "status")
        statuses = cast(list[bytes | None], await pipe.execute())
    found: list[RunSummary | None] = []
    position = 0
    for (opened, run_id), raw in zip(entries, hashes, strict=True):
        fields = {name.decode(): value for name, value in raw.items()}
        calls: Counter[str] = Counter({status.value: 0 for status in Status})
        for name, call in raw.items():
            if name.startswith(b"inv:") and keys.accepts_tool_call_id(call.decode()):
                status = statuses[position]
                position += 1
                if status is not None:
                    calls[status.decode()] += 1
        if "deadline_ms" not in fields:
            found.append(None)  # the run expired after its index entry was read
            continue
        budget = fields.get("budget_total")
        found.append(
            RunSummary(
                run_id=run_id,
                status=run_status(fields, at_ms),
                opened_at_ms=int(fields.get("created_at_ms", opened)),
                deadline_ms=int(fields["deadline_ms"]),
                expires_at_ms=int(fields["expires_at_ms"]),
                calls=dict(calls),
                budget_used=int(fields.get("used_total", b"0")),
                budget_total=int(budget) if budget is not None else None,
                refused=refused_counts(fields),
            )
        )
    return found


async def list_runs(store: Store, *, limit: int = 20, cursor: str | None = None) -> RunPage:
    """Return up to ``limit`` runs opened before the cursor's run (all runs without one).

    Raises:
        InvalidArgument: ``limit`` is not between 1 and :data:`MAX_LIMIT`, or the cursor
            is not one a page ended with.
        StoreUnavailable: Redis failed or timed out.

    """
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidArgument(f"limit must be between 1 and {MAX_LIMIT}")
    after = parse_cursor(cursor) if cursor is not None else None
    at_ms = now_ms()
    runs: list[RunSummary] = []
    while True:
        entries = await _candidates(store, limit - len(runs), after)
        page, more = entries[: limit - len(runs)], len(entries) > limit - len(runs)
        for summary in await _summaries(store, page, at_ms):
            if summary is not None:
                runs.append(summary)
        if not page:
            return RunPage(runs=runs, cursor=None)
        after = page[-1]
        if len(runs) >= limit or not more:
            return RunPage(runs=runs, cursor=format_cursor(*after) if more else None)
