"""An attempted governed call (its process died after the permit) ends known: its tool's
reconcile hook answers executed (the raw response projected), not executed (ended, never
run again), unknown, raises or times out (left); a recorded raw response is projected with
no hook; an operator settles the rest; every settlement is in the call's chain, replays
intact and is what its receipt and its resume say; one settlement wins."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from eventstore import (
    Reconciliation,
    RunContext,
    Store,
    ToolBoundary,
    ToolError,
    ToolResult,
    ToolSpec,
)
from eventstore.audit import replay_invocation
from eventstore.boundary.contracts import Projection, ToolCall
from eventstore.errors import InvalidArgument
from eventstore.settlements import (
    CallStillRunning,
    NotInFlight,
    NotSettledNotExecuted,
    RawResponseRecorded,
)
from machine.codes import ErrorCode, EvidenceStatus, Stage
from machine.ids import invocation_id
from projections.receipts.inspection import inspect_invocation
from tests.support.calls import RUN, envelope, open_run
from tests.support.left_calls import dispatched_and_left, until_lapsed

pytestmark = pytest.mark.backends("single", "cluster")

LEASE = timedelta(milliseconds=300)
ORDER = {"amount": 125, "to": "acct-9"}
NOW = timedelta(0)


class Bank:
    """A side-effecting refund tool and the hook that asks the bank what it did."""

    def __init__(self, answer: Any = None, *, hook_sleeps_s: float = 0.0) -> None:
        self.refunds: list[dict[str, Any]] = []
        self.answer = answer
        self.asked: list[tuple[dict[str, Any], str]] = []
        self.hook_sleeps_s = hook_sleeps_s

    async def refund(self, arguments: dict[str, Any], call: ToolCall) -> Any:
        self.refunds.append(arguments)
        return {"refunded": arguments["amount"]}

    async def look_up(self, arguments: dict[str, Any], call: ToolCall) -> Reconciliation:
        self.asked.append((arguments, call.invocation_id))
        if self.hook_sleeps_s:
            await asyncio.sleep(self.hook_sleeps_s)
        if isinstance(self.answer, Exception):
            raise self.answer
        assert isinstance(self.answer, Reconciliation)
        return self.answer


def project(raw: Any, call: ToolCall) -> Projection:
    return Projection(result=raw, evidence_status=EvidenceStatus.EVIDENCE_FOUND, scope="bank")


def boundary_of_tools(bank: Bank, *, hook: bool = True, **spec: Any) -> dict[str, ToolSpec]:
    return {
        "refund": ToolSpec(
            executor=bank.refund,
            projector=project,
            read_only=False,
            approval=True,
            reconcile=bank.look_up if hook else None,
            **spec,
        )
    }


def boundary_of(store: Store, bank: Bank, *, hook: bool = True, **spec: Any) -> ToolBoundary:
    tools = boundary_of_tools(bank, hook=hook, **spec)
    return ToolBoundary(store, tools, on_duplicate="replay", replay_wait_s=0.05)


async def attempted(make_store: Any, bank: Bank, *, raw: bytes | None = None, **spec: Any) -> Any:
    store: Store = make_store(lease=LEASE)
    await open_run(store)
    boundary = boundary_of(store, bank, **spec)
    await dispatched_and_left(boundary, RUN, "pay-1", "refund", ORDER, raw=raw)
    await until_lapsed(store, RUN, "pay-1")
    return store, boundary


async def kinds(store: Store, call: str = "pay-1") -> list[str]:
    return [type(stored.event).__name__ for stored in await store.events(RUN, call)]


async def intact(store: Store, call: str = "pay-1") -> None:
    replay = await replay_invocation(store, RUN, call)
    assert replay is not None and replay.verdict.intact, replay.problems


async def test_a_hook_that_finds_the_call_ran_has_its_raw_response_projected(
    make_store: Any,
) -> None:
    """Executed: Reconciled (by the hook, its evidence's digest) then the raw response
    recorded and projected: READY with the bank's answer; the tool never ran again; the
    receipt moves from uncertain to completed and says how it was settled; a resume
    answers the result."""
    bank = Bank(Reconciliation.executed({"refunded": 125}, evidence="bank refund rf_88"))
    store, boundary = await attempted(make_store, bank)
    receipt = await inspect_invocation(store, RUN, invocation_id(RUN, "pay-1"))
    assert receipt.dispatch_state.value == "attempted"
    report = await boundary.reconcile(RUN, grace=NOW)
    assert [(c.outcome, c.status) for c in report.calls] == [("executed", "READY")]
    assert bank.asked == [(ORDER, invocation_id(RUN, "pay-1"))] and bank.refunds == []
    assert await kinds(store) == [
        "ApprovalRequested",
        "Approved",
        "Dispatched",
        "Reconciled",
        "ProjectingStarted",
        "Completed",
    ]
    record = await store.get(RUN, "pay-1")
    assert record is not None and record.state.stage is Stage.READY
    assert record.state.settled_by == "hook:refund"
    await intact(store)
    receipt = await inspect_invocation(store, RUN, invocation_id(RUN, "pay-1"))
    assert receipt.journal_state.value == "completed"
    assert receipt.settlement is not None and receipt.settlement.settled_by == "hook:refund"
    assert receipt.settlement.outcome == "executed"
    resumed = await boundary.resume(RunContext(RUN), "pay-1")
    assert isinstance(resumed, ToolResult) and resumed.result == {"refunded": 125}


async def test_a_hook_that_finds_the_call_did_not_run_ends_it_for_good(make_store: Any) -> None:
    """Not executed: ERROR RECONCILED_NOT_EXECUTED (Settled, by the hook); a resume and a
    re-entry answer that code and nothing runs; an operator may request it again as a new
    linked call that waits for its own approval and runs once when resumed."""
    bank = Bank(Reconciliation.not_executed(evidence="no refund under this key"))
    store, boundary = await attempted(make_store, bank)
    report = await boundary.reconcile(grace=NOW)  # across the latest runs
    assert [(c.tool_call_id, c.outcome) for c in report.calls] == [("pay-1", "not_executed")]
    assert await kinds(store) == ["ApprovalRequested", "Approved", "Dispatched", "Settled"]
    await intact(store)
    for reply in (
        await boundary.resume(RunContext(RUN), "pay-1"),
        await boundary.invoke(RunContext(RUN), envelope("pay-1", tool="refund", arguments=ORDER)),
    ):
        assert isinstance(reply, ToolError)
        assert reply.error_code is ErrorCode.RECONCILED_NOT_EXECUTED
    assert bank.refunds == []
    again = await store.settlements.request_again(RUN, "pay-1", by="ops")
    assert again.requested_again == "pay-1.again1" and again.made_now
    twice = await store.settlements.request_again(RUN, "pay-1", by="ops")
    assert twice.requested_again == "pay-1.again1" and not twice.made_now
    record = await store.get(RUN, "pay-1.again1")
    assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL
    assert (record.state.retry_of, record.state.retried_by) == ("pay-1", "ops")
    assert record.request == (await store.get(RUN, "pay-1")).request  # type: ignore[union-attr]
    await store.decide(RUN, "pay-1.again1", approve=True, by="bo", reason="re-run")
    ran = await boundary.resume(RunContext(RUN), "pay-1.again1")
    assert isinstance(ran, ToolResult) and bank.refunds == [ORDER]


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [
        (Reconciliation.unknown(evidence="the bank is down"), "unknown"),
        (RuntimeError("no route to the bank"), "hook_failed"),
        ("not a reconciliation", "hook_failed"),
    ],
)
async def test_a_hook_that_cannot_tell_leaves_the_call_attempted(
    make_store: Any, answer: Any, outcome: str
) -> None:
    """Unknown, a hook that raises, or a hook answering anything else: the call stays
    attempted (in flight, nothing written), listed as left for a later reconcile."""
    store, boundary = await attempted(make_store, Bank(answer))
    report = await boundary.reconcile(RUN, grace=NOW)
    assert [c.outcome for c in report.calls] == [outcome]
    assert [c.tool_call_id for c in report.left] == ["pay-1"]
    assert await kinds(store) == ["ApprovalRequested", "Approved", "Dispatched"]


async def test_a_hook_that_times_out_leaves_the_call_attempted(make_store: Any) -> None:
    """A hook past its reconcile_timeout_s is given up on: the call stays attempted."""
    bank = Bank(Reconciliation.not_executed(evidence="x"), hook_sleeps_s=5)
    store, boundary = await attempted(make_store, bank, reconcile_timeout_s=0.2)
    report = await boundary.reconcile(RUN, grace=NOW)
    assert [c.outcome for c in report.calls] == ["hook_timed_out"]
    assert await kinds(store) == ["ApprovalRequested", "Approved", "Dispatched"]


async def test_a_recorded_raw_response_is_projected_without_a_hook(make_store: Any) -> None:
    """A process that died in the projector left the raw response: the journal proves the
    call ran, so a reconcile projects it (Reconciled by journal) with no hook asked."""
    bank = Bank(None)
    store, boundary = await attempted(make_store, bank, raw=b'{"refunded":125}', hook=False)
    report = await boundary.reconcile(RUN, grace=NOW)
    assert [(c.outcome, c.status) for c in report.calls] == [("executed", "READY")]
    record = await store.get(RUN, "pay-1")
    assert record is not None and record.state.settled_by == "journal"
    assert record.result == b'{"refunded":125}' and bank.refunds == [] and bank.asked == []
    await intact(store)


async def test_an_operator_settles_a_call_no_hook_can(make_store: Any) -> None:
    """Without a hook the call is left needing an operator; the operator's settlement is
    recorded as them, with the evidence's digest; a second one is told the first."""
    store, boundary = await attempted(make_store, Bank(None), hook=False)
    report = await boundary.reconcile(RUN, grace=NOW)
    assert [c.outcome for c in report.calls] == ["needs_operator"]
    done = await store.settle(RUN, "pay-1", executed=True, by="ana", evidence="bank: rf_88 paid")
    assert (done.settled_as, done.settled_by, done.made_now) == ("executed", "ana", True)
    assert done.error_code == ErrorCode.RECONCILED_EXECUTED.value
    again = await store.settle(RUN, "pay-1", executed=False, by="bo", evidence="no")
    assert (again.settled_as, again.settled_by, again.made_now) == ("executed", "ana", False)
    record = await store.get(RUN, "pay-1")
    assert record is not None and record.state.settled_by == "ana"
    stored = await store.client.hget(store.keys.record(RUN, "pay-1"), "settlement_evidence")
    assert stored == b"bank: rf_88 paid"
    await intact(store)
    with pytest.raises(NotSettledNotExecuted):
        await store.settlements.request_again(RUN, "pay-1", by="ops")


async def test_a_settlement_is_refused_while_the_call_runs_or_says_otherwise(
    make_store: Any,
) -> None:
    """A call whose lease is held is still running; a recorded raw response cannot be
    settled as not executed; a call not in flight, or bad evidence, is refused: nothing
    is written."""
    store: Store = make_store(lease=timedelta(minutes=5))
    await open_run(store)
    boundary = boundary_of(store, Bank(None))
    await dispatched_and_left(boundary, RUN, "pay-1", "refund", ORDER, raw=b"{}")
    with pytest.raises(CallStillRunning):
        await store.settle(RUN, "pay-1", executed=True, by="ana", evidence="paid")
    store2: Store = make_store(lease=LEASE, namespace=store.keys.namespace)
    with pytest.raises(RawResponseRecorded):
        await store2.settle(RUN, "pay-1", executed=False, by="ana", evidence="none")
    with pytest.raises(NotInFlight):
        await store.settle(RUN, "nope", executed=True, by="ana", evidence="x")
    with pytest.raises(InvalidArgument):
        await store.settle(RUN, "pay-1", executed=True, by="ana", evidence="two\nlines")
    assert await kinds(store) == [
        "ApprovalRequested",
        "Approved",
        "Dispatched",
        "ProjectingStarted",
    ]


async def test_concurrent_settlements_and_reconciles_record_one_outcome(make_store: Any) -> None:
    """Five reconciles and five operators at once: one settlement is in the chain, the
    others are told (settled elsewhere, or the first settlement)."""
    bank = Bank(Reconciliation.not_executed(evidence="no refund"))
    store, boundary = await attempted(make_store, bank)

    async def operator(n: int) -> Any:
        return await store.settle(RUN, "pay-1", executed=True, by=f"op{n}", evidence="paid")

    results = await asyncio.gather(
        *(boundary.reconcile(RUN, grace=NOW) for _ in range(5)),
        *(operator(n) for n in range(5)),
        return_exceptions=True,
    )
    assert not [r for r in results if isinstance(r, BaseException)], results
    kinds_now = await kinds(store)
    assert kinds_now.count("Settled") == 1 and "Reconciled" not in kinds_now
    record = await store.get(RUN, "pay-1")
    assert record is not None and record.state.stage is Stage.ERROR
    made = [r for r in results[5:] if r.made_now]  # type: ignore[union-attr]
    settled_by_hook = [c for r in results[:5] for c in r.calls if c.outcome == "not_executed"]  # type: ignore[union-attr]
    assert len(made) + len(settled_by_hook) == 1
    await intact(store)


async def test_a_reconcile_hook_is_checked_when_the_boundary_is_built(make_store: Any) -> None:
    """A hook on a read-only tool, a hook that is not callable, or a bad time limit is an
    InvalidArgument naming the tool."""
    store: Store = make_store()
    bank = Bank(None)
    for spec in (
        {"read_only": True, "reconcile": bank.look_up},
        {"read_only": False, "approval": True, "reconcile": "look up"},
        {"read_only": False, "approval": True, "reconcile": bank.look_up, "reconcile_timeout_s": 0},
    ):
        with pytest.raises(InvalidArgument, match="refund"):
            ToolBoundary(
                store, {"refund": ToolSpec(executor=bank.refund, projector=project, **spec)}
            )


def test_the_sync_facade_settles_and_reconciles(redis_url: str, namespace: str) -> None:
    """SyncStore.settle and SyncBoundary.reconcile do from plain threads what the store
    and the boundary do."""
    from eventstore import SyncBoundary, SyncStore

    bank = Bank(Reconciliation.not_executed(evidence="no refund"))
    with SyncStore.from_url(redis_url, namespace=namespace, lease=LEASE) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        boundary = SyncBoundary(store, boundary_of_tools(bank))
        # The process that "died": the same tools on the store's own loop.
        dead = ToolBoundary(store.async_store, boundary_of_tools(bank))
        for call in ("pay-1", "pay-2"):
            store.call(dispatched_and_left(dead, RUN, call, "refund", ORDER))
        for call in ("pay-1", "pay-2"):
            store.call(until_lapsed(store.async_store, RUN, call))
        done = store.settle(RUN, "pay-1", executed=True, by="ana", evidence="paid")
        assert done.made_now and done.settled_as == "executed"
        report = boundary.reconcile(RUN, grace=NOW)
        assert [(c.tool_call_id, c.outcome) for c in report.calls] == [("pay-2", "not_executed")]
        boundary.close()
