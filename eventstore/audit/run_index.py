"""Recent runs, newest first, from the per-shard run indexes (never a SCAN of the keyspace).

``open_run.lua`` adds each run to its shard's index (``{ns}:{sNN}:runs``, scored by open
time). :func:`list_runs` merges the shards' indexes newest first, skips entries whose run
hash is gone (expired between two trims), and reads each run's counts from its hash (the
scripts count calls created per tool, failed per code and refused per code as they
happen) and its progress list's length (the calls that ended). A page ends with a cursor
(``<open ms>:<run id>``) naming where the next one starts. A :class:`RunFilter` keeps the
runs with errors, refusals, a tool, a code or an id prefix, reading a bounded number of
runs per page; :func:`search_calls` finds the calls of a tool or code across the latest
runs, reading only the runs whose counts say they hold one. Only reads:
ZREVRANGEBYSCORE, ZCOUNT, HGETALL, LLEN, HGET and HMGET.
"""

from __future__ import annotations

import heapq
from collections import Counter
from typing import Final, Literal, cast

import msgspec

from eventstore.audit.run_calls import CallRow, left_in_flight, run_calls
from eventstore.errors import InvalidArgument, redis_errors
from eventstore.runs import (
    APPROVED_FIELD,
    AWAITING_FIELD,
    FAILED_PREFIX,
    FAILURES_COUNTED,
    USED_PREFIX,
    RunPause,
    pause_of,
    prefixed_counts,
    refused_counts,
)
from eventstore.store import Store
from eventstore.wire.keys import registered_call_id
from eventstore.writer import now_ms
from machine.codes import Status
from machine.ids import is_run_id

#: Longest page of :func:`list_runs`.
MAX_LIMIT: Final = 500
#: Most runs one filtered page (or one call search) reads from the index.
MAX_EXAMINED: Final = 2000
RunStatus = Literal["active", "closed", "expired"]
#: What a run filter's ``status`` may ask for: a call ended ERROR, a call was refused, a
#: call is still in flight, a governed call waits for a decision, a call was left in
#: flight by a process that died (attempted or abandoned), the run is paused, or the
#: run's own status.
RunsShown = Literal[
    "errors",
    "refusals",
    "in_flight",
    "awaiting_approval",
    "attempted",
    "paused",
    "active",
    "closed",
    "expired",
]
RUNS_SHOWN: Final[tuple[RunsShown, ...]] = (
    "errors",
    "refusals",
    "in_flight",
    "awaiting_approval",
    "attempted",
    "paused",
    "active",
    "closed",
    "expired",
)


class RunSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One run as listed: its status, calls by outcome and budget use.

    Attributes:
        run_id: the run.
        status: ``active`` (open, before its deadline), ``closed`` (closed by the
            harness) or ``expired`` (its deadline passed while open).
        opened_at_ms: when it was opened.
        deadline_ms: its deadline.
        expires_at_ms: when its registry entry (and its last record) expires.
        calls: calls by status as they ended (READY, ERROR; PROJECTING: not ended, which
            counts the governed calls waiting, ``awaiting_approval`` and ``approved``).
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
    #: Calls that ended ERROR, by error code.
    failed: dict[str, int] = msgspec.field(default_factory=dict)
    #: Invocations created, by tool.
    tools: dict[str, int] = msgspec.field(default_factory=dict)
    #: Governed calls waiting for an operator's decision.
    awaiting_approval: int = 0
    #: Governed calls approved and not dispatched yet (waiting for their resume).
    approved: int = 0
    #: Who paused the run, why and since when (None while it is not paused).
    pause: RunPause | None = None

    @property
    def in_flight(self) -> int:
        """Calls that have not ended and do not wait for a decision or a resume."""
        waiting = self.awaiting_approval + self.approved
        return max(self.calls.get(Status.PROJECTING.value, 0) - waiting, 0)


