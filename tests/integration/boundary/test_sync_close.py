"""Closing a ``SyncStore`` (or a ``SyncBoundary``) while other threads are calling: new
calls are refused at once, calls in flight get a grace period, the rest are cancelled
with their records closed, and no thread waits forever."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest

from eventstore import (
    AgentReply,
    Projection,
    RunContext,
    StoreClosed,
    SyncBoundary,
    SyncStore,
    ToolCall,
    ToolSpec,
)
from eventstore.errors import InvalidArgument
from machine.codes import ErrorCode, Status
from tests.support.calls import RUN, TOOL, envelope, outcome
from tests.support.waiting import no_thread_left, wait_until

#: Callers of the crowded tests, and the tool threads they share.
CALLERS, TOOL_THREADS = 64, 16
#: Longest a caller may wait once a close began: its grace period, plus the closing of
#: the cut records (bounded by the store timeout), plus room for a loaded machine.
RETURN_BOUND_S = 20.0


def project(raw: Any, call: ToolCall) -> Projection:
    """The raw response as the result."""
    return Projection(result=raw, evidence_status="EVIDENCE_FOUND", scope="close")


class SlowTool:
    """A plain tool that blocks its thread until released; counts the runs under way."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self._lock = threading.Lock()
        self.running = 0

    def __call__(self, arguments: Any, call: ToolCall) -> Any:
        with self._lock:
            self.running += 1
        try:
            self.release.wait(timeout=60)
            return {"q": arguments["q"]}
        finally:
            with self._lock:
                self.running -= 1

    def spec(self) -> ToolSpec:
        return ToolSpec(executor=self, projector=project)


def refused(action: Callable[[], object]) -> bool:
    """Tell whether ``action()`` raises StoreClosed."""
    try:
        action()
    except StoreClosed:
        return True
    return False


def call_or_error(boundary: SyncBoundary, call_id: str) -> AgentReply | BaseException:
    """The reply of one call, or the exception it raised."""
    try:
        return boundary.invoke(RunContext(RUN), envelope(call_id, arguments={"q": call_id}))
    except BaseException as exc:
        return exc


@contextmanager
def released(tool: SlowTool, stores: list[SyncStore]) -> Iterator[None]:
    """Release the tool and close ``stores`` at the end, whatever happened."""
    try:
        yield
    finally:
        tool.release.set()
        for store in stores:
            store.close(grace_s=0)


def statuses(redis_url: str, namespace: str, call_ids: list[str]) -> dict[str, tuple[Any, Any]]:
    """Each call's record (status, error code), read through a store of its own."""
    with SyncStore.from_url(redis_url, namespace=namespace) as reader:
        found = {call_id: reader.get(RUN, call_id) for call_id in call_ids}
    return {
        call_id: (None, None) if record is None else (record.state.status, record.state.error_code)
        for call_id, record in found.items()
    }


def start_callers(
    callers: ThreadPoolExecutor, boundary: SyncBoundary, call_ids: list[str]
) -> list[Future[AgentReply | BaseException]]:
    return [callers.submit(call_or_error, boundary, call_id) for call_id in call_ids]


def test_closing_under_load_cuts_what_outlives_the_grace_period(
    redis_url: str, namespace: str
) -> None:
    """64 threads call a tool that blocks (16 running, 48 queued for a thread) while another
    thread closes with a short grace period: close ends within its bound, every caller
    gets StoreClosed, every record is ERROR with CALLER_CANCELLED (none PROJECTING), and
    the 16 tool threads still blocked count as stuck until their tools return."""
    tool = SlowTool()
    call_ids = [f"call-{n}" for n in range(CALLERS)]
    stores: list[SyncStore] = []
    with no_thread_left(), ThreadPoolExecutor(CALLERS) as callers, released(tool, stores):
        store = SyncStore.from_url(redis_url, namespace=namespace)
        stores.append(store)
        store.open_run(RUN, deadline=timedelta(minutes=5))
        boundary = SyncBoundary(store, {TOOL: tool.spec()}, max_tool_threads=TOOL_THREADS)
        futures = start_callers(callers, boundary, call_ids)
        wait_until(lambda: store.run_info(RUN).invocations == CALLERS)  # type: ignore[union-attr]
        wait_until(lambda: tool.running == TOOL_THREADS)

        started = time.monotonic()
        closer = threading.Thread(target=store.close, kwargs={"grace_s": 0.5})
        closer.start()
        _, not_done = wait(futures, timeout=RETURN_BOUND_S)
        closer.join(RETURN_BOUND_S)
        took = time.monotonic() - started

        assert not not_done, f"{len(not_done)} of {CALLERS} callers still blocked"
        assert not closer.is_alive() and took < RETURN_BOUND_S
        answers = [future.result() for future in futures]
        assert all(isinstance(answer, StoreClosed) for answer in answers), answers
        assert "CALLER_CANCELLED" in str(answers[0])
        assert refused(lambda: boundary.invoke(RunContext(RUN), envelope("call-late")))
        assert refused(lambda: store.get(RUN, "call-0"))
        # The cut tools still hold their threads: stuck until they return.
        assert tool.running == TOOL_THREADS
        assert boundary.stuck_tool_threads == TOOL_THREADS
        tool.release.set()
        wait_until(lambda: boundary.stuck_tool_threads == 0)
    assert set(statuses(redis_url, namespace, call_ids).values()) == {
        (Status.ERROR, ErrorCode.CALLER_CANCELLED)
    }


