"""The archive section (opt-in: ``canon bench --archive``, or alone ``--archive-only``).

**Lag.** An :class:`~projections.archive.ArchiveWorker` runs in a child process with the
options ``canon archive`` has by default (as an operator runs it), writing a fresh
archive database. Writers pace invocations at the boundary's rate with 16 calls in
flight on one server (the throughput section's median, or measured here first), through
the Writer with payloads of the benchmark's sizes (random bytes: :func:`archive_payloads`),
for a fixed time, and at half and a quarter of that rate. A call's lag is the
commit of the database transaction that archived its terminal version (timed in the
child, right after the commit returns, and appended to a file the parent follows, so
nothing but the worker touches the database while it runs) minus the time in its
Completed event's feed entry id; both clocks are this host's.

**Search.** A second namespace of the same database is filled in bulk by the benchmark
itself, never through Redis: 1,000,000 finished calls (a full run) written through the
archive's own write path (:meth:`~projections.archive.store.Archive.write`, 2,000 calls a
transaction), each a copy of a real record and journal (written once through the Writer)
with its own ids, tool (one of 20), outcome (one in ten failed, with one of four codes
and, for ``EXECUTION_FAILED``, one of four exception types; one in fifty decided by one
of five approvers), creation time (spread over 90 days) and request and result (JSON:
an amount, a currency, a customer and its tier; a status). Then each query shape runs a
number of times with its own constants, through :func:`projections.archive.search.search`
(what ``canon search`` and the console run), one page of 50: median, 90th percentile and
worst. PostgreSQL's statistics are refreshed after the load (``ANALYZE``, as its
autovacuum would do on its own); SQLite is queried as the archive leaves it.

**Sizes.** The database's bytes per archived call: from the lag's real calls, and from
the bulk load.

The child is this module: ``python -m canon.bench.archive URL NAMESPACE SHARDS
ARCHIVE_URL COMMITS_FILE`` prints ``ready`` once its consumer groups exist and archives
until SIGTERM, appending one ``invocation_id committed_ms`` line per archived call to
the file after each transaction.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Final, cast

import msgspec
from redis.asyncio import Redis

from canon.bench.lag import write_paced
from canon.bench.postgres import PostgresUnavailable, private_postgres
from canon.bench.report import spread
from canon.bench.throughput import ThroughputBench
from canon.bench.timing import percentile
from canon.bench.workload import Payloads
from canon.logging_setup import configure_logging
from canon.service import freeze_startup_heap
from eventstore.reader import stored_events
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.codes import ErrorCode, EvidenceStatus
from machine.ids import invocation_id
from projections.archive import ArchiveProjection, ArchiveWorker
from projections.archive.database import ArchiveDatabase, archive_at
from projections.archive.schema import migrate
from projections.archive.search import SearchQuery, parse_condition, search
from projections.archive.store import Archive, ArchiveBatch, ArchivedInvocation

Progress = Callable[[str], None]
#: The archive backends measured, in order.
BACKENDS: Final = ("sqlite", "postgresql")
#: Calls written per transaction while the search archive is filled.
BULK_BATCH: Final = 2_000
#: Calls of one run in the search archive.
CALLS_PER_RUN: Final = 1_000
#: The time the search archive's calls are spread over.
SPAN_MS: Final = 90 * 86_400_000
#: A search's time range in the indexed query.
WEEK_MS: Final = 7 * 86_400_000
TOOLS: Final = tuple(f"tool{n:02d}" for n in range(20))
#: Error codes of the failed calls, by weight.
CODES: Final = (
    (ErrorCode.EXECUTION_FAILED, 5),
    (ErrorCode.PROJECTION_FAILED, 2),
    (ErrorCode.RESULT_TOO_LARGE, 2),
    (ErrorCode.APPROVAL_DENIED, 1),
)
EXCEPTIONS: Final = ("TimeoutError", "ConnectionError", "ValueError", "KeyError")
APPROVERS: Final = ("alice", "bob", "carol", "dave", "erin")
TIERS: Final = (("standard", 90), ("gold", 9), ("platinum", 1))
STATUSES: Final = (("ok", 90), ("partial", 8), ("timeout", 2))
#: The longest wait for the archive to catch up after the writers stop (four times the
#: write time when longer).
CATCH_UP_S: Final = 20.0
#: Timed runs of ``json_none``, which reads every row (at most).
NONE_QUERIES: Final = 5
#: The child's consumer name.
CONSUMER: Final = "bench-archive"


@dataclass(frozen=True, slots=True, kw_only=True)
class ArchiveOptions:
    """What the archive section runs: its sizes, and a PostgreSQL server if one is given."""

    lag_duration_s: float
    #: The write rates the lag is measured at, as fractions of the boundary's.
    lag_fractions: tuple[float, ...]
    search_calls: int
    queries: int
    boundary_repeats: int
    boundary_duration_s: float
    postgres_url: str | None = None

    @classmethod
    def quick_run(cls) -> ArchiveOptions:
        """A small run: seconds of lag, 20,000 calls searched."""
        return cls(
            lag_duration_s=2.0,
            lag_fractions=(1.0,),
            search_calls=20_000,
            queries=5,
            boundary_repeats=1,
            boundary_duration_s=0.5,
        )

    @classmethod
    def full_run(cls) -> ArchiveOptions:
        """The figures of docs/performance.md: 10 s of lag, 1,000,000 calls searched."""
        return cls(
            lag_duration_s=10.0,
            lag_fractions=(1.0, 0.5, 0.25),
            search_calls=1_000_000,
            queries=25,
            boundary_repeats=3,
            boundary_duration_s=1.5,
        )

    def on(self, postgres_url: str | None) -> ArchiveOptions:
        """These options against a given PostgreSQL server (a database the run may fill)."""
        return replace(self, postgres_url=postgres_url)


async def boundary_rate(url: str, options: ArchiveOptions, progress: Progress) -> float:
    """The boundary's invocations/s with 16 calls in flight on this server (the median)."""
    namespace = "arate" + secrets.token_hex(4)
    store = Store.from_url(url, namespace=namespace, ttl=timedelta(hours=1))
    bare = Redis.from_url(url)
    rates = []
    try:
        async with store:
            bench = ThroughputBench(store, Payloads.of(), bare=bare)
            await bench.prepare()
            for repeat in range(options.boundary_repeats):
                sample = await bench.run("boundary", repeat, 16, 0.3, options.boundary_duration_s)
                rates.append(sample.invocations_per_s)
            await bench.close()
    finally:
        await _delete_namespace(bare, namespace)
        await bare.aclose()
    rate = sorted(rates)[len(rates) // 2]
    progress(f"archive: the boundary writes {rate:,.0f} invocations/s with 16 in flight")
    return rate


async def _delete_namespace(client: Redis, namespace: str) -> None:
    """Delete every key of a benchmark namespace (SCAN and DEL; nothing is flushed)."""
    async for key in client.scan_iter(match=f"{{{namespace}}}:*", count=1000):
        await client.delete(key)


# -- lag ---------------------------------------------------------------------------------


async def _start_child(
    url: str, namespace: str, shards: int, archive_url: str, commits: Path
) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "canon.bench.archive",
        url,
        namespace,
        str(shards),
        archive_url,
        str(commits),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), timeout=60)
    if line.strip() != b"ready":
        await _stop_child(process)
        raise RuntimeError("the archive worker did not start")
    return process


