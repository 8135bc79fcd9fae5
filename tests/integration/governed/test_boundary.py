"""A governed tool through the boundary: recorded frozen, answered ApprovalPending, run
exactly once with its original request when an approved call is resumed (or re-entered by
its framework with the same id and request), never when denied, expired or paused."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import msgspec
import pytest

from eventstore import (
    ApprovalPending,
    RunContext,
    Store,
    SyncBoundary,
    SyncStore,
    ToolBoundary,
    ToolError,
    ToolResult,
    ToolSpec,
)
from eventstore.audit import replay_invocation
from eventstore.boundary.contracts import Projection, ToolCall, reply_to_builtins
from eventstore.errors import InvalidArgument
from eventstore.writer import now_ms
from machine.codes import ErrorCode, EvidenceStatus, Stage, Status
from machine.events import payload_digest
from machine.ids import invocation_id
from tests.support.calls import envelope, open_run
from tests.support.waiting import wait_for

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-a"
CTX = RunContext(RUN)
ORDER = {"amount": 125, "to": "acct-9"}


class Refunds:
    """A side-effecting tool that counts what it did, so a test can see it ran once."""

    def __init__(self) -> None:
        self.done: list[dict[str, Any]] = []
        self.gate: asyncio.Event | None = None

    async def refund(self, arguments: dict[str, Any], call: ToolCall) -> Any:
        if self.gate is not None:
            await self.gate.wait()
        self.done.append(arguments)
        return {"refunded": arguments["amount"]}


def project(raw: Any, call: ToolCall) -> Projection:
    return Projection(result=raw, evidence_status=EvidenceStatus.EVIDENCE_FOUND, scope="refunds")


def governed(tool: Refunds, **spec: Any) -> dict[str, ToolSpec]:
    spec.setdefault("approval", True)
    return {"refund": ToolSpec(executor=tool.refund, projector=project, read_only=False, **spec)}


def refund(call: str = "c1", arguments: Any = ORDER) -> Any:
    return envelope(call, tool="refund", arguments=arguments)


async def approve(store: Store, call: str = "c1", *, yes: bool = True) -> None:
    decision = await store.decide(RUN, call, approve=yes, by="ops@example", reason="checked")
    assert decision.made_now


async def test_a_side_effecting_tool_without_an_approval_policy_is_still_refused(
    make_store: Any,
) -> None:
    store: Store = make_store()
    await open_run(store)
    tool = Refunds()
    boundary = ToolBoundary(store, governed(tool, approval=False))
    reply = await boundary.invoke(CTX, refund())
    assert isinstance(reply, ToolError) and reply.error_code is ErrorCode.NOT_READ_ONLY
    assert tool.done == [] and await store.get(RUN, "c1") is None


async def test_a_governed_call_is_recorded_frozen_and_answered_pending(make_store: Any) -> None:
    """The tool does not run; the agent gets ApprovalPending with the call's ids and the
    approval's; the record waits with the complete request and its digest."""
    store: Store = make_store()
    await open_run(store)
    tool = Refunds()
    boundary = ToolBoundary(store, governed(tool))
    reply = await boundary.invoke(CTX, refund())
    assert isinstance(reply, ApprovalPending)
    assert reply.tool_call_id == "c1"
    assert reply.invocation_id == invocation_id(RUN, "c1")
    record = await store.get(RUN, "c1")
    assert record is not None
    assert reply.approval_id == record.state.approval_id
    assert record.state.stage is Stage.AWAITING_APPROVAL
    assert record.state.status is Status.PROJECTING
    assert msgspec.json.decode(record.request) == ORDER
    assert record.state.request_sha256 == payload_digest(record.request)
    assert tool.done == []
    shown = reply_to_builtins(reply)
    assert shown["status"] == "AWAITING_APPROVAL" and "Do not retry" in shown["message"]
    assert reply.approval_id in shown["message"]