class RunPage(msgspec.Struct, frozen=True, kw_only=True):
    """One page of runs, newest first, and the cursor of the next page (None: no more).

    ``examined`` is how many runs of the index the page read (more than it shows when a
    filter passed some over).
    """

    runs: list[RunSummary]
    cursor: str | None
    examined: int = 0


class RunFilter(msgspec.Struct, frozen=True, kw_only=True):
    """Which runs a listing keeps: every condition given must hold.

    Attributes:
        status: ``errors`` (a call ended ERROR), ``refusals`` (a call was refused),
            ``in_flight`` (a call is still PROJECTING), ``awaiting_approval`` (a governed
            call waits for a decision), ``attempted`` (a call was left in flight by a
            process that died: its calls are read to tell), ``paused`` (the run is
            paused) or the run's own status.
        tool: the run created an invocation of this tool.
        code: a call of the run failed, or was refused, with this error code.
        search: the run id, or one of its tool call ids, starts with this text.

    """

    status: RunsShown | None = None
    tool: str | None = None
    code: str | None = None
    search: str | None = None

    @property
    def everything(self) -> bool:
        """True when the filter keeps every run."""
        return not (self.status or self.tool or self.code or self.search)

    def keeps(self, run: RunSummary, tool_call_ids: list[str]) -> bool:
        """Tell whether ``run`` (whose calls have ``tool_call_ids``) passes the filter."""
        status = self.status
        if status == "errors" and not run.calls.get(Status.ERROR.value):
            return False
        if status == "refusals" and not run.refused:
            return False
        if status == "in_flight" and not run.calls.get(Status.PROJECTING.value):
            return False
        if status == "awaiting_approval" and not run.awaiting_approval:
            return False
        if status == "attempted" and not run.in_flight:
            return False  # and then only if a call's lease lapsed (list_runs reads them)
        if status == "paused" and run.pause is None:
            return False
        if status in ("active", "closed", "expired") and run.status != status:
            return False
        if self.tool and not run.tools.get(self.tool):
            return False
        if self.code and not (run.failed.get(self.code) or run.refused.get(self.code)):
            return False
        search = self.search
        return not search or (
            run.run_id.startswith(search) or any(c.startswith(search) for c in tool_call_ids)
        )


class CallHit(msgspec.Struct, frozen=True, kw_only=True):
    """One call a search found, and its run."""

    run_id: str
    call: CallRow


class CallSearch(msgspec.Struct, frozen=True, kw_only=True):
    """The calls a search found, how many runs it read, and whether it found them all."""

    calls: list[CallHit]
    runs_examined: int
    complete: bool


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


def _counts_by_status(
    fields: dict[str, bytes], ended: int, statuses: dict[str, bytes | None] | None
) -> dict[str, int]:
    """A run's calls by status: from its counts, or from its records' statuses.

    ``ended`` is its progress list's length (every call that ended, once); the failed ones
    are counted per code in the run hash, and the rest of the calls created are in flight.
    """
    calls: Counter[str] = Counter({status.value: 0 for status in Status})
    if statuses is None:
        failed = sum(prefixed_counts(fields, FAILED_PREFIX).values())
        calls[Status.ERROR.value] = failed
        calls[Status.READY.value] = max(ended - failed, 0)
        calls[Status.PROJECTING.value] = max(int(fields.get("used_total", b"0")) - ended, 0)
    else:
        for status in statuses.values():
            if status is not None:
                calls[status.decode()] += 1
    return dict(calls)