async def _stop_child(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), timeout=60)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


class Commits:
    """The commit times the child appends to its file, read as they come."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.at_ms: dict[str, int] = {}
        #: The child's CPU seconds, written last (None until it exits).
        self.cpu_s: float | None = None
        self._offset = 0
        self._partial = b""

    def follow(self) -> int:
        """Read the lines appended since the last call; return how many calls are known."""
        if self.path.exists():
            with self.path.open("rb") as source:
                source.seek(self._offset)
                data = self._partial + source.read()
                self._offset = source.tell()
            *lines, self._partial = data.split(b"\n")
            for line in lines:
                name, _, value = line.decode().partition(" ")
                if name == "cpu":
                    self.cpu_s = float(value)
                else:
                    self.at_ms.setdefault(name, int(value))
        return len(self.at_ms)


async def _archived_calls(database: ArchiveDatabase, namespace: str) -> int:
    """How many calls of ``namespace`` the archive holds at their terminal version (3)."""
    rows = await database.fetch(
        "SELECT count(*) FROM invocations WHERE namespace = ? AND version >= 3", (namespace,)
    )
    return int(rows[0][0])


async def database_bytes(database: ArchiveDatabase) -> int:
    """The bytes the archive database takes (pages in use; PostgreSQL: the database)."""
    if database.dialect == "postgresql":
        rows = await database.fetch("SELECT pg_database_size(current_database())")
        return int(rows[0][0])
    count = (await database.fetch("PRAGMA page_count"))[0][0]
    free = (await database.fetch("PRAGMA freelist_count"))[0][0]
    size = (await database.fetch("PRAGMA page_size"))[0][0]
    return (int(count) - int(free)) * int(size)


async def measure_lag(
    url: str, archive_url: str, rate_per_s: float, duration_s: float, progress: Progress
) -> dict[str, Any]:
    """Pace writers at ``rate_per_s`` with the archive worker running; the lag figures."""
    namespace = "alag" + secrets.token_hex(4)
    store = Store.from_url(url, namespace=namespace, ttl=timedelta(hours=1))
    bare = Redis.from_url(url)
    with tempfile.TemporaryDirectory(prefix="canon-bench-archive-") as folder:
        commits = Commits(Path(folder) / "commits")
        try:
            async with store, archive_at(archive_url) as database:
                before = await database_bytes(database)
                process = await _start_child(
                    url, namespace, store.keys.shards, archive_url, commits.path
                )
                try:
                    progress(f"archive lag: writing {rate_per_s:,.0f} invocations/s")
                    payloads = archive_payloads(random.Random(3))
                    heads = await write_paced(store, rate_per_s, duration_s, payloads)
                    deadline = time.monotonic() + max(CATCH_UP_S, 4 * duration_s)
                    while commits.follow() < len(heads):
                        if time.monotonic() > deadline:
                            break
                        await asyncio.sleep(0.1)  # the child appends to a file: poll it
                    ended_ms = now_ms()
                finally:
                    await _stop_child(process)
                commits.follow()
                archived = await _archived_calls(database, namespace)
                after = await database_bytes(database)
        finally:
            await _delete_namespace(bare, namespace)
            await bare.aclose()
    committed = commits.at_ms
    lags = []
    pending = 0
    for head in heads:
        at = committed.get(invocation_id(head.run_id, head.tool_call_id))
        if at is None:
            pending += 1
        done = ended_ms if at is None else at
        lags.append(float(done - int(head.entry_id.split("-")[0])))
    first = min((int(head.entry_id.split("-")[0]) for head in heads), default=0)
    span_s = max((max(committed.values(), default=first) - first) / 1000, 1e-3)
    return {
        "measured": True,
        "rate_per_s": round(len(heads) / duration_s, 1),
        "invocations": len(heads),
        "p50_ms": percentile(lags, 0.50),
        "p99_ms": percentile(lags, 0.99),
        "max_ms": max(lags, default=0.0),
        "drained_per_s": round((len(heads) - pending) / span_s, 1),
        "pending": pending,
        "lower_bound": pending > 0,
        "archived": archived,
        "bytes_per_call": round((after - before) / archived) if archived else None,
        "worker_cpu_us_per_call": (
            round(commits.cpu_s * 1e6 / archived) if commits.cpu_s and archived else None
        ),
    }


class TimedArchive(Archive):
    """The archive the child writes, appending each call's commit time to ``sink``."""

    def __init__(self, database: ArchiveDatabase, namespace: str, sink: Any) -> None:
        super().__init__(database, namespace)
        self._sink = sink

    async def write(self, batch: ArchiveBatch) -> dict[str, int]:
        """Write as the archive does; then note the commit time of every call written."""
        written = await super().write(batch)
        if written:
            at_ms = now_ms()
            self._sink.write("".join(f"{inv_id} {at_ms}\n" for inv_id in written).encode())
            self._sink.flush()
        return written