async def test_an_approved_call_runs_once_with_its_frozen_request_on_resume(
    make_store: Any,
) -> None:
    """Pending until decided; once approved the resume runs the recorded request, and every
    later resume answers the recorded reply without running anything."""
    store: Store = make_store()
    await open_run(store)
    tool = Refunds()
    boundary = ToolBoundary(store, governed(tool))
    await boundary.invoke(CTX, refund())
    assert isinstance(await boundary.resume(CTX, "c1"), ApprovalPending)
    assert tool.done == []
    await approve(store)
    first = await boundary.resume(CTX, "c1")
    assert isinstance(first, ToolResult) and first.result == {"refunded": 125}
    assert tool.done == [ORDER]
    again = await boundary.resume(CTX, "c1")
    assert again == first
    assert tool.done == [ORDER]
    record = await store.get(RUN, "c1")
    assert record is not None and record.state.status is Status.READY
    assert record.state.dispatched_request_sha256 == record.state.request_sha256
    assert record.state.decided_by == "ops@example"


async def test_the_framework_calling_again_with_the_same_id_and_request_is_a_resume(
    make_store: Any,
) -> None:
    """Every framework resumes by calling the tool again: the same request attaches to the
    same invocation (pending, then run once); another request under that id is a
    duplicate and runs nothing."""
    store: Store = make_store()
    await open_run(store)
    tool = Refunds()
    boundary = ToolBoundary(store, governed(tool))
    first = await boundary.invoke(CTX, refund())
    assert isinstance(first, ApprovalPending)
    again = await boundary.invoke(CTX, refund())
    assert again == first
    other = await boundary.invoke(CTX, refund(arguments={"amount": 9_999, "to": "acct-x"}))
    assert isinstance(other, ToolError) and other.error_code is ErrorCode.DUPLICATE_TOOL_CALL
    await approve(store)
    ran = await boundary.invoke(CTX, refund())
    assert isinstance(ran, ToolResult) and ran.result == {"refunded": 125}
    edited = await boundary.invoke(CTX, refund(arguments={"amount": 9_999, "to": "acct-x"}))
    assert isinstance(edited, ToolError) and edited.error_code is ErrorCode.DUPLICATE_TOOL_CALL
    assert tool.done == [ORDER]
    info = await store.run_info(RUN)
    assert info is not None and info.used == {"refund": 1}  # the budget spent once


async def test_a_denied_call_never_runs_and_answers_approval_denied(make_store: Any) -> None:
    store: Store = make_store()
    await open_run(store)
    tool = Refunds()
    boundary = ToolBoundary(store, governed(tool))
    await boundary.invoke(CTX, refund())
    await approve(store, yes=False)
    for reply in (await boundary.resume(CTX, "c1"), await boundary.invoke(CTX, refund())):
        assert isinstance(reply, ToolError)
        assert reply.error_code is ErrorCode.APPROVAL_DENIED
        assert reply.invocation_id == invocation_id(RUN, "c1")
    assert tool.done == []


async def test_many_resumers_run_the_tool_once_and_all_get_its_reply(make_store: Any) -> None:
    """Resumers in one process and through other stores (other connections, as other
    processes would be) race for the one permit: the tool runs once; every one of them
    answers its recorded result."""
    tool = Refunds()
    stores: list[Store] = [make_store() for _ in range(3)]
    await open_run(stores[0])
    boundaries = [ToolBoundary(store, governed(tool)) for store in stores]
    await boundaries[0].invoke(CTX, refund())
    await approve(stores[0])
    replies = await asyncio.gather(
        *(boundaries[n % 3].resume(CTX, "c1") for n in range(12)),
        *(boundaries[n % 3].invoke(CTX, refund()) for n in range(6)),
    )
    assert tool.done == [ORDER]
    assert all(isinstance(reply, ToolResult) for reply in replies), replies
    assert len({msgspec.json.encode(reply) for reply in replies}) == 1


