"""A governed call's life in the store: recorded frozen and waiting, decided once by an
operator (the first decision wins), dispatched once by the one permit the scripts grant,
never while its run or the namespace is paused or past its approval's expiry; the journal
replays intact and every key keeps its expiry."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import msgspec
import pytest

from eventstore.audit import replay_invocation
from eventstore.audit.run_index import RunFilter, list_runs
from eventstore.audit.waiting import pending_approvals
from eventstore.decisions import NotAwaitingApproval, new_approval_id
from eventstore.errors import InvalidArgument, Refused
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.codes import ErrorCode, EvidenceStatus, Stage, Status
from machine.events import payload_digest
from machine.ids import invocation_id
from projections.receipts.builder import encode_receipt
from projections.receipts.inspection import inspect_invocation
from tests.support.permits import take_permit
from tests.support.waiting import wait_for

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-gov"
REQUEST = b'{"amount":125,"to":"acct-9"}'


async def waiting(store: Store, call: str = "c1", *, expires_in_ms: int = 3_600_000) -> Any:
    """Open the run (once) and record ``call`` as a governed call awaiting approval."""
    if await store.run_info(RUN) is None:
        await store.open_run(RUN, deadline=timedelta(minutes=10))
    return await store.writer.request_approval(
        RUN,
        call,
        "refund",
        REQUEST,
        approval_id=new_approval_id(),
        approval_expires_at_ms=now_ms() + expires_in_ms,
        requested_by="agent",
    )


async def state(store: Store, call: str = "c1") -> Any:
    record = await store.reader.get(RUN, call)
    assert record is not None
    return record


async def test_a_governed_call_is_recorded_frozen_and_waits(make_store: Any, redis: Any) -> None:
    """ApprovalRequested creates the record with the complete request, stage
    AWAITING_APPROVAL, public status PROJECTING, the approval's id and expiry; the tool's
    budget is spent once; record and stream carry the record's expiry."""
    store: Store = make_store(shards=2)
    head = await waiting(store)
    record = await state(store)
    assert record.state.stage is Stage.AWAITING_APPROVAL
    assert record.state.status is Status.PROJECTING
    assert record.request == REQUEST
    assert record.state.request_sha256 == payload_digest(REQUEST)
    assert record.state.approval_id is not None and len(record.state.approval_id) == 32
    assert record.state.approval_expires_at_ms is not None
    assert record.state.approval_expires_at_ms <= record.expires_at_ms
    info = await store.run_info(RUN)
    assert info is not None and info.used == {"refund": 1}
    for key in (store.keys.record(RUN, "c1"), store.keys.stream(RUN, "c1")):
        assert await redis.pttl(key) > 0
    assert head.version == 1
    with pytest.raises(Refused) as again:
        await waiting(store)
    assert again.value.code == "DUPLICATE_TOOL_CALL"


async def test_approval_then_one_permit_then_the_usual_lifecycle(make_store: Any) -> None:
    """Approved, Dispatched (the permit, with the request's digest), ProjectingStarted,
    Completed: READY with the approver and reason kept; the journal replays intact."""
    store: Store = make_store(shards=2)
    await waiting(store)
    decision = await store.decide(RUN, "c1", approve=True, by="ops@example", reason="refund ok")
    assert (decision.outcome, decision.made_now, decision.decided_by) == (
        "approved",
        True,
        "ops@example",
    )
    record = await state(store)
    assert record.state.stage is Stage.APPROVED and record.state.decision_reason == "refund ok"
    permit = await take_permit(store, record.state, record.expires_at_ms)
    assert permit.head is not None and permit.stage is Stage.EXECUTING
    head = await store.writer.start_projecting(permit.head, b'{"refunded":125}')
    await store.writer.complete(head, b'{"ok":true}', EvidenceStatus.EVIDENCE_FOUND, "refunds")
    record = await state(store)
    assert record.state.status is Status.READY
    assert record.state.dispatched_request_sha256 == payload_digest(REQUEST)
    replay = await replay_invocation(store, RUN, "c1")
    assert replay is not None and replay.verdict.intact, replay.problems
    kinds = [step.event_type for step in replay.timeline]
    assert kinds == [
        "ApprovalRequested",
        "Approved",
        "Dispatched",
        "ProjectingStarted",
        "Completed",
    ]


async def test_the_first_decision_wins_and_later_ones_are_told_what_was_decided(
    make_store: Any,
) -> None:
    """Ten concurrent decisions, half approving, half denying: one is recorded (made_now),
    every other answer names that same outcome and approver."""
    store: Store = make_store(shards=2)
    await waiting(store)
    answers = await asyncio.gather(
        *(
            store.decide(RUN, "c1", approve=n % 2 == 0, by=f"op-{n}", reason="looked at it")
            for n in range(10)
        )
    )
    made = [answer for answer in answers if answer.made_now]
    assert len(made) == 1
    (first,) = made
    assert {(a.outcome, a.decided_by, a.decision_id) for a in answers} == {
        (first.outcome, first.decided_by, first.decision_id)
    }
    record = await state(store)
    assert record.state.version == 2  # one decision event, never two