def test_calls_that_finish_within_the_grace_period_answer_as_usual(
    redis_url: str, namespace: str
) -> None:
    """Once close has begun, a new call is refused at once with StoreClosed, while the 64
    calls in flight finish within the grace period: each caller gets its READY reply and
    every record is READY."""
    tool = SlowTool()
    call_ids = [f"call-{n}" for n in range(CALLERS)]
    stores: list[SyncStore] = []
    with no_thread_left(), ThreadPoolExecutor(CALLERS) as callers, released(tool, stores):
        store = SyncStore.from_url(redis_url, namespace=namespace)
        stores.append(store)
        store.open_run(RUN, deadline=timedelta(minutes=5))
        boundary = SyncBoundary(store, {TOOL: tool.spec()}, max_tool_threads=TOOL_THREADS)
        futures = start_callers(callers, boundary, call_ids)
        wait_until(lambda: store.run_info(RUN).invocations == CALLERS)  # type: ignore[union-attr]
        wait_until(lambda: tool.running == TOOL_THREADS)

        closer = threading.Thread(target=store.close, kwargs={"grace_s": 60})
        closer.start()
        wait_until(lambda: refused(lambda: store.run_info(RUN)))
        # Refused at once, not queued behind the rest: every call in flight is still held.
        assert refused(lambda: boundary.invoke(RunContext(RUN), envelope("call-late")))
        assert closer.is_alive() and not any(future.done() for future in futures)

        tool.release.set()
        _, not_done = wait(futures, timeout=RETURN_BOUND_S)
        closer.join(RETURN_BOUND_S)
        assert not not_done and not closer.is_alive()
        answers = [future.result() for future in futures]
        assert [outcome(answer) for answer in answers] == ["READY"] * CALLERS  # type: ignore[arg-type]
    assert set(statuses(redis_url, namespace, [*call_ids, "call-late"]).values()) == {
        (Status.READY, None),
        (None, None),  # the late call was refused before anything was stored
    }


def test_close_called_twice_and_from_two_threads_at_once(redis_url: str, namespace: str) -> None:
    """Two threads close at once while calls are in flight: both return within the bound
    (the second once the first is done), a third close returns at once, every caller is
    answered and no record stays PROJECTING."""
    tool = SlowTool()
    call_ids = [f"call-{n}" for n in range(8)]
    stores: list[SyncStore] = []
    with no_thread_left(), ThreadPoolExecutor(len(call_ids)) as callers, released(tool, stores):
        store = SyncStore.from_url(redis_url, namespace=namespace)
        stores.append(store)
        store.open_run(RUN, deadline=timedelta(minutes=5))
        boundary = SyncBoundary(store, {TOOL: tool.spec()}, max_tool_threads=4)
        futures = start_callers(callers, boundary, call_ids)
        wait_until(lambda: tool.running == 4)
        wait_until(lambda: store.run_info(RUN).invocations == len(call_ids))  # type: ignore[union-attr]

        together = threading.Barrier(2)
        returned: list[float] = []

        def close() -> None:
            together.wait(timeout=10)
            store.close(grace_s=0.2)
            returned.append(time.monotonic())

        closers = [threading.Thread(target=close) for _ in range(2)]
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join(RETURN_BOUND_S)
        assert not any(closer.is_alive() for closer in closers) and len(returned) == 2
        _, not_done = wait(futures, timeout=RETURN_BOUND_S)
        assert not not_done
        assert all(isinstance(future.result(), StoreClosed) for future in futures)

        # Nothing is left to wait for: a close that waited out its grace would take 60 s.
        again = time.monotonic()
        store.close(grace_s=60)
        boundary.close(grace_s=60)
        assert time.monotonic() - again < 30
    assert set(statuses(redis_url, namespace, call_ids).values()) == {
        (Status.ERROR, ErrorCode.CALLER_CANCELLED)
    }


