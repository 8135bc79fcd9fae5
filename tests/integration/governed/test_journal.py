"""The journal decides: what a governed call runs is what its event stream approved.

Between the approval and the resume, a writer changes the record alone (its request and
digest, its tool, its stage) or rebuilds or edits the stream: the resume runs nothing,
the call ends ERROR with a stable code and the reason in its failure detail. An approval
lives only as long as its run's authority: a closed run, a revoked tool or a passed
deadline refuse the permit with the code a new call gets, and nothing runs.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import msgspec
import pytest

from eventstore import RunContext, Store, ToolBoundary, ToolError, ToolResult, ToolSpec
from eventstore.audit import replay_invocation
from eventstore.boundary.contracts import Projection, ToolCall
from eventstore.writer import now_ms
from machine.codes import ErrorCode, EvidenceStatus, Stage, Status
from machine.compact import compact_encoder
from machine.events import encode_event, event_hash, payload_digest
from machine.failure_detail import GOVERNANCE_TYPE, decode_failure_detail
from tests.support.calls import envelope
from tests.support.waiting import wait_for

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-j"
CTX = RunContext(RUN, requester="agent-owner")
ORDER = {"amount": 125, "to": "acct-9"}


class Ledger:
    """Side-effecting tools that note every call they ran, so a test sees what ran."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, dict[str, Any]]] = []

    def tool(self, name: str) -> Any:
        def run(arguments: dict[str, Any], call: ToolCall) -> Any:
            self.ran.append((name, arguments))
            return {"done": name}

        return run


def project(raw: Any, call: ToolCall) -> Projection:
    return Projection(result=raw, evidence_status=EvidenceStatus.EVIDENCE_FOUND, scope="ledger")


def tools(ledger: Ledger, **spec: Any) -> dict[str, ToolSpec]:
    governed = {"read_only": False, "approval": True, **spec}
    return {
        "refund": ToolSpec(executor=ledger.tool("refund"), projector=project, **governed),
        "delete_user": ToolSpec(executor=ledger.tool("delete_user"), projector=project, **governed),
        "lookup": ToolSpec(executor=ledger.tool("lookup"), projector=project),
    }


async def approved(store: Store, ledger: Ledger, call: str = "c1", **spec: Any) -> ToolBoundary:
    """A run with ``call`` recorded waiting for ``refund`` of ORDER, then approved by ops."""
    if await store.run_info(RUN) is None:
        await store.open_run(RUN, deadline=timedelta(minutes=10))
    boundary = ToolBoundary(store, tools(ledger, **spec))
    await boundary.invoke(CTX, envelope(call, tool="refund", arguments=ORDER, run_id=RUN))
    decision = await store.decide(RUN, call, approve=True, by="ops", reason="checked")
    assert decision.outcome == "approved"
    return boundary


async def ended_with(store: Store, call: str, code: ErrorCode) -> None:
    """The call ended ERROR with ``code``, its failure detail a dispatch_refused reason."""
    record = await store.get(RUN, call)
    assert record is not None
    assert (record.state.status, record.state.error_code) == (Status.ERROR, code)
    raw = await store.client.hget(store.keys.record(RUN, call), "failure_detail")
    detail = decode_failure_detail(raw)
    assert detail is not None and detail.type == GOVERNANCE_TYPE and detail.message


async def test_a_request_and_digest_rewritten_in_the_record_run_nothing(
    make_store: Any,
) -> None:
    """HSET request, request_sha256 and request_bytes together: the journal's digest
    decides, so nothing runs and the call ends APPROVED_REQUEST_CHANGED."""
    store: Store = make_store()
    ledger = Ledger()
    boundary = await approved(store, ledger)
    forged = b'{"amount":9999}'
    await store.client.hset(
        store.keys.record(RUN, "c1"),
        mapping={
            "request": forged,
            "request_sha256": payload_digest(forged),
            "request_bytes": len(forged),
        },
    )
    reply = await boundary.resume(CTX, "c1")
    assert isinstance(reply, ToolError)
    assert reply.error_code is ErrorCode.APPROVED_REQUEST_CHANGED
    assert ledger.ran == []
    await ended_with(store, "c1", ErrorCode.APPROVED_REQUEST_CHANGED)


@pytest.mark.parametrize("other", ["delete_user", "lookup"])
async def test_a_tool_rewritten_in_the_record_runs_nothing(make_store: Any, other: str) -> None:
    """HSET tool to another governed tool, or a read-only one: the tool frozen in the
    journal is not the one named, so nothing runs (JOURNAL_MISMATCH)."""
    store: Store = make_store()
    ledger = Ledger()
    boundary = await approved(store, ledger)
    await store.client.hset(store.keys.record(RUN, "c1"), "tool", other)
    reply = await boundary.resume(CTX, "c1")
    assert isinstance(reply, ToolError) and reply.error_code is ErrorCode.JOURNAL_MISMATCH
    assert ledger.ran == []
    await ended_with(store, "c1", ErrorCode.JOURNAL_MISMATCH)


