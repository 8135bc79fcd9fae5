"""The bad-input catalogue, envelope part: ids, run ownership, input, size and tool spec.

Every refusal runs nothing and creates no key.
"""

from __future__ import annotations

import types
from typing import Any

import pytest
from redis.asyncio import Redis

from eventstore import RunContext, Store, ToolBoundary
from eventstore.errors import InvalidArgument
from machine.codes import ErrorCode
from machine.ids import MAX_TOOL_CALL_ID_BYTES
from tests.support.calls import (
    RUN,
    TOOL,
    assert_refused_before_execution,
    envelope,
    open_run,
    outcome,
)
from tests.support.tools import FakeTool

pytestmark = pytest.mark.backends("single", "cluster")


def nested(levels: int) -> dict[str, Any]:
    """An object with ``levels`` levels of objects (the outer one is level 1)."""
    value: dict[str, Any] = {"leaf": "x"}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


_BAD_IDS = {
    "blank": "",
    "whitespace": "   ",
    "too-long-513-bytes": "a" * (MAX_TOOL_CALL_ID_BYTES + 1),
    "too-long-multibyte": "é" * 256 + "a",
    "space": "call 1",
    "tab": "call\t1",
    "newline": "call\n",
    "nul": "call\x001",
    "control": "call\x1b",
    "no-break-space": "call\xa0",
    "lone-surrogate": "call\udc00",
    "not-a-string": None,
    "bytes": b"call-1",
}


@pytest.mark.parametrize("call_id", list(_BAD_IDS.values()), ids=list(_BAD_IDS))
async def test_unsafe_tool_call_id_is_refused(
    store: Store, redis: Redis, namespace: str, call_id: Any
):
    """A blank, over-long or unsafe framework tool_call_id is INVALID_TOOL_CALL_ID."""
    tool = FakeTool()
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: tool.spec()})

    await assert_refused_before_execution(
        boundary,
        tool,
        envelope(call_id),
        ErrorCode.INVALID_TOOL_CALL_ID,
        redis=redis,
        namespace=namespace,
    )


async def test_longest_allowed_tool_call_id_passes(store: Store):
    """A tool_call_id of exactly 512 UTF-8 bytes is used as given."""
    await open_run(store)
    call_id = "a" * MAX_TOOL_CALL_ID_BYTES

    reply = await ToolBoundary(store, {TOOL: FakeTool().spec()}).invoke(
        RunContext(RUN), envelope(call_id)
    )

    assert outcome(reply) == "READY"
    record = await store.get(RUN, call_id)
    assert record is not None and record.state.tool_call_id == call_id


@pytest.mark.parametrize(
    ("ctx_run", "envelope_run"),
    [("run-a", "run-b"), ("run-a", "RUN-A"), ("run-a", "run-a "), ("run:a", "run:a")],
    ids=["other-run", "case-differs", "trailing-space", "unsafe-context-run"],
)
async def test_envelope_of_another_run_is_refused(
    store: Store, redis: Redis, namespace: str, ctx_run: str, envelope_run: str
):
    """An envelope run id that is not the RunContext's (or an unsafe context) is RUN_MISMATCH."""
    tool = FakeTool()
    await open_run(store, "run-a")
    await open_run(store, "run-b")
    boundary = ToolBoundary(store, {TOOL: tool.spec()})

    await assert_refused_before_execution(
        boundary,
        tool,
        envelope(run_id=envelope_run),
        ErrorCode.RUN_MISMATCH,
        redis=redis,
        namespace=namespace,
        ctx=RunContext(ctx_run),
    )


class _Opaque:
    """A Python object that is not a JSON value."""


_BAD_ARGUMENTS: dict[str, Any] = {
    "json-array": [1, 2],
    "json-array-text": "[1, 2]",
    "scalar": 7,
    "scalar-text": "7",
    "string": "not json at all",
    "string-text": '"a string"',
    "null": None,
    "null-text": "null",
    "nan-float": {"x": float("nan")},
    "infinity-float": {"x": float("inf")},
    "minus-infinity-float": {"x": [float("-inf")]},
    "nan-text": '{"x": NaN}',
    "infinity-text": '{"x": Infinity}',
    "minus-infinity-text": '{"x": -Infinity}',
    "invalid-utf8-bytes": b'{"x": "\xc3\x28"}',
    "lone-surrogate-value": {"x": "\ud800"},
    "lone-surrogate-key": {"\udc00": 1},
    "lone-surrogate-escape-text": '{"x": "\\ud800"}',
    "non-str-key": {1: "x"},
    "nested-non-str-key": {"x": {(1, 2): "y"}},
    "set": {"x": {1, 2}},
    "object": {"x": _Opaque()},
    "bytes-value": {"x": b"raw"},
    "int-past-digit-limit": {"x": 10**5000},
    "too-deep-text": '{"a":' + "[" * 100_000 + "]" * 100_000 + "}",
}