def test_an_awaited_call_is_answered_when_the_store_closes(redis_url: str, namespace: str) -> None:
    """``ainvoke`` awaited from another thread's event loop gets StoreClosed when a close
    cuts its call (its record closed first), never an await that does not end."""
    tool = SlowTool()
    stores: list[SyncStore] = []
    with no_thread_left(), ThreadPoolExecutor(1) as awaiter, released(tool, stores):
        store = SyncStore.from_url(redis_url, namespace=namespace)
        stores.append(store)
        store.open_run(RUN, deadline=timedelta(minutes=5))
        boundary = SyncBoundary(store, {TOOL: tool.spec()}, max_tool_threads=1)

        async def awaited() -> AgentReply | BaseException:
            try:
                return await boundary.ainvoke(RunContext(RUN), envelope("call-awaited"))
            except StoreClosed as exc:
                return exc

        answer = awaiter.submit(asyncio.run, awaited())
        wait_until(lambda: tool.running == 1)
        store.close(grace_s=0.2)
        assert isinstance(answer.result(timeout=RETURN_BOUND_S), StoreClosed)
    assert statuses(redis_url, namespace, ["call-awaited"]) == {
        "call-awaited": (Status.ERROR, ErrorCode.CALLER_CANCELLED)
    }


def test_closing_one_boundary_cuts_only_its_own_calls(redis_url: str, namespace: str) -> None:
    """SyncBoundary.close gives its own calls the grace period, then cuts them (records
    ERROR, callers StoreClosed); another boundary of the same store keeps working."""
    tool = SlowTool()
    stores: list[SyncStore] = []
    with (
        no_thread_left(),
        ThreadPoolExecutor(4) as callers,
        released(tool, stores),
        SyncStore.from_url(redis_url, namespace=namespace) as store,
    ):
        stores.append(store)
        store.open_run(RUN, deadline=timedelta(minutes=5))
        closing = SyncBoundary(store, {TOOL: tool.spec()}, max_tool_threads=2)
        other = SyncBoundary(store, {TOOL: ToolSpec(executor=lambda a, c: a, projector=project)})
        futures = start_callers(callers, closing, ["cut-1", "cut-2", "cut-3"])
        wait_until(lambda: tool.running == 2)
        wait_until(lambda: store.run_info(RUN).invocations == 3)  # type: ignore[union-attr]

        closing.close(grace_s=0.2)
        _, not_done = wait(futures, timeout=RETURN_BOUND_S)
        assert not not_done
        assert all(isinstance(future.result(), StoreClosed) for future in futures)
        assert refused(lambda: closing.invoke(RunContext(RUN), envelope("cut-late")))
        assert outcome(other.invoke(RunContext(RUN), envelope("kept"))) == "READY"
        for call_id in ("cut-1", "cut-2", "cut-3"):
            record = store.get(RUN, call_id)
            assert record is not None
            assert (record.state.status, record.state.error_code) == (
                Status.ERROR,
                ErrorCode.CALLER_CANCELLED,
            )


def test_a_view_s_calls_are_its_boundary_s_to_close(redis_url: str, namespace: str) -> None:
    """Calls made through ``answering_duplicates`` belong to the boundary it was made from:
    closing that boundary cuts them too (records ERROR, callers StoreClosed), and the view
    refuses new calls; closing the view closes the boundary."""
    tool = SlowTool()
    stores: list[SyncStore] = []
    with (
        no_thread_left(),
        ThreadPoolExecutor(2) as callers,
        released(tool, stores),
        SyncStore.from_url(redis_url, namespace=namespace) as store,
    ):
        stores.append(store)
        store.open_run(RUN, deadline=timedelta(minutes=5))
        boundary = SyncBoundary(store, {TOOL: tool.spec()}, max_tool_threads=2)
        view = boundary.answering_duplicates("replay")
        assert view is not boundary and boundary.answering_duplicates("refuse") is boundary
        futures = start_callers(callers, view, ["view-1", "view-2"])
        wait_until(lambda: tool.running == 2)

        boundary.close(grace_s=0.2)
        _, not_done = wait(futures, timeout=RETURN_BOUND_S)
        assert not not_done
        assert all(isinstance(future.result(), StoreClosed) for future in futures)
        assert refused(lambda: view.invoke(RunContext(RUN), envelope("view-late")))
        for call_id in ("view-1", "view-2"):
            record = store.get(RUN, call_id)
            assert record is not None and record.state.status is Status.ERROR

        second = SyncBoundary(store, {TOOL: ToolSpec(executor=lambda a, c: a, projector=project)})
        second.answering_duplicates("replay").close()
        assert refused(lambda: second.invoke(RunContext(RUN), envelope("after-view-close")))


@pytest.mark.parametrize("grace_s", [-1, float("inf"), float("nan"), "5"])
def test_a_grace_period_must_be_finite_seconds(
    redis_url: str, namespace: str, grace_s: Any
) -> None:
    """close(grace_s=...) refuses a negative, infinite or non-number grace period and
    leaves the store open."""
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        with pytest.raises(InvalidArgument, match="grace_s"):
            store.close(grace_s=grace_s)
        assert store.run_info(RUN) is None