async def test_a_stage_set_to_approved_on_a_waiting_call_runs_nothing(make_store: Any) -> None:
    """HSET stage APPROVED on a call no operator decided: the journal holds no approval."""
    store: Store = make_store()
    await store.open_run(RUN, deadline=timedelta(minutes=10))
    ledger = Ledger()
    boundary = ToolBoundary(store, tools(ledger))
    await boundary.invoke(CTX, envelope("c1", tool="refund", arguments=ORDER, run_id=RUN))
    await store.client.hset(store.keys.record(RUN, "c1"), "stage", "APPROVED")
    reply = await boundary.resume(CTX, "c1")
    assert isinstance(reply, ToolError) and reply.error_code is ErrorCode.JOURNAL_MISMATCH
    assert ledger.ran == []
    await ended_with(store, "c1", ErrorCode.JOURNAL_MISMATCH)
    replay = await replay_invocation(store, RUN, "c1")
    assert replay is not None
    assert [step.event_type for step in replay.timeline] == ["ApprovalRequested", "Failed"]


async def test_a_stream_rebuilt_without_its_approval_runs_nothing(make_store: Any) -> None:
    """The stream rebuilt with ApprovalRequested only (the record still says approved):
    the journal approves nothing, so nothing runs."""
    store: Store = make_store()
    ledger = Ledger()
    boundary = await approved(store, ledger)
    stream = store.keys.stream(RUN, "c1")
    first, *_ = await store.client.xrange(stream)
    ttl = await store.client.pttl(stream)
    await store.client.delete(stream)
    await store.client.xadd(stream, first[1])
    await store.client.pexpire(stream, ttl)
    reply = await boundary.resume(CTX, "c1")
    assert isinstance(reply, ToolError) and reply.error_code is ErrorCode.JOURNAL_MISMATCH
    assert ledger.ran == []


async def test_an_event_edited_in_place_breaks_the_chain_and_runs_nothing(
    make_store: Any,
) -> None:
    """ApprovalRequested's frozen digest rewritten in its stream entry (and the record's
    request to match it): the next event no longer links to it, so nothing runs."""
    store: Store = make_store()
    ledger = Ledger()
    boundary = await approved(store, ledger)
    stream = store.keys.stream(RUN, "c1")
    entries = await store.client.xrange(stream)
    forged = b'{"amount":9999}'
    items = msgspec.msgpack.decode(entries[0][1][b"e"])
    position = 2 + 7  # [type, schema, event_id, version, at_ms, prev_hash, run, call, tool, digest]
    items[position] = bytes.fromhex(payload_digest(forged))
    ttl = await store.client.pttl(stream)
    await store.client.delete(stream)
    await store.client.xadd(stream, {b"e": compact_encoder.encode(items)})
    for _, fields in entries[1:]:
        await store.client.xadd(stream, fields)
    await store.client.pexpire(stream, ttl)
    await store.client.hset(
        store.keys.record(RUN, "c1"),
        mapping={"request": forged, "request_sha256": payload_digest(forged)},
    )
    reply = await boundary.resume(CTX, "c1")
    assert isinstance(reply, ToolError) and reply.error_code is ErrorCode.JOURNAL_MISMATCH
    assert ledger.ran == []
    detail = decode_failure_detail(
        await store.client.hget(store.keys.record(RUN, "c1"), "failure_detail")
    )
    assert detail is not None and "chain" in detail.message


async def test_a_request_swapped_while_the_permit_is_taken_runs_nothing(
    make_store: Any,
) -> None:
    """The request changes between the resumer's read and its permit: the permit hands
    back the stored bytes of that moment, which lack the journal's digest; nothing runs
    and the call, now attempted, ends APPROVED_REQUEST_CHANGED."""
    store: Store = make_store()
    ledger = Ledger()
    boundary = await approved(store, ledger)
    dispatch = store.writer.dispatch

    async def swapped(*args: Any, **kwargs: Any) -> Any:
        await store.client.hset(store.keys.record(RUN, "c1"), "request", b'{"amount":1}')
        return await dispatch(*args, **kwargs)

    store.writer.dispatch = swapped  # type: ignore[method-assign]
    reply = await boundary.resume(CTX, "c1")
    assert isinstance(reply, ToolError)
    assert reply.error_code is ErrorCode.APPROVED_REQUEST_CHANGED
    assert ledger.ran == []
    record = await store.get(RUN, "c1")
    assert record is not None and record.state.dispatched_request_sha256 is not None
    assert record.state.error_code is ErrorCode.APPROVED_REQUEST_CHANGED


