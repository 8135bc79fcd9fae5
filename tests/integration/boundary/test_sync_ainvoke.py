"""``SyncBoundary.ainvoke`` and the adapters' call helpers: a call awaited from any event
loop runs on the boundary's own loop; a sync call needs a SyncBoundary.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import pytest

from canon.integrations._shared import invoke_awaiting, invoke_blocking
from eventstore import (
    Projection,
    RunContext,
    StoreClosed,
    SyncBoundary,
    SyncStore,
    ToolBoundary,
    ToolCall,
    ToolSpec,
)
from machine.codes import Status
from tests.support.calls import RUN, TOOL, envelope, outcome


def project(raw: Any, call: ToolCall) -> Projection:
    """The raw response as the result."""
    return Projection(result=raw, evidence_status="EVIDENCE_FOUND", scope="t")


async def test_ainvoke_runs_on_the_boundarys_loop_without_blocking_the_callers(
    redis_url: str, namespace: str
) -> None:
    """Awaited from the test's loop, the call runs on the store's loop thread, and the
    caller's loop stays free meanwhile (a second task runs while the tool waits)."""
    release = threading.Event()
    threads: list[str] = []

    async def wait_for_release(arguments: Any, call: ToolCall) -> Any:
        threads.append(threading.current_thread().name)
        await asyncio.to_thread(release.wait, 10)
        return {"ok": True}

    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        boundary = SyncBoundary(
            store, {TOOL: ToolSpec(executor=wait_for_release, projector=project)}
        )
        call = asyncio.ensure_future(boundary.ainvoke(RunContext(RUN), envelope("call_1")))
        await asyncio.sleep(0)  # the other task gets the loop: this loop is not blocked
        release.set()
        reply = await asyncio.wait_for(call, 10)
        assert outcome(reply) == "READY"
        assert threads == ["canon-sync-store"]


async def test_cancelling_the_awaiting_task_cancels_the_call(
    redis_url: str, namespace: str
) -> None:
    """The caller's cancellation reaches the call: the record is closed, never PROJECTING."""
    started = threading.Event()

    async def forever(arguments: Any, call: ToolCall) -> Any:
        started.set()
        await asyncio.Event().wait()

    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        boundary = SyncBoundary(store, {TOOL: ToolSpec(executor=forever, projector=project)})
        call = asyncio.ensure_future(boundary.ainvoke(RunContext(RUN), envelope("call_1")))
        await asyncio.to_thread(started.wait, 10)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        record = await asyncio.to_thread(store.get, RUN, "call_1")
        assert record is not None and record.state.status is Status.ERROR


async def test_a_closed_boundary_refuses_ainvoke(redis_url: str, namespace: str) -> None:
    """After close, ainvoke raises StoreClosed as invoke does."""
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        boundary = SyncBoundary(store, {})
    with pytest.raises(StoreClosed):
        await boundary.ainvoke(RunContext(RUN), envelope("call_1"))


async def test_the_adapters_helpers_pick_the_path_of_each_boundary(
    redis_url: str, namespace: str, make_open_store: Any
) -> None:
    """invoke_awaiting takes either boundary; invoke_blocking refuses an async one clearly."""
    spec = {
        TOOL: ToolSpec(executor=lambda arguments, call: {"q": arguments["q"]}, projector=project)
    }
    store = await make_open_store()
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    async_boundary = ToolBoundary(store, spec)
    reply = await invoke_awaiting(async_boundary, RunContext(RUN), envelope("call_a"))
    assert outcome(reply) == "READY"
    with pytest.raises(TypeError, match="SyncBoundary"):
        invoke_blocking(async_boundary, RunContext(RUN), envelope("call_b"))
    with SyncStore.from_url(redis_url, namespace=namespace) as sync_store:
        sync_boundary = SyncBoundary(sync_store, spec)
        reply = await invoke_awaiting(sync_boundary, RunContext(RUN), envelope("call_c"))
        assert outcome(reply) == "READY"
        reply = await asyncio.to_thread(
            invoke_blocking, sync_boundary, RunContext(RUN), envelope("call_d")
        )
        assert outcome(reply) == "READY"