async def _summaries(
    store: Store, entries: list[tuple[int, str]], at_ms: int
) -> list[tuple[RunSummary, list[str]] | None]:
    """Each entry's summary and tool call ids (None: the run expired since it was listed).

    A run counts its failures as they happen and its progress list holds every call that
    ended, so a summary reads two keys; only a run opened by an earlier version, which does
    not count its failures, has its records' statuses read, one HGET per call.
    """
    keys = store.keys
    async with redis_errors(), store.client.pipeline(transaction=False) as pipe:
        for _, run_id in entries:
            pipe.hgetall(keys.run(run_id))
            pipe.llen(keys.progress(run_id))
        replies = await pipe.execute()
    hashes = cast(list[dict[bytes, bytes]], replies[0::2])
    ended = [int(length) for length in replies[1::2]]
    runs = []
    uncounted: list[tuple[str, str]] = []
    for (_, run_id), raw in zip(entries, hashes, strict=True):
        fields = {name.decode(): value for name, value in raw.items()}
        call_ids = [
            call
            for name, entry in raw.items()
            if name.startswith(b"inv:")
            and keys.accepts_tool_call_id(call := registered_call_id(entry))
        ]
        if FAILURES_COUNTED not in fields:
            uncounted.extend((run_id, call) for call in call_ids)
        runs.append((fields, call_ids))
    statuses: dict[tuple[str, str], bytes | None] = {}
    if uncounted:
        async with redis_errors(), store.client.pipeline(transaction=False) as pipe:
            for run_id, call in uncounted:
                pipe.hget(keys.record(run_id, call), "status")
            read = cast(list[bytes | None], await pipe.execute())
        statuses = dict(zip(uncounted, read, strict=True))
    found: list[tuple[RunSummary, list[str]] | None] = []
    for (opened, run_id), (fields, call_ids), length in zip(entries, runs, ended, strict=True):
        if "deadline_ms" not in fields:
            found.append(None)  # the run expired after its index entry was read
            continue
        own = None
        if FAILURES_COUNTED not in fields:
            own = {call: statuses[(run_id, call)] for call in call_ids}
        budget = fields.get("budget_total")
        summary = RunSummary(
            run_id=run_id,
            status=run_status(fields, at_ms),
            opened_at_ms=int(fields.get("created_at_ms", opened)),
            deadline_ms=int(fields["deadline_ms"]),
            expires_at_ms=int(fields["expires_at_ms"]),
            calls=_counts_by_status(fields, length, own),
            budget_used=int(fields.get("used_total", b"0")),
            budget_total=int(budget) if budget is not None else None,
            refused=refused_counts(fields),
            failed=prefixed_counts(fields, FAILED_PREFIX),
            tools=prefixed_counts(fields, USED_PREFIX),
            awaiting_approval=int(fields.get(AWAITING_FIELD, b"0")),
            # A call approved before runs counted them is counted out only: never below 0.
            approved=max(int(fields.get(APPROVED_FIELD, b"0")), 0),
            pause=pause_of(fields),
        )
        found.append((summary, call_ids))
    return found


async def list_runs(
    store: Store,
    *,
    limit: int = 20,
    cursor: str | None = None,
    where: RunFilter | None = None,
    examine: int = MAX_EXAMINED,
) -> RunPage:
    """Return up to ``limit`` runs opened before the cursor's run (all runs without one).

    With ``where``, only the runs it keeps, among at most ``examine`` runs read from the
    index for this page: the page's cursor continues after the last run examined, so a
    filter over a long history is paged too, never a read of every run at once.

    Raises:
        InvalidArgument: ``limit`` is not between 1 and :data:`MAX_LIMIT`, ``examine``
            not between ``limit`` and :data:`MAX_EXAMINED`, or the cursor is not one a
            page ended with.
        StoreUnavailable: Redis failed or timed out.

    """
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidArgument(f"limit must be between 1 and {MAX_LIMIT}")
    if where is None or where.everything:
        where = None
    elif not limit <= examine <= MAX_EXAMINED:
        raise InvalidArgument(f"examine must be between the limit and {MAX_EXAMINED}")
    after = parse_cursor(cursor) if cursor is not None else None
    at_ms = now_ms()
    runs: list[RunSummary] = []
    examined = 0
    while True:
        # Unfiltered, a batch is what the page still needs; filtered, a larger one, since
        # most runs read may be passed over.
        want = limit - len(runs) if where is None else min(max(limit, 50), examine - examined)
        entries = await _candidates(store, want, after)
        batch, more = entries[:want], len(entries) > want
        examined += len(batch)
        for found in await _summaries(store, batch, at_ms):
            if found is not None and (where is None or where.keeps(*found)):
                if where is not None and where.status == "attempted":
                    # Which calls' processes are gone is read from the calls themselves.
                    rows = await run_calls(store, found[0].run_id)
                    if not any(left_in_flight(row, at_ms) for row in rows):
                        continue
                runs.append(found[0])
        if not batch:
            return RunPage(runs=runs, cursor=None, examined=examined)
        after = batch[-1]
        if len(runs) >= limit or not more or (where is not None and examined >= examine):
            return RunPage(
                runs=runs, cursor=format_cursor(*after) if more else None, examined=examined
            )


