"""Every scenario of seed 000 (ToolBoundary and canonical store), named after it."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from redis.asyncio import Redis

from eventstore import (
    Projection,
    RunContext,
    Store,
    ToolBoundary,
    ToolCall,
    ToolEnvelope,
    ToolError,
    ToolResult,
)
from machine.codes import ErrorCode, EvidenceStatus, Status
from machine.ids import invocation_id
from projections.facts import observed_facts
from tests.helpers import record_fields
from tests.support.tools import FakeTool, record_keys

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-a"


def outcome(reply: ToolResult | ToolError) -> EvidenceStatus | ErrorCode:
    """The evidence status of a success, or the code of an error."""
    return reply.evidence_status if isinstance(reply, ToolResult) else reply.error_code


async def open_run(store: Store, run_id: str = RUN, **options: Any) -> None:
    options.setdefault("deadline", timedelta(minutes=5))
    await store.open_run(run_id, **options)


def recorded_error(
    code: ErrorCode, call_id: str = "call_1", *, message: str | None = None
) -> ToolError:
    """The reply for ``code`` when the call's record holds it: both ids are named; the
    message is the code's own unless given (a size error's names the limit)."""
    reply = ToolError.of(code, tool_call_id=call_id, invocation_id=invocation_id(RUN, call_id))
    return reply if message is None else msgspec.structs.replace(reply, message=message)


def envelope(call_id: str = "call_1", tool: str = "search", run_id: str = RUN, **args: Any):
    return ToolEnvelope(run_id=run_id, tool_call_id=call_id, tool=tool, arguments=args or {"q": 1})


async def test_cross_run_tool_call_is_rejected(store: Store, redis: Redis, namespace: str):
    """An envelope whose run id differs from the RunContext gets a safe ERROR, no record, no run."""
    tool = FakeTool()
    await open_run(store)
    await open_run(store, "run-b")
    boundary = ToolBoundary(store, {"search": tool.spec()})

    reply = await boundary.invoke(RunContext("run-a"), envelope(run_id="run-b"))

    assert reply == ToolError.of(ErrorCode.RUN_MISMATCH, tool_call_id="call_1")
    assert tool.executed == 0
    assert await record_keys(redis, namespace) == []


@pytest.mark.parametrize(
    ("options", "code"),
    [
        ({"authorized": False}, ErrorCode.UNAUTHORIZED),
        ({"read_only": False}, ErrorCode.NOT_READ_ONLY),
    ],
)
async def test_unauthorized_or_writable_tool_is_rejected(
    store: Store, redis: Redis, namespace: str, options: dict[str, bool], code: ErrorCode
):
    """authorized=false or readOnly=false is refused before execution; no record holds the input."""
    tool = FakeTool()
    await open_run(store)
    boundary = ToolBoundary(store, {"search": tool.spec(**options)})

    reply = await boundary.invoke(RunContext(RUN), envelope(secret="request-body"))

    assert reply == ToolError.of(code, tool_call_id="call_1")
    assert tool.executed == 0
    assert b"request-body" not in msgspec.json.encode(reply)
    assert await record_keys(redis, namespace) == []


async def test_tool_begins_execution(store: Store):
    """When the tool is about to execute, one PROJECTING record holds the complete request,
    the exact framework id and no agent result."""
    seen: dict[str, Any] = {}

    async def executor(arguments: dict[str, Any], call: ToolCall) -> Any:
        seen["record"] = await store.get(call.run_id, call.tool_call_id)
        return {"ok": True}

    def projector(raw: Any, call: ToolCall) -> Projection:
        return Projection(result="done", evidence_status="EVIDENCE_FOUND", scope="s")

    from eventstore import ToolSpec

    await open_run(store)
    boundary = ToolBoundary(store, {"search": ToolSpec(executor=executor, projector=projector)})
    arguments = {"query": "naïve 東京 🚀", "filters": {"year": 2026, "tags": ["a", "b"]}}

    await boundary.invoke(RunContext(RUN), envelope("Call.Exact-ID_42", **arguments))

    record = seen["record"]
    assert record.state.status is Status.PROJECTING
    assert record.state.tool_call_id == "Call.Exact-ID_42"
    assert json.loads(record.request) == arguments
    assert record.raw is None and record.result is None
    assert record.state.evidence_status is EvidenceStatus.PENDING


async def test_projector_succeeds(store: Store):
    """Raw data and agent result end up in the same READY record; the agent gets only the result."""
    tool = FakeTool(raw={"secret_rows": ["raw-only-marker"]}, result={"summary": "3 rows"})
    await open_run(store)
    boundary = ToolBoundary(store, {"search": tool.spec()})

    reply = await boundary.invoke(RunContext(RUN), envelope())

    assert isinstance(reply, ToolResult)
    assert reply.result == {"summary": "3 rows"}
    assert "raw-only-marker" not in repr(reply)
    record = await store.get(RUN, "call_1")
    assert record is not None
    assert record.state.status is Status.READY
    assert json.loads(record.raw or b"") == {"secret_rows": ["raw-only-marker"]}
    assert json.loads(record.result or b"") == {"summary": "3 rows"}


async def test_no_evidence_projection_completes(store: Store):
    """A valid NO_EVIDENCE result makes the record READY, keeps its scope, and stays negative."""
    tool = FakeTool(result={"found": 0}, evidence=EvidenceStatus.NO_EVIDENCE, scope="tickets:7d")
    await open_run(store)
    boundary = ToolBoundary(store, {"search": tool.spec()})

    reply = await boundary.invoke(RunContext(RUN), envelope())

    assert isinstance(reply, ToolResult)
    assert (reply.evidence_status, reply.scope) == (EvidenceStatus.NO_EVIDENCE, "tickets:7d")
    assert tool.executed == 1 and tool.projected == 1  # not retried, not upgraded
    record = await store.get(RUN, "call_1")
    assert record is not None
    assert record.state.status is Status.READY
    assert record.state.evidence_status is EvidenceStatus.NO_EVIDENCE
    assert record.state.scope == "tickets:7d"
    facts = await observed_facts(store, RunContext(RUN))
    assert [fact.kind for fact in facts] == ["negative_observation"]


@pytest.mark.parametrize(
    ("tool", "code"),
    [
        (FakeTool(raise_in_projector=RuntimeError("boom token=abc")), ErrorCode.PROJECTION_FAILED),
        (FakeTool(evidence="MAYBE"), ErrorCode.INVALID_EVIDENCE_STATUS),
        (FakeTool(evidence=EvidenceStatus.PENDING), ErrorCode.INVALID_EVIDENCE_STATUS),
        (FakeTool(evidence=EvidenceStatus.ERROR), ErrorCode.INVALID_EVIDENCE_STATUS),
    ],
    ids=["projector-throws", "unknown-evidence", "pending-evidence", "error-evidence"],
)
async def test_projection_fails(store: Store, tool: FakeTool, code: ErrorCode):
    """A throwing projector or an invalid evidence status makes the same record ERROR with a safe
    code, and no agent result is returned."""
    await open_run(store)
    boundary = ToolBoundary(store, {"search": tool.spec()})

    reply = await boundary.invoke(RunContext(RUN), envelope())

    assert reply == recorded_error(code)
    record = await store.get(RUN, "call_1")
    assert record is not None
    assert record.state.status is Status.ERROR
    assert record.state.evidence_status is EvidenceStatus.ERROR
    assert record.state.error_code is code
    assert record.result is None
    assert record.raw is not None  # stored before the failure, harness-only


async def test_duplicate_tool_call_id_is_submitted(store: Store):
    """A second call with the same run and tool call id is not executed and overwrites nothing."""
    first, second = FakeTool(result="first"), FakeTool(result="second")
    await open_run(store)
    boundary_1 = ToolBoundary(store, {"search": first.spec()})
    boundary_2 = ToolBoundary(store, {"search": second.spec()})

    await boundary_1.invoke(RunContext(RUN), envelope(q="one"))
    before = await record_fields(store, RUN, "call_1")
    reply = await boundary_2.invoke(RunContext(RUN), envelope(q="two"))

    assert reply == ToolError.of(ErrorCode.DUPLICATE_TOOL_CALL, tool_call_id="call_1")
    assert second.executed == 0
    assert await record_fields(store, RUN, "call_1") == before


async def test_framework_id_is_preserved(store: Store, redis: Redis, namespace: str):
    """The key and the canonical record carry the exact supplied tool_call_id."""
    await open_run(store)
    boundary = ToolBoundary(store, {"search": FakeTool().spec()})
    call_id = "toolu_01A-b.C_z9"

    await boundary.invoke(RunContext(RUN), envelope(call_id))

    keys = await record_keys(redis, namespace)
    tag = store.keys.tag_of(RUN)
    assert sorted(keys) == [f"{tag}:{kind}:{RUN}:{call_id}".encode() for kind in ("ev", "inv")]
    record = await store.get(RUN, call_id)
    assert record is not None and record.state.tool_call_id == call_id
    assert record.invocation_id == invocation_id(RUN, call_id)


async def test_read_does_not_renew_ttl(store: Store, redis: Redis):
    """Reading a record leaves its expiry at or before the original and issues no expire command."""
    await open_run(store)
    await ToolBoundary(store, {"search": FakeTool().spec()}).invoke(RunContext(RUN), envelope())
    key = store.keys.record(RUN, "call_1")
    expiry_before = (await store.get(RUN, "call_1")).expires_at_ms  # type: ignore[union-attr]
    pttl_before = await redis.pttl(key)
    stats_before = await redis.info("commandstats")

    for _ in range(5):
        await store.get(RUN, "call_1")
        await store.events(RUN, "call_1")
        await asyncio.sleep(0.01)

    stats_after = await redis.info("commandstats")
    for command in ("expire", "pexpire", "expireat", "pexpireat", "persist", "getex"):
        name = f"cmdstat_{command}"
        assert stats_after.get(name, {}).get("calls", 0) == stats_before.get(name, {}).get(
            "calls", 0
        ), command
    assert await redis.pttl(key) <= pttl_before
    assert (await store.get(RUN, "call_1")).expires_at_ms == expiry_before  # type: ignore[union-attr]


async def test_raw_response_is_too_large(make_store: Any):
    """Raw data beyond the limit makes the record ERROR/RESULT_TOO_LARGE, stores nothing of it
    and never runs the projector."""
    from machine.limits import Limits

    store = make_store(limits=Limits(raw_bytes=1000))
    tool = FakeTool(raw="é" * 501)  # 1002 UTF-8 bytes
    await open_run(store)

    reply = await ToolBoundary(store, {"search": tool.spec()}).invoke(RunContext(RUN), envelope())

    assert reply == recorded_error(
        ErrorCode.RESULT_TOO_LARGE,
        message="The raw tool response is larger than the 1000 B raw response limit.",
    )
    assert tool.projected == 0
    record = await store.get(RUN, "call_1")
    assert record is not None
    assert (record.state.status, record.state.error_code) == (
        Status.ERROR,
        ErrorCode.RESULT_TOO_LARGE,
    )
    assert record.raw is None  # not truncated: not stored at all
    assert record.state.rejected_bytes == 1002


async def test_agent_result_is_too_large(make_store: Any):
    """A projection beyond the agent limit makes the record ERROR/RESULT_TOO_LARGE and is not
    returned."""
    from machine.limits import Limits

    store = make_store(limits=Limits(result_bytes=100))
    tool = FakeTool(result="🚀" * 25)  # 100 bytes of emoji + 2 quotes
    await open_run(store)

    reply = await ToolBoundary(store, {"search": tool.spec()}).invoke(RunContext(RUN), envelope())

    assert reply == recorded_error(
        ErrorCode.RESULT_TOO_LARGE,
        message="The tool result is larger than the 100 B agent result limit.",
    )
    assert "🚀" not in repr(reply)
    record = await store.get(RUN, "call_1")
    assert record is not None
    assert record.state.status is Status.ERROR and record.result is None


async def test_tool_execution_throws(store: Store):
    """An executor exception makes the record ERROR/EXECUTION_FAILED; no raw response returned."""
    tool = FakeTool(raise_in_executor=ValueError("password=hunter2 at /secret/path"))
    await open_run(store)

    reply = await ToolBoundary(store, {"search": tool.spec()}).invoke(RunContext(RUN), envelope())

    assert reply == recorded_error(ErrorCode.EXECUTION_FAILED)
    assert "hunter2" not in repr(reply)
    record = await store.get(RUN, "call_1")
    assert record is not None
    assert (record.state.status, record.state.error_code) == (
        Status.ERROR,
        ErrorCode.EXECUTION_FAILED,
    )
    assert tool.projected == 0


async def test_fake_projector_tests_pass(store: Store):
    """Fake tools covering success, no evidence, error, duplicate, TTL and capacity share one
    boundary and one store; the boundary exposes no Redis client to tools or agents."""
    tools = {
        "found": FakeTool(),
        "nothing": FakeTool(evidence=EvidenceStatus.NO_EVIDENCE),
        "broken": FakeTool(raise_in_executor=RuntimeError()),
        "huge": FakeTool(raw="x" * (store.settings.limits.raw_bytes + 1)),
    }
    await open_run(store)
    boundary = ToolBoundary(store, {name: tool.spec() for name, tool in tools.items()})
    ctx = RunContext(RUN)

    replies = [await boundary.invoke(ctx, envelope(f"c{i}", name)) for i, name in enumerate(tools)]
    replies.append(await boundary.invoke(ctx, envelope("c0", "found")))

    assert [outcome(reply) for reply in replies] == [
        EvidenceStatus.EVIDENCE_FOUND,
        EvidenceStatus.NO_EVIDENCE,
        ErrorCode.EXECUTION_FAILED,
        ErrorCode.RESULT_TOO_LARGE,
        ErrorCode.DUPLICATE_TOOL_CALL,
    ]
    public = [name for name in vars(boundary) if not name.startswith("_")]
    assert public == []
    # What tools are handed: ids as text, nothing that could reach Redis.
    handed = [call for tool in tools.values() for call in tool.calls]
    assert handed
    for call in handed:
        assert isinstance(call, ToolCall)
        assert all(type(value) is str for value in msgspec.structs.asdict(call).values())


async def test_completed_calls_are_projected(store: Store):
    """After several READY calls, the progress projector reads each record in execution order and
    builds bounded facts."""
    await open_run(store)
    boundary = ToolBoundary(store, {"search": FakeTool().spec()})
    ctx = RunContext(RUN)
    for i in range(5):
        await boundary.invoke(ctx, envelope(f"call_{i}"))

    facts = await observed_facts(store, ctx)

    assert [fact.tool_call_id for fact in facts] == [f"call_{i}" for i in range(5)]
    assert [fact.position for fact in facts] == [1, 2, 3, 4, 5]
    assert all(fact.kind == "evidence" and fact.run_id == RUN for fact in facts)


async def test_indexed_identity_is_invalid(make_store: Any, redis: Redis):
    """Missing, expired, cross-run, PROJECTING and ERROR identities never become facts."""
    store = make_store(ttl=timedelta(seconds=30))
    short = make_store(ttl=timedelta(milliseconds=400))
    await open_run(store)
    await open_run(store, "run-other")
    ctx = RunContext(RUN)
    boundary = ToolBoundary(
        store, {"ok": FakeTool().spec(), "bad": FakeTool(raise_in_executor=RuntimeError()).spec()}
    )
    await boundary.invoke(ctx, envelope("good", "ok"))
    await boundary.invoke(ctx, envelope("error", "bad"))
    await ToolBoundary(short, {"ok": FakeTool().spec()}).invoke(ctx, envelope("expiring", "ok"))
    await boundary.invoke(RunContext("run-other"), envelope("foreign", "ok", run_id="run-other"))
    head = await store.writer.create(RUN, "pending", "ok", b"{}")
    progress = store.keys.progress(RUN)
    await redis.rpush(progress, f"{RUN}:pending", "run-other:foreign", f"{RUN}:missing")
    await asyncio.sleep(0.5)  # "expiring" is gone now

    facts = await observed_facts(store, ctx)

    assert head.version == 1
    assert [fact.tool_call_id for fact in facts] == ["good"]
