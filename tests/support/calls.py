"""Helpers for boundary tests: open a run, build envelopes, check refusals and key sets."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import msgspec
from redis.asyncio import Redis

from eventstore import RunContext, Store, ToolBoundary, ToolEnvelope, ToolError, ToolResult
from machine.codes import SAFE_MESSAGES, ErrorCode
from machine.ids import is_invocation_id, is_run_id, is_tool_call_id
from tests.support.tools import FakeTool, namespace_keys

#: The run most boundary tests use.
RUN = "run-a"
#: The tool name most boundary tests register.
TOOL = "search"
#: The arguments an envelope gets when none are given.
DEFAULT_ARGUMENTS: Any = {"q": 1}
_UNSET: Any = object()


async def open_run(store: Store, run_id: str = RUN, **options: Any) -> None:
    """Open ``run_id`` with a five-minute deadline unless told otherwise."""
    options.setdefault("deadline", timedelta(minutes=5))
    await store.open_run(run_id, **options)


def envelope(
    call_id: str = "call_1", *, tool: str = TOOL, run_id: str = RUN, arguments: Any = _UNSET
) -> ToolEnvelope:
    """An envelope of ``run_id`` (arguments default to :data:`DEFAULT_ARGUMENTS`)."""
    return ToolEnvelope(
        run_id=run_id,
        tool_call_id=call_id,
        tool=tool,
        arguments=DEFAULT_ARGUMENTS if arguments is _UNSET else arguments,
    )


def outcome(reply: ToolResult | ToolError) -> str:
    """``READY`` for a success, else the error code's value."""
    return "READY" if isinstance(reply, ToolResult) else reply.error_code.value


def assert_safe_error(
    reply: ToolResult | ToolError, code: ErrorCode, message: str | None = None
) -> None:
    """The reply is exactly the fixed-message error of ``code`` and the call's ids; the
    message is ``message`` when given (a size error's names its limit), else the code's."""
    expected = SAFE_MESSAGES[code] if message is None else message
    assert isinstance(reply, ToolError), reply
    assert reply.error_code is code
    assert reply.message == expected
    assert msgspec.json.decode(msgspec.json.encode(reply)) == {
        "status": "ERROR",
        "error_code": code.value,
        "message": expected,
        "tool_call_id": reply.tool_call_id,
        "invocation_id": reply.invocation_id,
    }
    # Only a safe id is echoed, and only a record's own id is named.
    assert reply.tool_call_id is None or is_tool_call_id(reply.tool_call_id)
    assert reply.invocation_id is None or is_invocation_id(reply.invocation_id)


async def assert_refused_before_execution(
    boundary: ToolBoundary,
    tool: FakeTool,
    call: ToolEnvelope,
    code: ErrorCode,
    *,
    redis: Redis,
    namespace: str,
    ctx: RunContext | None = None,
    message: str | None = None,
) -> None:
    """Invoking ``call`` answers ``code`` (with ``message`` when given), runs nothing and
    creates no invocation: its one write is one more entry on the refusal log of the
    context's run, only when that run exists (the log then has an expiry)."""
    ctx = ctx or RunContext(RUN)
    run_exists = is_run_id(ctx.run_id) and any(
        key.endswith(f":run:{ctx.run_id}".encode())
        for key in await namespace_keys(redis, namespace)
    )
    log = f":refusals:{ctx.run_id}".encode()
    before = await namespace_keys(redis, namespace)
    logged_before = sum([await redis.xlen(key) for key in before if key.endswith(log)])
    executed, projected = tool.executed, tool.projected

    reply = await boundary.invoke(ctx, call)

    assert_safe_error(reply, code, message)
    assert (tool.executed, tool.projected) == (executed, projected)
    after = await namespace_keys(redis, namespace)
    logs = [key for key in after if key.endswith(log)]
    assert set(after) - set(logs) == set(before) - set(logs)
    assert len(logs) == (1 if run_exists else 0), logs
    for key in logs:
        assert await redis.xlen(key) == logged_before + 1
        assert await redis.pttl(key) > 0