async def test_a_resumer_that_loses_the_permit_to_a_running_call_answers_already_dispatched(
    make_store: Any,
) -> None:
    """With no time to wait for the winner's outcome, the loser is told the call was
    dispatched; it never runs the tool."""
    store: Store = make_store()
    await open_run(store)
    tool = Refunds()
    tool.gate = asyncio.Event()
    boundary = ToolBoundary(store, governed(tool), replay_wait_s=0)
    await boundary.invoke(CTX, refund())
    await approve(store)
    winner = asyncio.create_task(boundary.resume(CTX, "c1"))

    async def dispatched() -> bool:
        record = await store.get(RUN, "c1")
        return record is not None and record.state.stage is Stage.EXECUTING

    await wait_for(dispatched)
    loser = await boundary.resume(CTX, "c1")
    assert isinstance(loser, ToolError) and loser.error_code is ErrorCode.ALREADY_DISPATCHED
    assert loser.invocation_id == invocation_id(RUN, "c1")
    tool.gate.set()
    assert isinstance(await winner, ToolResult)
    assert tool.done == [ORDER]


async def test_a_policy_decides_per_request(make_store: Any) -> None:
    """False runs the call at once, recorded with no approval; True (or a policy that
    fails) makes it wait."""
    store: Store = make_store()
    await open_run(store)
    tool = Refunds()

    def over_100(arguments: dict[str, Any], call: ToolCall) -> bool:
        if arguments["amount"] < 0:
            raise ValueError("a broken policy")
        return bool(arguments["amount"] > 100)

    boundary = ToolBoundary(store, governed(tool, approval=over_100))
    small = await boundary.invoke(CTX, refund("small", {"amount": 5, "to": "a"}))
    assert isinstance(small, ToolResult) and tool.done == [{"amount": 5, "to": "a"}]
    record = await store.get(RUN, "small")
    assert record is not None and record.state.approval_id is None
    assert isinstance(await boundary.invoke(CTX, refund("big")), ApprovalPending)
    assert isinstance(
        await boundary.invoke(CTX, refund("broken", {"amount": -1, "to": "a"})), ApprovalPending
    )
    assert len(tool.done) == 1


async def test_a_paused_run_dispatches_nothing_until_unpaused(make_store: Any) -> None:
    """An approved call resumed in a paused run answers RUN_PAUSED and stays approved; a
    new governed call of that run is refused; unpaused, the resume runs it."""
    store: Store = make_store()
    await open_run(store)
    tool = Refunds()
    boundary = ToolBoundary(store, governed(tool))
    await boundary.invoke(CTX, refund())
    await approve(store)
    assert await store.pause_run(RUN, by="ops@example", reason="incident 42")
    paused = await boundary.resume(CTX, "c1")
    assert isinstance(paused, ToolError) and paused.error_code is ErrorCode.RUN_PAUSED
    refused = await boundary.invoke(CTX, refund("c2"))
    assert isinstance(refused, ToolError) and refused.error_code is ErrorCode.RUN_PAUSED
    record = await store.get(RUN, "c1")
    assert record is not None and record.state.stage is Stage.APPROVED
    assert tool.done == []
    assert await store.unpause_run(RUN, by="ops@example", reason="resolved")
    assert isinstance(await boundary.resume(CTX, "c1"), ToolResult)
    assert tool.done == [ORDER]