async def test_a_denied_call_ends_error_and_gets_no_permit(make_store: Any) -> None:
    """Denied: ERROR APPROVAL_DENIED with approver and reason; no permit, ever."""
    store: Store = make_store(shards=2)
    await waiting(store)
    decision = await store.decide(RUN, "c1", approve=False, by="ops", reason="wrong account")
    assert decision.outcome == "denied"
    record = await state(store)
    assert record.state.status is Status.ERROR
    assert record.state.error_code is ErrorCode.APPROVAL_DENIED
    permit = await take_permit(store, record.state, record.expires_at_ms)
    assert permit.head is None and permit.code is ErrorCode.APPROVAL_DENIED
    later = await store.decide(RUN, "c1", approve=True, by="other", reason="changed my mind")
    assert (later.outcome, later.made_now, later.decided_by) == ("denied", False, "ops")


async def test_many_resumers_one_permit(make_store: Any) -> None:
    """Twenty concurrent permit requests for one approved call: exactly one gets a head."""
    store: Store = make_store(shards=2)
    await waiting(store)
    await store.decide(RUN, "c1", approve=True, by="ops", reason="ok")
    record = await state(store)
    permits = await asyncio.gather(
        *(take_permit(store, record.state, record.expires_at_ms) for _ in range(20))
    )
    assert sum(permit.head is not None for permit in permits) == 1
    assert {permit.stage for permit in permits if permit.head is None} == {Stage.EXECUTING}


async def test_a_pause_blocks_new_calls_and_permits_and_nothing_else(
    make_store: Any,
) -> None:
    """A paused run records no new call (RUN_PAUSED) and grants no permit, but decisions
    still land; the namespace pause blocks the permit too (EXECUTION_PAUSED). Unpaused, the
    permit is granted. Who paused, when and why are on the run."""
    store: Store = make_store(shards=2)
    await waiting(store)
    assert await store.pause_run(RUN, by="ops", reason="incident 42")
    info = await store.run_info(RUN)
    assert info is not None and info.paused
    with pytest.raises(Refused) as refused:
        await waiting(store, "c2")
    assert refused.value.code == "RUN_PAUSED"
    decision = await store.decide(RUN, "c1", approve=True, by="ops", reason="ok")
    assert decision.made_now
    record = await state(store)
    permit = await take_permit(store, record.state, record.expires_at_ms)
    assert (permit.head, permit.stage, permit.code) == (None, Stage.APPROVED, ErrorCode.RUN_PAUSED)
    assert await store.unpause_run(RUN, by="ops", reason="resolved")
    await store.set_paused(True)
    permit = await take_permit(store, record.state, record.expires_at_ms)
    assert permit.code is ErrorCode.EXECUTION_PAUSED
    await store.set_paused(False)
    permit = await take_permit(store, record.state, record.expires_at_ms)
    assert permit.head is not None
    fields = await store.client.hgetall(store.keys.run(RUN))
    assert fields[b"paused_by"] == b"ops" and fields[b"paused_reason"] == b"incident 42"
    assert fields[b"unpaused_reason"] == b"resolved" and fields[b"paused"] == b"0"
    assert not await store.pause_run("run-nope", by="ops", reason="x")


async def test_an_expired_approval_is_recorded_and_never_dispatched(make_store: Any) -> None:
    """Past its expiry (by the server's clock) a decision records the expiry (ERROR
    APPROVAL_EXPIRED) instead; an approved call past it gets no permit."""
    store: Store = make_store(shards=2)
    await waiting(store, "late", expires_in_ms=150)
    await waiting(store, "approved-late", expires_in_ms=400)
    await store.decide(RUN, "approved-late", approve=True, by="ops", reason="ok")
    due = (await state(store, "approved-late")).state.approval_expires_at_ms
    await wait_for(lambda: now_ms() > due + 20, 5)
    decision = await store.decide(RUN, "late", approve=True, by="ops", reason="too late")
    assert (decision.outcome, decision.made_now) == ("expired", False)
    late = await state(store, "late")
    assert late.state.error_code is ErrorCode.APPROVAL_EXPIRED
    record = await state(store, "approved-late")
    permit = await take_permit(store, record.state, record.expires_at_ms)
    assert permit.head is None and permit.code is ErrorCode.APPROVAL_EXPIRED
    assert (await state(store, "approved-late")).state.error_code is ErrorCode.APPROVAL_EXPIRED
    assert not await store.decisions.expire(RUN, "late")  # already recorded