@pytest.mark.parametrize("arguments", list(_BAD_ARGUMENTS.values()), ids=list(_BAD_ARGUMENTS))
async def test_input_that_is_not_a_json_object_is_refused(
    store: Store, redis: Redis, namespace: str, arguments: Any
):
    """Arrays, scalars, strings, null, NaN/Infinity, invalid UTF-8, lone surrogates, non-str keys
    and non-JSON values are INVALID_INPUT."""
    tool = FakeTool()
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: tool.spec()})

    await assert_refused_before_execution(
        boundary,
        tool,
        envelope(arguments=arguments),
        ErrorCode.INVALID_INPUT,
        redis=redis,
        namespace=namespace,
    )


async def test_nesting_beyond_the_depth_bound_is_refused(
    store: Store, redis: Redis, namespace: str
):
    """Input nested one level deeper than Limits.json_depth is INVALID_INPUT, as object or text."""
    tool = FakeTool()
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: tool.spec()})
    too_deep = nested(store.settings.limits.json_depth + 1)

    for arguments in (too_deep, str(too_deep).replace("'", '"')):
        await assert_refused_before_execution(
            boundary,
            tool,
            envelope(arguments=arguments),
            ErrorCode.INVALID_INPUT,
            redis=redis,
            namespace=namespace,
        )


async def test_nesting_exactly_at_the_depth_bound_passes(store: Store):
    """Input nested exactly Limits.json_depth levels deep runs."""
    tool = FakeTool()
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: tool.spec()})
    at_bound = nested(store.settings.limits.json_depth)

    reply = await boundary.invoke(RunContext(RUN), envelope(arguments=at_bound))

    assert outcome(reply) == "READY" and tool.executed == 1


async def test_json_text_and_mappings_of_an_object_are_accepted(store: Store):
    """JSON text (str or bytes) of an object and read-only mappings are valid inputs."""
    tool = FakeTool()
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: tool.spec()})
    inputs = ['{"q": "ü"}', '{"q": "ü"}'.encode(), types.MappingProxyType({"q": "ü"})]

    replies = [
        await boundary.invoke(RunContext(RUN), envelope(f"c{i}", arguments=arguments))
        for i, arguments in enumerate(inputs)
    ]

    assert [outcome(reply) for reply in replies] == ["READY"] * 3
    for i in range(3):
        record = await store.get(RUN, f"c{i}")
        assert record is not None and record.request == '{"q":"ü"}'.encode()


@pytest.mark.parametrize(
    "arguments",
    [{"q": "x" * (64 * 1024)}, '{"q": "' + "x" * (256 * 1024) + '"}'],
    ids=["object", "json-text-past-parse-bound"],
)
async def test_request_over_its_byte_limit_is_refused(
    store: Store, redis: Redis, namespace: str, arguments: Any
):
    """A request over Limits.request_bytes is REQUEST_TOO_LARGE, whose message names the
    request limit and its size, also when the text was too long even to parse."""
    tool = FakeTool()
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: tool.spec()})

    await assert_refused_before_execution(
        boundary,
        tool,
        envelope(arguments=arguments),
        ErrorCode.REQUEST_TOO_LARGE,
        redis=redis,
        namespace=namespace,
        message="The tool request is larger than the 64 KiB request limit.",
    )


@pytest.mark.parametrize(
    ("options", "call_tool", "code"),
    [
        ({}, "no-such-tool", ErrorCode.UNKNOWN_TOOL),
        ({}, [TOOL], ErrorCode.UNKNOWN_TOOL),
        ({}, None, ErrorCode.UNKNOWN_TOOL),
        ({"authorized": False}, TOOL, ErrorCode.UNAUTHORIZED),
        ({"read_only": False}, TOOL, ErrorCode.NOT_READ_ONLY),
    ],
    ids=["unknown-tool", "unhashable-tool-name", "no-tool-name", "unauthorized", "not-read-only"],
)
async def test_tool_spec_refusals(
    store: Store,
    redis: Redis,
    namespace: str,
    options: dict[str, bool],
    call_tool: Any,
    code: ErrorCode,
):
    """An unknown (or non-string) tool name, authorized=False and read_only=False are refused
    before execution."""
    tool = FakeTool()
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: tool.spec(**options)})

    await assert_refused_before_execution(
        boundary, tool, envelope(tool=call_tool), code, redis=redis, namespace=namespace
    )


@pytest.mark.parametrize("name", ["bad name", "run:tool", "{tag}", "", "t" * 129, "é"])
async def test_a_tool_registered_under_a_name_the_store_refuses_is_refused_at_construction(
    store: Store, name: str
):
    """A boundary is not built with a tool name the writer would refuse on every call."""
    with pytest.raises(InvalidArgument, match="tool names not allowed"):
        ToolBoundary(store, {TOOL: FakeTool().spec(), name: FakeTool().spec()})
