"""Plain tools that outlive their time limit keep their threads: the boundary counts those
stuck threads and, once they fill the pool, refuses a thread tool at once with
EXECUTION_FAILED instead of queueing it behind them; when they return, calls run again."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from eventstore import Projection, RunContext, SyncBoundary, SyncStore, ToolCall, ToolSpec
from eventstore.boundary.tool_threads import DEFAULT_EXECUTOR_THREADS, ToolThreadsExhausted
from machine.codes import ErrorCode, Status
from machine.failure_detail import decode_failure_detail
from projections.metrics import Metrics
from tests.support.calls import RUN, assert_safe_error, envelope, outcome
from tests.support.waiting import no_thread_left, wait_until

#: The blocked tool's time limit: long enough for every blocked call to have started.
LIMIT_S = 2.0
#: Longest wait for an answer that must come at once (far below a stall, which is forever).
AT_ONCE_S = 5.0


def project(raw: Any, call: ToolCall) -> Projection:
    """The raw response as the result."""
    return Projection(result=raw, evidence_status="EVIDENCE_FOUND", scope="stuck")


class BlockedTool:
    """A plain tool that holds its thread until released, past its time limit."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self._lock = threading.Lock()
        self.started = 0

    def __call__(self, arguments: Any, call: ToolCall) -> Any:
        with self._lock:
            self.started += 1
        self.release.wait(timeout=60)
        return {"released": True}


def quick(arguments: Any, call: ToolCall) -> Any:
    """A plain tool without a time limit that returns at once."""
    return {"quick": True}


@contextmanager
def released(tool: BlockedTool) -> Iterator[None]:
    """Release the tool at the end, whatever happened."""
    try:
        yield
    finally:
        tool.release.set()


def saturate(boundary: SyncBoundary, count: int, prefix: str) -> list[str]:
    """Run ``count`` blocked calls at once; return their outcomes (each past its limit)."""
    with ThreadPoolExecutor(count) as callers:
        replies = callers.map(
            lambda n: boundary.invoke(RunContext(RUN), envelope(f"{prefix}-{n}", tool="blocked")),
            range(count),
        )
        return [outcome(reply) for reply in replies]


def timed_call(boundary: SyncBoundary, call_id: str, tool: str) -> tuple[Any, float]:
    """One call from another thread, waited for at most AT_ONCE_S: (reply, seconds)."""
    with ThreadPoolExecutor(1) as caller:
        started = time.monotonic()
        reply = caller.submit(
            boundary.invoke, RunContext(RUN), envelope(call_id, tool=tool)
        ).result(timeout=AT_ONCE_S)
        return reply, time.monotonic() - started


def tools(blocked: BlockedTool) -> dict[str, ToolSpec]:
    return {
        "blocked": ToolSpec(executor=blocked, projector=project, timeout_s=LIMIT_S),
        "quick": ToolSpec(executor=quick, projector=project),
    }


def test_a_pool_full_of_stuck_threads_refuses_thread_tools_at_once(
    redis_url: str, namespace: str
) -> None:
    """Three tools blocked past their limit fill a three-thread pool: the count says 3, a
    tool without a limit and one with a limit are both refused at once with
    EXECUTION_FAILED (the record's failure detail names ToolThreadsExhausted); once the
    blocked tools return the count drops to 0 and both tools run again."""
    blocked = BlockedTool()
    with (
        no_thread_left(),
        SyncStore.from_url(redis_url, namespace=namespace) as store,
        released(blocked),
    ):
        store.open_run(RUN, deadline=timedelta(minutes=5))
        boundary = SyncBoundary(store, tools(blocked), max_tool_threads=3)
        assert boundary.stuck_tool_threads == 0

        assert saturate(boundary, 3, "slow") == [ErrorCode.EXECUTION_FAILED.value] * 3
        assert blocked.started == 3
        assert boundary.stuck_tool_threads == 3

        refused, _ = timed_call(boundary, "refused-quick", "quick")
        assert_safe_error(refused, ErrorCode.EXECUTION_FAILED)
        refused_blocked, took_blocked = timed_call(boundary, "refused-blocked", "blocked")
        assert_safe_error(refused_blocked, ErrorCode.EXECUTION_FAILED)
        assert took_blocked < LIMIT_S  # refused, not left to run out its time limit
        assert blocked.started == 3  # nothing more was run
        for call_id in ("refused-quick", "refused-blocked"):
            record = store.get(RUN, call_id)
            assert record is not None and record.state.status is Status.ERROR
            fields = store.call(store.async_store.reader.fields(RUN, call_id))
            detail = decode_failure_detail(fields[b"failure_detail"])
            assert detail is not None
            assert detail.type == f"{ToolThreadsExhausted.__module__}.ToolThreadsExhausted"

        blocked.release.set()
        wait_until(lambda: boundary.stuck_tool_threads == 0)
        assert outcome(timed_call(boundary, "after-quick", "quick")[0]) == "READY"
        assert outcome(timed_call(boundary, "after-blocked", "blocked")[0]) == "READY"


def test_the_default_executor_count_is_shared_by_the_stores_boundaries(
    redis_url: str, namespace: str
) -> None:
    """Without max_tool_threads, tools share the store loop's default executor: when one
    boundary's timed-out tools fill it, both boundaries count them and the other
    boundary's thread tool is refused at once; released, both run again."""
    blocked = BlockedTool()
    with (
        no_thread_left(),
        SyncStore.from_url(redis_url, namespace=namespace) as store,
        released(blocked),
    ):
        store.open_run(RUN, deadline=timedelta(minutes=5))
        first = SyncBoundary(store, tools(blocked))
        second = SyncBoundary(store, tools(blocked))

        outcomes = saturate(first, DEFAULT_EXECUTOR_THREADS, "slow")
        assert outcomes == [ErrorCode.EXECUTION_FAILED.value] * DEFAULT_EXECUTOR_THREADS
        assert blocked.started == DEFAULT_EXECUTOR_THREADS
        assert first.stuck_tool_threads == second.stuck_tool_threads == DEFAULT_EXECUTOR_THREADS

        refused, _ = timed_call(second, "refused", "quick")
        assert_safe_error(refused, ErrorCode.EXECUTION_FAILED)

        blocked.release.set()
        wait_until(lambda: first.stuck_tool_threads == second.stuck_tool_threads == 0)
        assert outcome(timed_call(second, "after", "quick")[0]) == "READY"


def test_metrics_show_the_stuck_threads_of_a_watched_boundary(
    redis_url: str, namespace: str
) -> None:
    """``canon_stuck_tool_threads{boundary}`` reads the count at each scrape: 2 while two
    tools are blocked past their limit, 0 once they return."""
    blocked = BlockedTool()
    metrics = Metrics()

    def scraped() -> float | None:
        return metrics.registry.get_sample_value("canon_stuck_tool_threads", {"boundary": "b"})

    with (
        no_thread_left(),
        SyncStore.from_url(redis_url, namespace=namespace) as store,
        released(blocked),
    ):
        store.open_run(RUN, deadline=timedelta(minutes=5))
        boundary = SyncBoundary(store, tools(blocked), max_tool_threads=2)
        metrics.watch_boundary(boundary, "b")
        assert scraped() == 0

        assert saturate(boundary, 2, "slow") == [ErrorCode.EXECUTION_FAILED.value] * 2
        assert scraped() == 2

        blocked.release.set()
        wait_until(lambda: scraped() == 0)
