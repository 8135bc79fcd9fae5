"""Finding the runs and calls that went wrong: each run counts its failed calls per code
(its ended calls are its progress list's length), a listing keeps the runs a filter asks
for (errors, refusals, in flight, status, tool, code, an id prefix) reading a bounded
number of runs per page, and a call search reads only the runs whose counts say they hold
a match."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from eventstore.audit.run_index import RunFilter, list_runs, search_calls
from eventstore.errors import InvalidArgument
from eventstore.store import Store
from eventstore.writer import _next_event, now_ms
from machine.codes import ErrorCode, EvidenceStatus
from machine.events import Failed
from tests.helpers import commandstats
from tests.support.waiting import wait_for

pytestmark = pytest.mark.backends("single", "cluster")
_ONE_NODE = "INFO commandstats counts one node's commands on a cluster"


async def call(store: Store, run: str, tool_call_id: str, tool: str, outcome: str) -> None:
    """Write one call of ``run`` ending as ``outcome``: READY, an error code, or in flight."""
    head = await store.writer.create(run, tool_call_id, tool, b'{"q":1}')
    if outcome == "READY":
        head = await store.writer.start_projecting(head, b"{}")
        await store.writer.complete(head, b"{}", EvidenceStatus.EVIDENCE_FOUND, "s")
    elif outcome != "PROJECTING":
        await store.writer.fail(head, ErrorCode(outcome))


async def open_run(store: Store, run: str, **options: Any) -> None:
    """Open ``run``; the next one opens in a later millisecond (newest first is one order)."""
    opened = await store.open_run(run, deadline=timedelta(minutes=5), **options)
    info = await store.run_info(opened.run_id)
    assert info is not None
    await wait_for(lambda: now_ms() > info.created_at_ms + 1)


async def three_runs(store: Store) -> None:
    """run-ok: two READY searches. run-bad: a search that failed, a fetch whose projection
    failed, one in flight. run-refused: a READY fetch and a call refused for the budget."""
    await open_run(store, "run-ok")
    await call(store, "run-ok", "ok-1", "search", "READY")
    await call(store, "run-ok", "ok-2", "search", "READY")
    await open_run(store, "run-bad")
    await call(store, "run-bad", "bad-1", "search", "EXECUTION_FAILED")
    await call(store, "run-bad", "bad-2", "fetch", "PROJECTION_FAILED")
    await call(store, "run-bad", "bad-3", "fetch", "PROJECTING")
    await open_run(store, "run-refused", budget=1)
    await call(store, "run-refused", "ref-1", "fetch", "READY")
    with pytest.raises(Exception):  # noqa: B017 - the budget refusal, whatever its type
        await store.writer.create("run-refused", "ref-2", "fetch", b"{}")


async def listed(store: Store, **where: Any) -> list[str]:
    return [run.run_id for run in (await list_runs(store, where=RunFilter(**where))).runs]


async def test_a_run_counts_its_calls_as_they_end(make_store: Any) -> None:
    """The run hash counts failed:<code> once per failed call; the listing shows the calls
    by status (READY from the progress list's length) and per tool."""
    store: Store = make_store(shards=2)
    await three_runs(store)
    info = await store.run_info("run-bad")
    assert info is not None
    assert info.used_total == 3
    assert info.failed == {"EXECUTION_FAILED": 1, "PROJECTION_FAILED": 1}
    runs = {run.run_id: run for run in (await list_runs(store)).runs}
    assert runs["run-bad"].calls == {"READY": 0, "ERROR": 2, "PROJECTING": 1}
    assert runs["run-bad"].failed == {"EXECUTION_FAILED": 1, "PROJECTION_FAILED": 1}
    assert runs["run-bad"].tools == {"search": 1, "fetch": 2}
    assert runs["run-ok"].calls == {"READY": 2, "ERROR": 0, "PROJECTING": 0}


async def test_a_run_written_before_the_counts_is_counted_from_its_records(
    make_store: Any, redis: Any
) -> None:
    """A run opened by an earlier version (no failures_counted, no failed:* counts) still
    lists its calls by status, read from the records."""
    store: Store = make_store(shards=2)
    await three_runs(store)
    run_key = store.keys.run("run-bad")
    await redis.hdel(
        run_key, "failures_counted", "failed:EXECUTION_FAILED", "failed:PROJECTION_FAILED"
    )
    (bad,) = [run for run in (await list_runs(store)).runs if run.run_id == "run-bad"]
    assert bad.calls == {"READY": 0, "ERROR": 2, "PROJECTING": 1}


async def test_a_retried_terminal_event_is_counted_once(make_store: Any) -> None:
    """The same Failed event applied twice (a retry after a lost answer) counts once."""
    store: Store = make_store(shards=1)
    await open_run(store, "run-retry")
    head = await store.writer.create("run-retry", "c1", "search", b"{}")
    event = Failed(**_next_event(head), error_code=ErrorCode.EXECUTION_FAILED)
    for _ in range(2):
        applied = await store.writer.append(event, run_id="run-retry", tool_call_id="c1")
        assert applied.version == 2
    info = await store.run_info("run-retry")
    assert info is not None and info.failed == {"EXECUTION_FAILED": 1}
    (run,) = (await list_runs(store)).runs
    assert run.calls == {"READY": 0, "ERROR": 1, "PROJECTING": 0}
    assert info.failed == {"EXECUTION_FAILED": 1}


async def test_filters_keep_the_runs_asked_for(make_store: Any) -> None:
    """Errors, refusals, in flight, run status, tool, error or refusal code, id prefixes."""
    store: Store = make_store(shards=2)
    await three_runs(store)
    await store.close_run("run-ok")
    assert await listed(store) == ["run-refused", "run-bad", "run-ok"]
    assert await listed(store, status="errors") == ["run-bad"]
    assert await listed(store, status="refusals") == ["run-refused"]
    assert await listed(store, status="in_flight") == ["run-bad"]
    assert await listed(store, status="closed") == ["run-ok"]
    assert await listed(store, status="active") == ["run-refused", "run-bad"]
    assert await listed(store, tool="fetch") == ["run-refused", "run-bad"]
    assert await listed(store, tool="nope") == []
    assert await listed(store, code="PROJECTION_FAILED") == ["run-bad"]
    assert await listed(store, code="RUN_BUDGET_EXHAUSTED") == ["run-refused"]
    assert await listed(store, search="run-r") == ["run-refused"]
    assert await listed(store, search="ok-2") == ["run-ok"]  # a tool call id prefix
    assert await listed(store, status="errors", tool="search", search="bad-") == ["run-bad"]
    assert await listed(store, status="errors", tool="nope") == []


async def test_a_filtered_listing_reads_a_bounded_number_of_runs_per_page(
    make_store: Any,
) -> None:
    """With a filter, a page reads at most ``examine`` runs; its cursor goes on from the
    last run read, so the whole history is paged, never read at once."""
    store: Store = make_store(shards=2)
    for index in range(6):
        await open_run(store, f"run-{index}")
        await call(
            store, f"run-{index}", "c", "search", "READY" if index % 3 else "PROJECTION_FAILED"
        )
    where = RunFilter(status="errors")
    found: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = await list_runs(store, limit=1, cursor=cursor, where=where, examine=2)
        assert page.examined <= 2
        found += [run.run_id for run in page.runs]
        pages += 1
        cursor = page.cursor
        if cursor is None:
            break
    assert found == ["run-3", "run-0"] and pages >= 3
    with pytest.raises(InvalidArgument):
        await list_runs(store, limit=5, where=where, examine=2)


@pytest.mark.not_on_cluster(_ONE_NODE)
async def test_counting_and_searching_read_no_record_they_need_not(
    make_store: Any, redis: Any
) -> None:
    """Listing runs reads no record to count their calls; a call search reads the records
    of the runs whose counts hold a match, and no other."""
    store: Store = make_store(shards=2)
    await three_runs(store)
    before = await commandstats(redis)
    await list_runs(store)
    found = await search_calls(store, code="PROJECTION_FAILED")
    after = await commandstats(redis)
    assert found.calls and after.get("hget", 0) == before.get("hget", 0)
    # run-bad's three records only: the other runs' counts said no.
    assert after.get("hmget", 0) - before.get("hmget", 0) == 3


async def test_a_call_search_finds_calls_across_runs_newest_run_first(make_store: Any) -> None:
    """Calls of a tool, failed with a code, or both, across runs; cut at the limit."""
    store: Store = make_store(shards=2)
    await three_runs(store)
    found = await search_calls(store, code="PROJECTION_FAILED")
    assert [(hit.run_id, hit.call.tool_call_id) for hit in found.calls] == [("run-bad", "bad-2")]
    assert found.complete and found.runs_examined == 3
    by_tool = await search_calls(store, tool="fetch")
    assert [hit.call.tool_call_id for hit in by_tool.calls] == ["ref-1", "bad-2", "bad-3"]
    both = await search_calls(store, tool="search", code="EXECUTION_FAILED")
    assert [hit.call.tool_call_id for hit in both.calls] == ["bad-1"]
    cut = await search_calls(store, tool="fetch", limit=2)
    assert len(cut.calls) == 2 and not cut.complete
    with pytest.raises(InvalidArgument):
        await search_calls(store)