async def test_decisions_need_a_governed_call_and_a_real_approver(make_store: Any) -> None:
    """No such call, a read-only call, an empty or oversized approver or reason: clear
    errors, nothing written."""
    store: Store = make_store(shards=2)
    await waiting(store)
    await store.writer.create(RUN, "plain", "search", b"{}")
    with pytest.raises(NotAwaitingApproval):
        await store.decide(RUN, "nope", approve=True, by="ops", reason="x")
    with pytest.raises(NotAwaitingApproval):
        await store.decide(RUN, "plain", approve=True, by="ops", reason="x")
    for by, reason in (("", "x"), ("ops", ""), ("o\x00ps", "x"), ("ops", "r" * 1001)):
        with pytest.raises(InvalidArgument):
            await store.decide(RUN, "c1", approve=True, by=by, reason=reason)
    assert (await state(store)).state.stage is Stage.AWAITING_APPROVAL


async def receipt_of(store: Store, call: str) -> dict[str, Any]:
    """The receipt the receipt API would answer for ``call`` (read-only)."""
    found = await inspect_invocation(store, RUN, invocation_id(RUN, call))
    document: dict[str, Any] = msgspec.json.decode(encode_receipt(found))
    return document


async def test_receipts_tell_whether_a_governed_call_was_dispatched(make_store: Any) -> None:
    """Pending and approved-not-resumed: not_dispatched, journal absent, the awaiting
    result with its approval id, the approval pending then approved (approved is not
    succeeded). From the permit on: attempted. Denied: denied, not dispatched, the denial
    as its error. A call that needed no approval says none, without an id. Reading never
    changes the record."""
    store: Store = make_store(shards=2)
    await waiting(store, "ok")
    await waiting(store, "no")
    await store.writer.create(RUN, "plain", "search", b"{}")
    pending = await receipt_of(store, "ok")
    approval_id = (await state(store, "ok")).state.approval_id
    assert pending["approval"] == {"status": "pending", "approval_id": approval_id}
    assert (pending["dispatch_state"], pending["journal_state"]) == ("not_dispatched", "absent")
    assert pending["result"]["state"] == "awaiting_approval"
    assert pending["result"]["approval_id"] == approval_id
    await store.decide(RUN, "ok", approve=True, by="ops", reason="fine")
    before = await store.client.hgetall(store.keys.record(RUN, "ok"))
    approved = await receipt_of(store, "ok")
    assert approved["approval"]["status"] == "approved"
    assert (approved["dispatch_state"], approved["result"]["state"]) == (
        "not_dispatched",
        "awaiting_approval",
    )
    assert await store.client.hgetall(store.keys.record(RUN, "ok")) == before
    record = await state(store, "ok")
    permit = await take_permit(store, record.state, record.expires_at_ms)
    assert permit.head is not None
    running = await receipt_of(store, "ok")
    assert (running["dispatch_state"], running["journal_state"]) == ("attempted", "dispatching")
    head = await store.writer.start_projecting(permit.head, b"{}")
    await store.writer.complete(head, b'{"done":1}', EvidenceStatus.EVIDENCE_FOUND, "s")
    done = await receipt_of(store, "ok")
    assert (done["dispatch_state"], done["approval"]["status"]) == ("attempted", "approved")
    assert done["result"]["state"] == "ready"
    await store.decide(RUN, "no", approve=False, by="ops", reason="no")
    denied = await receipt_of(store, "no")
    assert denied["approval"]["status"] == "denied"
    assert denied["dispatch_state"] == "not_dispatched"
    assert denied["result"]["error_code"] == "APPROVAL_DENIED"
    plain = await receipt_of(store, "plain")
    assert plain["approval"] == {"status": "none"}


async def test_calls_waiting_across_runs_are_found_from_the_runs_counts(
    make_store: Any,
) -> None:
    """Each run counts its calls waiting for a decision (in, when requested; out, when
    decided or expired); the runs filter keeps the runs with some, and the listing across
    runs gives exactly the waiting calls, oldest first."""
    store: Store = make_store(shards=2)
    await waiting(store, "a")
    await waiting(store, "b")
    await waiting(store, "c")
    await store.open_run("run-other", deadline=timedelta(minutes=10))
    await store.writer.request_approval(
        "run-other",
        "x",
        "refund",
        REQUEST,
        approval_id=new_approval_id(),
        approval_expires_at_ms=now_ms() + 60_000,
        requested_by="agent",
    )
    await store.decide(RUN, "b", approve=True, by="ops", reason="ok")
    await store.decide(RUN, "c", approve=False, by="ops", reason="no")
    info = await store.run_info(RUN)
    assert info is not None and info.awaiting_approval == 1
    listed = await list_runs(store, where=RunFilter(status="awaiting_approval"))
    assert {run.run_id: run.awaiting_approval for run in listed.runs} == {
        RUN: 1,
        "run-other": 1,
    }
    found = await pending_approvals(store)
    assert [(item.run_id, item.call.tool_call_id) for item in found.calls] == [
        (RUN, "a"),
        ("run-other", "x"),
    ]
    assert found.complete
    await store.decide(RUN, "a", approve=True, by="ops", reason="ok")
    await store.decide("run-other", "x", approve=False, by="ops", reason="no")
    assert (await pending_approvals(store)).calls == []
    assert (await list_runs(store, where=RunFilter(status="awaiting_approval"))).runs == []