async def _archive_in_child(
    url: str, namespace: str, shards: int, archive_url: str, commits: Path
) -> None:
    store = Store.from_url(url, namespace=namespace, shards=shards)
    with commits.open("ab") as sink:
        async with store, archive_at(archive_url) as database:
            worker = ArchiveWorker(store, database, consumer=CONSUMER)
            cast(ArchiveProjection, worker.projection).archive = TimedArchive(
                database, namespace, sink
            )
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, worker.stop)
            await worker.ensure_groups()
            print("ready", flush=True)
            started = time.process_time()
            await worker.run()
        # The CPU it spent archiving (its start, imports included, left out).
        sink.write(f"cpu {time.process_time() - started}\n".encode())


# -- search ------------------------------------------------------------------------------


class Template(msgspec.Struct, frozen=True, kw_only=True):
    """A real record and journal, written once through the Writer, to copy calls from."""

    fields: dict[bytes, bytes]
    events: list[Any]


async def templates(url: str) -> dict[str, Template]:
    """A READY and a failed call (with its failure detail) as Redis holds them."""
    namespace = "atpl" + secrets.token_hex(4)
    store = Store.from_url(url, namespace=namespace, ttl=timedelta(hours=1))
    bare = Redis.from_url(url)
    payloads = archive_payloads(random.Random(0))
    found: dict[str, Template] = {}
    try:
        async with store:
            await store.open_run("tpl", deadline=timedelta(hours=1))
            ok = await store.writer.create("tpl", "ok", "tool00", payloads.request)
            ok = await store.writer.start_projecting(ok, payloads.raw)
            await store.writer.complete(ok, payloads.result, EvidenceStatus.EVIDENCE_FOUND, "bench")
            failed = await store.writer.create(
                "tpl", "failed", "tool00", _request(random.Random(1))
            )
            failed = await store.writer.start_projecting(failed, payloads.raw)
            rng = random.Random(2)
            detail = {
                "type": "TimeoutError",
                "message": _text(rng, 200),
                "traceback": _text(rng, 1000),
            }
            await store.writer.fail(
                failed, ErrorCode.EXECUTION_FAILED, failure_detail=msgspec.json.encode(detail)
            )
            for name in ("ok", "failed"):
                fields = cast(
                    dict[bytes, bytes], await bare.hgetall(store.keys.record("tpl", name))
                )
                entries = cast(
                    list[tuple[bytes, dict[bytes, bytes]]],
                    await bare.xrange(store.keys.stream("tpl", name)),
                )
                found[name] = Template(fields=fields, events=stored_events(entries))
    finally:
        await _delete_namespace(bare, namespace)
        await bare.aclose()
    return found