async def test_an_untouched_approved_call_still_runs_once(make_store: Any) -> None:
    """The control: nothing rewritten, the approved request runs once and replays intact."""
    store: Store = make_store()
    ledger = Ledger()
    boundary = await approved(store, ledger)
    reply = await boundary.resume(CTX, "c1")
    assert isinstance(reply, ToolResult)
    assert ledger.ran == [("refund", ORDER)]
    replay = await replay_invocation(store, RUN, "c1")
    assert replay is not None and replay.verdict.intact, replay.problems


async def test_a_closed_run_refuses_the_permit_and_the_call_ends(make_store: Any) -> None:
    """close_run after the approval: the resume answers RUN_INACTIVE, as a new call of
    the run gets; the call ends ERROR with that code and nothing runs."""
    store: Store = make_store()
    ledger = Ledger()
    boundary = await approved(store, ledger)
    assert await store.close_run(RUN)
    reply = await boundary.resume(CTX, "c1")
    assert isinstance(reply, ToolError) and reply.error_code is ErrorCode.RUN_INACTIVE
    assert ledger.ran == []
    await ended_with(store, "c1", ErrorCode.RUN_INACTIVE)


async def test_a_revoked_tool_refuses_the_permit_and_the_call_ends(make_store: Any) -> None:
    """The tool revoked from the run after the approval: UNAUTHORIZED, nothing runs."""
    store: Store = make_store()
    ledger = Ledger()
    boundary = await approved(store, ledger)
    assert await store.runs.revoke_tool(RUN, "refund")
    reply = await boundary.resume(CTX, "c1")
    assert isinstance(reply, ToolError) and reply.error_code is ErrorCode.UNAUTHORIZED
    assert ledger.ran == []
    await ended_with(store, "c1", ErrorCode.UNAUTHORIZED)


async def test_a_passed_deadline_refuses_the_permit_and_the_call_ends(make_store: Any) -> None:
    """The run's deadline passes after the approval: RUN_DEADLINE_EXPIRED, nothing runs."""
    store: Store = make_store()
    ledger = Ledger()
    await store.open_run(RUN, deadline=timedelta(milliseconds=600))
    boundary = await approved(store, ledger)
    info = await store.run_info(RUN)
    assert info is not None
    await wait_for(lambda: now_ms() > info.deadline_ms + 20)
    reply = await boundary.resume(CTX, "c1")
    assert isinstance(reply, ToolError) and reply.error_code is ErrorCode.RUN_DEADLINE_EXPIRED
    assert ledger.ran == []
    await ended_with(store, "c1", ErrorCode.RUN_DEADLINE_EXPIRED)


async def test_the_permit_script_hashes_like_python(make_store: Any) -> None:
    """The Lua SHA-256 the permit judges chains with agrees with hashlib on events of every
    padding length (55, 56, 63, 64, 119 bytes ... and a long reason)."""
    store: Store = make_store()
    source = store._scripts.permit.source
    body = source.split("-- @include", 1)[0]
    sha_part = source[source.index("local sha256_hex") : source.index("local decode_event")]
    script = sha_part + "\nlocal out = {} for i, v in ipairs(ARGV) do out[i] = sha256_hex(v) end\n"
    script += "return out"
    assert body  # the header is there
    samples = [b"", b"a", b"x" * 55, b"x" * 56, b"x" * 63, b"x" * 64, b"x" * 119, b"\xff" * 4000]
    samples.append(encode_event_sample())
    digests = await store.client.eval(script, 0, *samples)
    assert [digest.decode() for digest in digests] == [event_hash(s) for s in samples]


def encode_event_sample() -> bytes:
    from tests.helpers import make_event

    return encode_event(make_event("Approved", None))


async def test_the_journal_check_reads_json_escapes_nowhere(make_store: Any) -> None:
    """A reason with every kind of character (quotes, UTF-8, control-looking text) is
    hashed and decoded by the permit as stored: the approved call runs."""
    store: Store = make_store()
    await store.open_run(RUN, deadline=timedelta(minutes=10))
    ledger = Ledger()
    boundary = ToolBoundary(store, tools(ledger))
    await boundary.invoke(CTX, envelope("c1", tool="refund", arguments=ORDER, run_id=RUN))
    reason = json.dumps({"why": 'ok "quoted" é ✓ \\n'}) * 20
    await store.decide(RUN, "c1", approve=True, by="ops é", reason=reason)
    reply = await boundary.resume(CTX, "c1")
    assert isinstance(reply, ToolResult), reply
    assert ledger.ran == [("refund", ORDER)]
    record = await store.get(RUN, "c1")
    assert record is not None and record.state.stage is Stage.READY
