"""A read-only call whose process died ends known: a retry of its id takes it over once the
lease lapsed (one record, one outcome, the takeover in its chain), a live process keeps its
call however long its tool runs, and what nobody retries is ended ABANDONED."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest

from eventstore import RunContext, Store, ToolBoundary, ToolError, ToolResult, ToolSpec
from eventstore.audit import replay_invocation
from eventstore.boundary.contracts import Projection, ToolCall
from machine.codes import ErrorCode, EvidenceStatus, Stage
from machine.ids import invocation_id
from machine.requests import canonical_request
from projections.receipts.inspection import inspect_invocation
from tests.support.calls import RUN, envelope, open_run
from tests.support.left_calls import server_ms, started_and_left, until_lapsed

pytestmark = pytest.mark.backends("single", "cluster")

LEASE = timedelta(milliseconds=300)
ARGUMENTS = {"q": "weather"}
REQUEST = canonical_request(ARGUMENTS, max_depth=32, max_text_bytes=1 << 20)


class Lookups:
    """A read-only tool that counts its runs; ``slow_s`` makes each run take that long."""

    def __init__(self, slow_s: float = 0.0) -> None:
        self.runs = 0
        self.slow_s = slow_s

    async def search(self, arguments: dict[str, Any], call: ToolCall) -> Any:
        self.runs += 1
        if self.slow_s:
            await asyncio.sleep(self.slow_s)
        return {"answer": arguments["q"], "run": self.runs}


def project(raw: Any, call: ToolCall) -> Projection:
    return Projection(result=raw, evidence_status=EvidenceStatus.EVIDENCE_FOUND, scope="web")


def boundary_of(store: Store, tool: Lookups, **options: Any) -> ToolBoundary:
    tools = {"search": ToolSpec(executor=tool.search, projector=project)}
    return ToolBoundary(store, tools, **options)


async def kinds(store: Store, call: str) -> list[str]:
    return [type(stored.event).__name__ for stored in await store.events(RUN, call)]


async def test_a_retry_takes_over_a_call_whose_process_died(make_store: Any) -> None:
    """While the dead process's lease lasts a retry answers in flight and runs nothing;
    once it lapsed, the retry takes the call over (TakenOver in its chain), runs the tool
    and answers its result: one record, READY, replaying intact, its receipt completed."""
    store: Store = make_store(lease=LEASE)
    await open_run(store)
    await started_and_left(store, RUN, "c1", "search", REQUEST)
    tool = Lookups()
    boundary = boundary_of(store, tool, on_duplicate="replay", replay_wait_s=0.05)
    early = await boundary.invoke(RunContext(RUN), envelope("c1", arguments=ARGUMENTS))
    assert isinstance(early, ToolError) and early.error_code is ErrorCode.DUPLICATE_TOOL_CALL
    assert early.invocation_id == invocation_id(RUN, "c1") and tool.runs == 0
    await until_lapsed(store, RUN, "c1")
    reply = await boundary.invoke(RunContext(RUN), envelope("c1", arguments=ARGUMENTS))
    assert isinstance(reply, ToolResult), reply
    assert reply.result == {"answer": "weather", "run": 1} and tool.runs == 1
    assert await kinds(store, "c1") == [
        "Preflighted",
        "TakenOver",
        "ProjectingStarted",
        "Completed",
    ]
    record = await store.get(RUN, "c1")
    assert record is not None and record.state.stage is Stage.READY and record.state.attempt == 2
    replay = await replay_invocation(store, RUN, "c1")
    assert replay is not None and replay.verdict.intact, replay.problems
    receipt = await inspect_invocation(store, RUN, invocation_id(RUN, "c1"))
    assert receipt.journal_state.value == "completed"
    again = await boundary.invoke(RunContext(RUN), envelope("c1", arguments=ARGUMENTS))
    assert again == reply and tool.runs == 1  # answered from the record now


async def test_a_call_left_after_its_raw_response_is_run_again_by_its_retry(
    make_store: Any,
) -> None:
    """A process that died in the projector left the raw response: the retry runs the
    read-only tool again and records the new response over it."""
    store: Store = make_store(lease=LEASE)
    await open_run(store)
    await started_and_left(store, RUN, "c1", "search", REQUEST, raw=b'{"stale":1}')
    tool = Lookups()
    boundary = boundary_of(store, tool, on_duplicate="replay", replay_wait_s=5)
    await until_lapsed(store, RUN, "c1")
    started = time.monotonic()
    reply = await boundary.invoke(RunContext(RUN), envelope("c1", arguments=ARGUMENTS))
    assert time.monotonic() - started < 4, "a lapsed call is taken over, not waited for"
    assert isinstance(reply, ToolResult) and tool.runs == 1
    record = await store.get(RUN, "c1")
    assert record is not None and record.raw == b'{"answer":"weather","run":1}'


async def test_a_live_process_keeps_its_call_while_its_tool_runs(make_store: Any) -> None:
    """A tool running for four leases keeps its call (its lease is renewed): a retry
    meanwhile answers in flight and never takes it over; the tool runs once."""
    store: Store = make_store(lease=LEASE)
    await open_run(store)
    tool = Lookups(slow_s=1.2)
    boundary = boundary_of(store, tool, on_duplicate="replay", replay_wait_s=0.05)
    first = asyncio.create_task(
        boundary.invoke(RunContext(RUN), envelope("c1", arguments=ARGUMENTS))
    )
    key = store.keys.record(RUN, "c1")
    leases: set[int] = set()
    while not first.done():
        until = await store.client.hget(key, "lease_until_ms")
        if until is not None:
            leases.add(int(until))
            assert int(until) > await server_ms(store) or first.done()
            retry = await boundary.invoke(RunContext(RUN), envelope("c1", arguments=ARGUMENTS))
            assert isinstance(retry, ToolError | ToolResult)
            if isinstance(retry, ToolError):
                assert retry.error_code is ErrorCode.DUPLICATE_TOOL_CALL
        await asyncio.sleep(0.1)
    assert isinstance(first.result(), ToolResult)
    assert tool.runs == 1 and len(leases) >= 3, "the lease was renewed while the tool ran"
    assert "TakenOver" not in await kinds(store, "c1")


async def test_in_refuse_mode_a_retry_is_refused_and_the_sweep_ends_the_call(
    make_store: Any,
) -> None:
    """Without replay a retry stays DUPLICATE_TOOL_CALL (the default's rule); a reconcile
    ends the call nobody took over ERROR ABANDONED, settled by the sweep, in its chain."""
    store: Store = make_store(lease=LEASE)
    await open_run(store)
    await started_and_left(store, RUN, "c1", "search", REQUEST)
    tool = Lookups()
    boundary = boundary_of(store, tool)
    await until_lapsed(store, RUN, "c1")
    retry = await boundary.invoke(RunContext(RUN), envelope("c1", arguments=ARGUMENTS))
    assert isinstance(retry, ToolError) and retry.error_code is ErrorCode.DUPLICATE_TOOL_CALL
    report = await boundary.reconcile(RUN, grace=timedelta(0))
    assert [(call.tool_call_id, call.outcome) for call in report.calls] == [("c1", "abandoned")]
    record = await store.get(RUN, "c1")
    assert record is not None
    assert (record.state.error_code, record.state.settled_by) == (ErrorCode.ABANDONED, "sweep")
    assert await kinds(store, "c1") == ["Preflighted", "Settled"]
    assert tool.runs == 0


async def test_the_sweep_waits_for_the_grace_and_never_ends_a_live_call(make_store: Any) -> None:
    """A lapsed call within the grace, and a call whose lease is held, are not ended."""
    store: Store = make_store(lease=LEASE)
    await open_run(store)
    await started_and_left(store, RUN, "c1", "search", REQUEST)
    boundary = boundary_of(store, Lookups())
    assert (await boundary.reconcile(RUN, grace=timedelta(0))).calls == []  # lease held
    await until_lapsed(store, RUN, "c1")
    assert (await boundary.reconcile(RUN, grace=timedelta(minutes=5))).calls == []
    record = await store.get(RUN, "c1")
    assert record is not None and record.state.stage is Stage.EXECUTING