def _pick(rng: random.Random, weighted: Sequence[tuple[Any, int]]) -> Any:
    return rng.choices([value for value, _ in weighted], [weight for _, weight in weighted])[0]


def _text(rng: random.Random, size: int) -> str:
    """``size`` characters of random base64: text no database compresses away."""
    return base64.b64encode(rng.randbytes(size * 3 // 4 + 3)).decode()[:size]


def _request(rng: random.Random) -> bytes:
    """A refund-like request of about 1 KiB: amount, currency, customer and tier, a note."""
    document = {
        "amount": rng.randrange(10_000),
        "currency": rng.choice(("EUR", "USD", "GBP", "JPY")),
        "customer": {"id": f"c{rng.randrange(1_000_000):07d}", "tier": _pick(rng, TIERS)},
        "note": _text(rng, 900),
    }
    return msgspec.json.encode(document)


def _result(rng: random.Random) -> bytes:
    """An agent result of about 512 B: a status, a count, a text."""
    return msgspec.json.encode(
        {"status": _pick(rng, STATUSES), "items": rng.randrange(100), "text": _text(rng, 440)}
    )


def archive_payloads(rng: random.Random) -> Payloads:
    """The benchmark's payload sizes (about 1 KiB, 4 KiB, 512 B) as JSON and random bytes.

    Random, so a database that compresses what it stores (PostgreSQL's TOAST) is sized
    by what it keeps, not by how well repeated letters compress.
    """
    return Payloads(request=_request(rng), raw=rng.randbytes(4096), result=_result(rng))


def synthetic_call(
    number: int, calls: int, start_ms: int, found: dict[str, Template], rng: random.Random
) -> ArchivedInvocation:
    """Call ``number`` of the search archive: a template with its own ids and values."""
    failed = rng.random() < 0.1
    template = found["failed" if failed else "ok"]
    fields = dict(template.fields)
    run_id = f"s{number // CALLS_PER_RUN:07d}"
    call = f"c{number:07d}"
    created = start_ms + number * SPAN_MS // calls + rng.randrange(1000)
    fields.update(
        {
            b"run_id": run_id.encode(),
            b"tool_call_id": call.encode(),
            b"tool": rng.choice(TOOLS).encode(),
            b"invocation_id": invocation_id(run_id, call).encode(),
            b"created_at_ms": b"%d" % created,
            b"updated_at_ms": b"%d" % (created + rng.randrange(50, 5000)),
            b"expires_at_ms": b"%d" % (created + 86_400_000),
            b"request": _request(rng),
        }
    )
    if failed:
        code = _pick(rng, CODES)
        fields[b"error_code"] = code.value.encode()
        if code is ErrorCode.EXECUTION_FAILED:
            detail = {
                "type": rng.choice(EXCEPTIONS),
                "message": _text(rng, 200),
                "traceback": _text(rng, 1000),
            }
            fields[b"failure_detail"] = msgspec.json.encode(detail)
        else:
            fields.pop(b"failure_detail", None)
    else:
        fields[b"result"] = _result(rng)
    if rng.random() < 0.02:
        fields[b"decided_by"] = rng.choice(APPROVERS).encode()
    return ArchivedInvocation(
        run_id=run_id, tool_call_id=call, fields=fields, events=template.events
    )


async def fill(
    archive: Archive,
    calls: int,
    found: dict[str, Template],
    progress: Progress,
    *,
    start_ms: int,
) -> float:
    """Write ``calls`` synthetic calls in transactions of :data:`BULK_BATCH`; seconds taken."""
    rng = random.Random(7)
    started = time.perf_counter()
    for first in range(0, calls, BULK_BATCH):
        batch = ArchiveBatch(
            invocations=[
                synthetic_call(number, calls, start_ms, found, rng)
                for number in range(first, min(first + BULK_BATCH, calls))
            ]
        )
        await archive.write(batch)
        if first and first % 100_000 == 0:
            progress(f"archive search: {first:,} calls written")
    if archive.database.dialect == "postgresql":
        async with archive.database.transaction() as tx:
            await tx.execute("ANALYZE")
    return time.perf_counter() - started


def query_shapes(start_ms: int, rng: random.Random) -> dict[str, Callable[[], SearchQuery]]:
    """Each query shape measured, as a maker of one query with fresh constants.

    ``indexed``: a tool, an error code and a week (the goal's indexed query).
    ``json_equal``: ``result.status="timeout"`` (about 2 % of the READY calls);
    ``json_nested``: ``request.customer.tier="platinum"`` (about 1 %); ``json_range``:
    ``request.amount>X``, X from 9,800 to 9,990 (0.1 to 2 %), the goal's JSON-path
    conditions. ``json_none``: a condition no call meets, so every row is read (the
    worst case, reported beside them).
    """

    def indexed() -> SearchQuery:
        since = start_ms + rng.randrange(SPAN_MS - WEEK_MS)
        return SearchQuery(
            tool=rng.choice(TOOLS),
            error_code=_pick(rng, CODES).value,
            since_ms=since,
            until_ms=since + WEEK_MS,
        )

    def where(text: str) -> Callable[[], SearchQuery]:
        return lambda: SearchQuery(conditions=(parse_condition(text),))

    def amount() -> SearchQuery:
        return SearchQuery(
            conditions=(parse_condition(f"request.amount>{rng.randrange(9_800, 9_990)}"),)
        )

    return {
        "indexed": indexed,
        "json_equal": where('result.status="timeout"'),
        "json_nested": where('request.customer.tier="platinum"'),
        "json_range": amount,
        "json_none": where("request.amount>20000"),
    }


async def time_queries(
    archive: Archive, start_ms: int, queries: int, progress: Progress
) -> dict[str, Any]:
    """Run each shape ``queries`` times (after one untimed run); ms per page of 50."""
    rng = random.Random(11)
    result: dict[str, Any] = {}
    for name, make in query_shapes(start_ms, rng).items():
        await search(archive, make())  # warm the plan and the cache once
        times, hits = [], []
        # The worst case reads every row each time: a few runs tell its time.
        for _ in range(min(queries, NONE_QUERIES) if name == "json_none" else queries):
            query = make()
            started = time.perf_counter()
            page = await search(archive, query)
            times.append((time.perf_counter() - started) * 1000)
            hits.append(len(page.hits))
        result[name] = {
            "p50_ms": round(percentile(times, 0.5), 2),
            "p90_ms": round(percentile(times, 0.9), 2),
            "max_ms": round(max(times), 2),
            "hits": spread([float(n) for n in hits]),
        }
        progress(f"archive search {name}: p50 {result[name]['p50_ms']:.1f} ms")
    return result


async def measure_search(
    archive_url: str, found: dict[str, Template], options: ArchiveOptions, progress: Progress
) -> dict[str, Any]:
    """Fill a namespace with ``options.search_calls`` calls, then time each query shape."""
    namespace = "asearch" + secrets.token_hex(4)
    start_ms = now_ms() - SPAN_MS
    async with archive_at(archive_url) as database:
        archive = Archive(database, namespace)
        before = await database_bytes(database)
        progress(f"archive search: writing {options.search_calls:,} calls in bulk")
        fill_s = await fill(archive, options.search_calls, found, progress, start_ms=start_ms)
        size = await database_bytes(database) - before
        timings = await time_queries(archive, start_ms, options.queries, progress)
    return {
        "measured": True,
        "calls": options.search_calls,
        "fill_s": round(fill_s, 1),
        "fill_calls_per_s": round(options.search_calls / fill_s),
        "bytes_per_call": round(size / options.search_calls),
        "database_bytes": size,
        "queries": timings,
    }


# -- the section -------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _database(
    backend: str, options: ArchiveOptions, folder: Path
) -> AsyncIterator[tuple[str, str]]:
    """A fresh, migrated archive of ``backend``: its URL and where it is."""
    if backend == "sqlite":
        url = f"sqlite:///{folder / 'archive.sqlite3'}"
        where = "a file in a temporary folder (WAL, synchronous=NORMAL)"
        async with archive_at(url) as database:
            await migrate(database)
        yield url, where
        return
    given = options.postgres_url
    with contextlib.nullcontext(given) if given is not None else private_postgres() as url:
        where = (
            "the given server"
            if given is not None
            else "a private server on loopback, PostgreSQL's default settings"
        )
        async with archive_at(url) as database:
            await migrate(database)
        yield url, where


async def measure_archive(
    url: str,
    options: ArchiveOptions,
    progress: Progress,
    *,
    rate_per_s: float | None = None,
) -> dict[str, Any]:
    """The archive section: lag and search on each backend, and the sizes.

    ``rate_per_s`` is the boundary's rate with 16 calls in flight when the throughput
    section measured it; otherwise it is measured here first.
    """
    source = "the throughput section (median)"
    if rate_per_s is None:
        rate_per_s = await boundary_rate(url, options, progress)
        source = f"measured first ({options.boundary_repeats} x {options.boundary_duration_s} s)"
    found = await templates(url)
    result: dict[str, Any] = {
        "measured": True,
        "rate_per_s": round(rate_per_s, 1),
        "rate_source": source,
        "config": {
            "lag_duration_s": options.lag_duration_s,
            "lag_fractions": list(options.lag_fractions),
            "search_calls": options.search_calls,
            "queries_per_shape": options.queries,
            "worker": "canon archive's defaults: batch 64, block 1000 ms, one process",
            "payload_bytes": {"request": 1024, "raw": 4096, "result": 512},
        },
    }
    for backend in BACKENDS:
        with tempfile.TemporaryDirectory(prefix="canon-bench-archive-") as folder:
            try:
                async with _database(backend, options, Path(folder)) as (archive_url, where):
                    progress(f"archive: {backend}, {where}")
                    lag = {
                        f"{fraction:g}": await measure_lag(
                            url,
                            archive_url,
                            rate_per_s * fraction,
                            options.lag_duration_s,
                            progress,
                        )
                        for fraction in options.lag_fractions
                    }
                    searched = await measure_search(archive_url, found, options, progress)
                    result[backend] = {"where": where, "lag": lag, "search": searched}
            except PostgresUnavailable as exc:
                result[backend] = {"measured": False, "reason": str(exc)}
            except Exception as exc:  # the other backend still counts
                result[backend] = {"measured": False, "reason": f"failed: {type(exc).__name__}"}
    return result


def main(argv: Sequence[str]) -> int:
    """Run the archive section's worker: URL, namespace, shards, archive URL, commits file."""
    url, namespace, shards, archive_url, commits = argv
    configure_logging(json=True, level="INFO")
    freeze_startup_heap()  # as canon archive does
    asyncio.run(_archive_in_child(url, namespace, int(shards), archive_url, Path(commits)))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
