"""``SyncStore`` and ``SyncBoundary``: the store for threads, one background loop, closed clean."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
import redis
from redis.asyncio import Redis as AsyncRedis

from eventstore import (
    Projection,
    RunContext,
    StoreClosed,
    SyncBoundary,
    SyncStore,
    ToolCall,
    ToolSpec,
    WrongEventLoop,
)
from eventstore.erasure import RunNotFound
from eventstore.errors import InvalidArgument
from eventstore.server.durability import DurabilityError
from machine.codes import ErrorCode, Status
from tests.support.calls import RUN, TOOL, envelope, outcome

THREADS, CALLS = 16, 50


def search(arguments: Any, call: ToolCall) -> dict[str, Any]:
    """A plain executor: it runs in a worker thread."""
    return {"hits": [arguments["q"]], "thread": threading.current_thread().name}


def project(raw: Any, call: ToolCall) -> Projection:
    """A plain projector."""
    return Projection(result=raw["hits"], evidence_status="EVIDENCE_FOUND", scope="sync")


SPEC = ToolSpec(executor=search, projector=project)


def wait_until(condition: Callable[[], bool], timeout_s: float = 10) -> None:
    """Return once ``condition()`` holds; fail past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def test_sixteen_threads_share_one_boundary_with_exact_budgets(
    redis_url: str, namespace: str
) -> None:
    """16 threads x 50 calls at once through one SyncBoundary: every reply READY, the run
    budget spent exactly once per call, and the next call refused for the budget."""
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5), budget=THREADS * CALLS)
        boundary = SyncBoundary(store, {TOOL: SPEC}, max_tool_threads=4)
        start = threading.Barrier(THREADS)

        def caller(number: int) -> list[str]:
            start.wait(timeout=30)
            return [
                outcome(
                    boundary.invoke(
                        RunContext(RUN), envelope(f"call-{number}-{i}", arguments={"q": i})
                    )
                )
                for i in range(CALLS)
            ]

        with ThreadPoolExecutor(THREADS) as callers:
            outcomes = [o for replies in callers.map(caller, range(THREADS)) for o in replies]
        assert outcomes == ["READY"] * (THREADS * CALLS)
        info = store.run_info(RUN)
        assert info is not None and (info.used_total, info.invocations) == (800, 800)
        extra = boundary.invoke(RunContext(RUN), envelope("call-extra"))
        assert outcome(extra) == ErrorCode.RUN_BUDGET_EXHAUSTED.value
        record = store.get(RUN, "call-3-7")
        assert record is not None and record.state.status is Status.READY
        assert [type(stored.event).__name__ for stored in store.events(RUN, "call-3-7")] == [
            "Preflighted",
            "ProjectingStarted",
            "Completed",
        ]


def test_invoke_all_runs_one_turns_calls_together_in_their_order(
    redis_url: str, namespace: str
) -> None:
    """A model turn's calls run concurrently and come back in the order they were sent,
    a failing one in its place; a closed boundary refuses."""
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5), budget=10)
        boundary = SyncBoundary(store, {TOOL: SPEC}, max_tool_threads=4)
        calls = [envelope(f"turn-{i}", arguments={"q": i}) for i in range(4)]
        calls.insert(2, envelope("turn-unknown", tool="no_such_tool"))
        replies = boundary.invoke_all(RunContext(RUN), calls)
        assert [reply.tool_call_id for reply in replies] == [call.tool_call_id for call in calls]
        assert [outcome(reply) for reply in replies] == [
            "READY",
            "READY",
            ErrorCode.UNKNOWN_TOOL.value,
            "READY",
            "READY",
        ]
        assert [getattr(reply, "result", None) for reply in replies] == [[0], [1], None, [2], [3]]
        boundary.close()
        with pytest.raises(StoreClosed):
            boundary.invoke_all(RunContext(RUN), calls)


def client_count(admin: redis.Redis) -> int:
    """Connections the server has open, the admin's own included."""
    return len(admin.client_list())