async def paused_runs(store: Store, *, examine: int = 200) -> list[tuple[str, RunPause]]:
    """The paused runs among the latest ``examine`` runs, newest first, with their pause.

    Reads the run index and each run's hash only (``ZREVRANGEBYSCORE``, ``ZCOUNT``,
    ``HGETALL``): what a reader ACL user may run.

    Raises:
        InvalidArgument: ``examine`` is not between 1 and :data:`MAX_EXAMINED`.
        StoreUnavailable: Redis failed or timed out.

    """
    if not 1 <= examine <= MAX_EXAMINED:
        raise InvalidArgument(f"examine must be between 1 and {MAX_EXAMINED}")
    entries = (await _candidates(store, examine, None))[:examine]
    async with redis_errors(), store.client.pipeline(transaction=False) as pipe:
        for _, run_id in entries:
            pipe.hgetall(store.keys.run(run_id))
        hashes = cast(list[dict[bytes, bytes]], await pipe.execute())
    found = []
    for (_, run_id), raw in zip(entries, hashes, strict=True):
        pause = pause_of({name.decode(): value for name, value in raw.items()})
        if pause is not None:
            found.append((run_id, pause))
    return found


async def search_calls(
    store: Store,
    *,
    tool: str | None = None,
    code: str | None = None,
    runs: int = 200,
    limit: int = 100,
) -> CallSearch:
    """The calls of the latest ``runs`` runs with this tool and/or ending with this code.

    Served from the run index and the runs' counters: only a run whose counters say it
    holds a match has its calls read (lifecycle fields, never a payload). Newest run first,
    each run's calls oldest first; at most ``limit`` calls.

    Raises:
        InvalidArgument: neither ``tool`` nor ``code`` is given, or ``runs`` is not
            between 1 and :data:`MAX_EXAMINED`, or ``limit`` not between 1 and 1,000.
        StoreUnavailable: Redis failed or timed out.

    """
    if tool is None and code is None:
        raise InvalidArgument("a call search needs a tool or an error code")
    if not 1 <= runs <= MAX_EXAMINED or not 1 <= limit <= 1000:
        raise InvalidArgument(
            f"runs must be between 1 and {MAX_EXAMINED}, limit between 1 and 1000"
        )
    where = RunFilter(tool=tool, code=code)
    hits: list[CallHit] = []
    cursor: str | None = None
    examined = 0
    while examined < runs:
        page = await list_runs(
            store,
            limit=min(MAX_LIMIT, runs - examined),
            cursor=cursor,
            where=where,
            examine=runs - examined,
        )
        examined += page.examined
        for run in page.runs:
            for call in await run_calls(store, run.run_id):
                if (tool is None or call.tool == tool) and (
                    code is None or call.error_code == code
                ):
                    if len(hits) == limit:
                        return CallSearch(calls=hits, runs_examined=examined, complete=False)
                    hits.append(CallHit(run_id=run.run_id, call=call))
        cursor = page.cursor
        if cursor is None:
            break
    return CallSearch(calls=hits, runs_examined=examined, complete=True)