async def test_a_reentry_in_a_paused_run_is_answered_from_its_call(make_store: Any) -> None:
    """A framework re-entering its calls in a paused run is answered from each call (the
    creation script finds the record before it looks at the run): one still waiting is
    pending (not RUN_PAUSED), an approved one meets the pause at its permit (RUN_PAUSED,
    still approved), a finished one gets its recorded result; a new call is refused."""
    store: Store = make_store()
    await open_run(store)
    tool = Refunds()
    boundary = ToolBoundary(store, governed(tool))
    for call in ("waits", "approved", "done"):
        await boundary.invoke(CTX, refund(call))
    await approve(store, "approved")
    await approve(store, "done")
    assert isinstance(await boundary.resume(CTX, "done"), ToolResult)
    assert await store.pause_run(RUN, by="ops@example", reason="incident 42")
    waits = await boundary.invoke(CTX, refund("waits"))
    assert isinstance(waits, ApprovalPending) and waits.tool_call_id == "waits"
    held = await boundary.invoke(CTX, refund("approved"))
    assert isinstance(held, ToolError) and held.error_code is ErrorCode.RUN_PAUSED
    done = await boundary.invoke(CTX, refund("done"))
    assert isinstance(done, ToolResult) and done.result == {"refunded": ORDER["amount"]}
    new = await boundary.invoke(CTX, refund("new"))
    assert isinstance(new, ToolError) and new.error_code is ErrorCode.RUN_PAUSED
    assert await store.get(RUN, "new") is None
    assert tool.done == [ORDER]
    record = await store.get(RUN, "approved")
    assert record is not None and record.state.stage is Stage.APPROVED


async def test_an_expired_approval_is_recorded_at_resume_and_never_runs(make_store: Any) -> None:
    store: Store = make_store()
    await open_run(store)
    tool = Refunds()
    boundary = ToolBoundary(store, governed(tool, approval_timeout=timedelta(milliseconds=20)))
    pending = await boundary.invoke(CTX, refund())
    assert isinstance(pending, ApprovalPending)
    record = await store.get(RUN, "c1")
    assert record is not None and record.state.approval_expires_at_ms is not None
    due = record.state.approval_expires_at_ms

    async def past_due() -> bool:
        return now_ms() > due

    await wait_for(past_due)
    reply = await boundary.resume(CTX, "c1")
    assert isinstance(reply, ToolError) and reply.error_code is ErrorCode.APPROVAL_EXPIRED
    expired = await store.get(RUN, "c1")
    assert expired is not None and expired.state.error_code is ErrorCode.APPROVAL_EXPIRED
    assert tool.done == []


async def test_the_approval_never_outlives_the_record(make_store: Any) -> None:
    store: Store = make_store(ttl=timedelta(minutes=5))
    await open_run(store)
    boundary = ToolBoundary(store, governed(Refunds()))  # 24 hours by default
    await boundary.invoke(CTX, refund())
    record = await store.get(RUN, "c1")
    assert record is not None and record.state.approval_expires_at_ms is not None
    assert record.state.approval_expires_at_ms <= record.expires_at_ms


async def test_an_approved_request_changed_in_redis_runs_nothing(
    make_store: Any, redis: Any
) -> None:
    """The stored bytes are checked against the digest the journal froze before the tool
    runs: nothing runs, and the call ends ERROR with the code and the reason recorded."""
    store: Store = make_store()
    await open_run(store)
    tool = Refunds()
    boundary = ToolBoundary(store, governed(tool))
    await boundary.invoke(CTX, refund())
    await approve(store)
    await redis.hset(store.keys.record(RUN, "c1"), "request", b'{"amount":9999,"to":"x"}')
    reply = await boundary.resume(CTX, "c1")
    assert isinstance(reply, ToolError)
    assert reply.error_code is ErrorCode.APPROVED_REQUEST_CHANGED
    record = await store.get(RUN, "c1")
    assert record is not None and record.state.stage is Stage.ERROR
    assert record.state.error_code is ErrorCode.APPROVED_REQUEST_CHANGED
    assert tool.done == []