def test_closing_leaves_no_thread_and_no_connection(start_server: Any, namespace: str) -> None:
    """After close, every thread the store started (its loop, the default executor, the
    boundaries' own tool threads) is gone, and the server counts no connection of it."""
    server = start_server()
    admin = redis.Redis.from_url(server.url)
    try:
        threads_before, clients_before = set(threading.enumerate()), client_count(admin)
        with SyncStore.from_url(server.url, namespace=namespace) as store:
            store.open_run(RUN, deadline=timedelta(minutes=5))
            own = SyncBoundary(store, {TOOL: SPEC}, max_tool_threads=2)
            shared = SyncBoundary(store, {TOOL: SPEC})  # the loop's default executor
            with ThreadPoolExecutor(8) as callers:
                replies = list(
                    callers.map(
                        lambda n: (own if n % 2 else shared).invoke(
                            RunContext(RUN), envelope(f"call-{n}")
                        ),
                        range(40),
                    )
                )
            assert {outcome(reply) for reply in replies} == {"READY"}
            assert client_count(admin) > clients_before
            assert len(set(threading.enumerate()) - threads_before) >= 3
        assert set(threading.enumerate()) - threads_before == set()
        # The server sees a closed socket on its next turn: wait for that, bounded.
        wait_until(lambda: client_count(admin) == clients_before)
        with pytest.raises(StoreClosed):
            store.get(RUN, "call-1")
        with pytest.raises(StoreClosed):
            own.invoke(RunContext(RUN), envelope("call-late"))
    finally:
        admin.close()


def test_a_boundary_runs_at_most_max_tool_threads_tools_at_once(
    redis_url: str, namespace: str
) -> None:
    """With max_tool_threads=3, six blocked calls run three at a time, on the boundary's
    own threads."""
    release = threading.Event()
    lock = threading.Lock()
    active: list[int] = [0, 0]  # running now, most at once
    names: set[str] = set()

    def blocking(arguments: Any, call: ToolCall) -> dict[str, Any]:
        with lock:
            active[0] += 1
            active[1] = max(active)
            names.add(threading.current_thread().name)
        release.wait(timeout=30)
        with lock:
            active[0] -= 1
        return {"hits": []}

    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        spec = ToolSpec(executor=blocking, projector=project)
        boundary = SyncBoundary(store, {TOOL: spec}, max_tool_threads=3)
        with ThreadPoolExecutor(6) as callers:
            futures = [
                callers.submit(boundary.invoke, RunContext(RUN), envelope(f"call-{n}"))
                for n in range(6)
            ]
            wait_until(lambda: store.run_info(RUN).invocations == 6)  # type: ignore[union-attr]
            wait_until(lambda: active[0] == 3)
            assert active == [3, 3]
            release.set()
            assert [outcome(future.result(timeout=30)) for future in futures] == ["READY"] * 6
    assert active[1] == 3
    assert len(names) == 3 and all(name.startswith("canon-tool") for name in names)


def test_a_projector_may_run_in_a_thread(redis_url: str, namespace: str) -> None:
    """projector_in_thread runs a plain projector off the loop thread; by default it runs
    on the loop, where calling the SyncStore back is refused instead of deadlocking."""
    seen: dict[str, Any] = {}

    def projector(store: SyncStore, key: str) -> Callable[[Any, ToolCall], Projection]:
        def run(raw: Any, call: ToolCall) -> Projection:
            seen[key] = threading.current_thread().name
            try:
                store.get(call.run_id, call.tool_call_id)
            except WrongEventLoop as exc:
                seen[f"{key}-error"] = str(exc)
                raise
            return Projection(result="ok", evidence_status="NO_EVIDENCE", scope="sync")

        return run

    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        tools = {
            "threaded": ToolSpec(
                executor=search, projector=projector(store, "threaded"), projector_in_thread=True
            ),
            "on-loop": ToolSpec(executor=search, projector=projector(store, "on-loop")),
        }
        boundary = SyncBoundary(store, tools)
        threaded = boundary.invoke(RunContext(RUN), envelope("c1", tool="threaded"))
        on_loop = boundary.invoke(RunContext(RUN), envelope("c2", tool="on-loop"))
    assert outcome(threaded) == "READY"
    assert outcome(on_loop) == ErrorCode.PROJECTION_FAILED.value
    assert seen["on-loop"] == "canon-sync-store" != seen["threaded"]
    assert "own event-loop thread" in seen["on-loop-error"]


def test_sync_store_methods_mirror_the_async_store(redis_url: str, namespace: str) -> None:
    """Runs, pause, token revocation and reads work through the sync facade."""
    with SyncStore.from_url(redis_url, namespace=namespace, ttl=timedelta(hours=1)) as store:
        opened = store.open_run(RUN, deadline=timedelta(minutes=5), budget=3)
        assert opened.run_id == RUN and store.limits.request_bytes > 0
        assert store.durability == "warn"
        assert not store.is_paused()
        store.set_paused(True)
        assert store.is_paused()
        store.set_paused(False)
        assert store.get(RUN, "missing") is None and store.events(RUN, "missing") == []
        assert store.revoke_token(RUN) is True
        assert store.close_run(RUN) is True
        info = store.run_info(RUN)
        assert info is not None and not info.active and info.budget_total == 3
        store.check_namespace()
        assert store.check_durability("off") is None


def test_a_sync_store_erases_a_run_as_the_async_store_does(redis_url: str, namespace: str) -> None:
    """erase_run through the sync facade deletes the run's payloads, keeps its events and
    tombstone, closes the run, and refuses a run Redis does not hold."""
    with (
        SyncStore.from_url(redis_url, namespace=namespace) as store,
        SyncBoundary(store, {TOOL: SPEC}) as boundary,
    ):
        store.open_run(RUN, deadline=timedelta(minutes=5))
        reply = boundary.invoke(RunContext(RUN), envelope("c1", arguments={"q": "secret"}))
        assert outcome(reply) == "READY"
        erasure = store.erase_run(RUN, by="dpo", reason="request 7")
        assert (erasure.run_id, erasure.by, erasure.reason, erasure.records) == (
            RUN,
            "dpo",
            "request 7",
            1,
        )
        record = store.get(RUN, "c1")
        assert record is not None and record.erased_at_ms is not None
        assert (record.request, record.raw, record.result) == (b"", None, None)
        assert record.state.status is Status.READY and len(store.events(RUN, "c1")) == 3
        info = store.run_info(RUN)
        assert info is not None and not info.active
        with pytest.raises(RunNotFound):
            store.erase_run("run-never-opened", by="dpo", reason="request 8")


def test_a_store_that_refuses_to_start_leaves_no_thread(start_server: Any, namespace: str) -> None:
    """Strict durability on a server without an append-only file: entering raises
    DurabilityError, and the loop thread is already gone."""
    server = start_server(appendonly=False)
    before = set(threading.enumerate())
    store = SyncStore.from_url(server.url, namespace=namespace, durability="strict")
    with pytest.raises(DurabilityError), store:
        pass
    assert set(threading.enumerate()) - before == set()
    with pytest.raises(StoreClosed):
        store.run_info(RUN)


@pytest.mark.parametrize("threads", [0, -1, True, 2.5])
def test_max_tool_threads_must_be_a_positive_whole_number(
    redis_url: str, namespace: str, threads: Any
) -> None:
    """A pool size below one (or not a whole number) is refused when the boundary is built."""
    with (
        SyncStore.from_url(redis_url, namespace=namespace) as store,
        pytest.raises(InvalidArgument, match="max_tool_threads"),
    ):
        SyncBoundary(store, {TOOL: SPEC}, max_tool_threads=threads)


def test_a_sync_store_takes_a_client_as_store_does(redis_url: str, namespace: str) -> None:
    """SyncStore(client, **options) builds the async store on its loop around that client."""
    client = AsyncRedis.from_url(redis_url)
    with SyncStore(client, namespace=namespace, shards=4) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        assert store.async_store.keys.shards == 4
        assert store.run_info(RUN) is not None