async def test_resume_answers_bad_ids_and_unknown_calls_with_stable_codes(
    make_store: Any,
) -> None:
    store: Store = make_store()
    await open_run(store)
    boundary = ToolBoundary(store, governed(Refunds()))
    for ctx, call, code in (
        (CTX, "bad id\n", ErrorCode.INVALID_TOOL_CALL_ID),
        (RunContext("no such run!"), "c1", ErrorCode.RUN_MISMATCH),
        (CTX, "never-made", ErrorCode.RECORD_EXPIRED),
    ):
        reply = await boundary.resume(ctx, call)
        assert isinstance(reply, ToolError) and reply.error_code is code, (call, reply)
        assert reply.invocation_id is None


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"approval": True, "read_only": True}, "side-effecting"),
        ({"approval": "yes", "read_only": False}, "approval must be"),
        ({"approval": True, "read_only": False, "approval_timeout": timedelta(0)}, "positive"),
        ({"approval": True, "read_only": False, "approval_timeout": 60}, "positive"),
    ],
)
async def test_an_approval_policy_that_cannot_work_is_refused_at_registration(
    make_store: Any, spec: dict[str, Any], says: str
) -> None:
    tool = Refunds()
    with pytest.raises(InvalidArgument, match=says):
        ToolBoundary(
            make_store(), {"refund": ToolSpec(executor=tool.refund, projector=project, **spec)}
        )


def test_the_sync_facade_resumes_and_decides(redis_url: str, namespace: str) -> None:
    tool = Refunds()
    store = SyncStore.from_url(redis_url, namespace=namespace)
    try:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        boundary = SyncBoundary(store, governed(tool))
        pending = boundary.invoke(CTX, refund())
        assert isinstance(pending, ApprovalPending)
        assert [w.call.tool_call_id for w in store.pending_approvals().calls] == ["c1"]
        decision = store.decide(RUN, "c1", approve=True, by="ops@example", reason="ok")
        assert decision.outcome == "approved"
        results: list[Any] = []
        threads = [
            threading.Thread(target=lambda: results.append(boundary.resume(CTX, "c1")))
            for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert all(isinstance(reply, ToolResult) for reply in results)
        assert tool.done == [ORDER]
    finally:
        store.close()


async def test_an_edit_denies_the_original_and_records_a_linked_call_that_waits(
    make_store: Any,
) -> None:
    """Approving with other arguments is no approval: the original ends APPROVAL_DENIED
    ("superseded"), the edited request is a new governed call linked to it, which runs
    only once approved and resumed; the original's arguments never run; both journals
    replay intact."""
    store: Store = make_store()
    await open_run(store)
    tool = Refunds()
    boundary = ToolBoundary(store, governed(tool))
    await boundary.invoke(CTX, refund())
    edited = {"amount": 100, "to": "acct-9"}
    done = await store.decisions.supersede(RUN, "c1", edited, by="ops@example", reason="cap at 100")
    assert done.original.made_now and done.original.outcome == "denied"
    assert done.edited == "c1.edit1"
    original = await store.get(RUN, "c1")
    assert original is not None
    assert original.state.superseded_by == "c1.edit1"
    assert original.state.decision_reason == "superseded: cap at 100"
    new = await store.get(RUN, "c1.edit1")
    assert new is not None and new.state.stage is Stage.AWAITING_APPROVAL
    assert new.state.supersedes == "c1" and msgspec.json.decode(new.request) == edited
    assert new.state.approval_expires_at_ms == original.state.approval_expires_at_ms
    denied = await boundary.resume(CTX, "c1")
    assert isinstance(denied, ToolError) and denied.error_code is ErrorCode.APPROVAL_DENIED
    assert isinstance(await boundary.resume(CTX, "c1.edit1"), ApprovalPending)
    await approve(store, "c1.edit1")
    ran = await boundary.resume(CTX, "c1.edit1")
    assert isinstance(ran, ToolResult) and ran.result == {"refunded": 100}
    assert tool.done == [edited]
    for call in ("c1", "c1.edit1"):
        replay = await replay_invocation(store, RUN, call)
        assert replay is not None and replay.verdict.intact, (call, replay.problems)
    again = await store.decisions.supersede(RUN, "c1", edited, by="ops", reason="again")
    assert again.edited is None and not again.original.made_now
    with pytest.raises(InvalidArgument, match="JSON object"):
        await store.decisions.supersede(RUN, "c1.edit1", "[1]", by="ops", reason="x")
