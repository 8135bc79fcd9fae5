"""A tool that shows its own error text (``ToolSpec.error_result``) meets the size limits.

A payload over a limit is a size error, whoever the tool is: its reply names the limit
that was hit and the callable is never asked (the tool raised nothing). A tool's text over
the agent result limit is no size error: the call is EXECUTION_FAILED and the agent reads
that code's fixed message, as for any text that cannot be kept. A retry answered from the
record (``on_duplicate="replay"``) reads what the first reply said in each case, also
from a boundary whose limits have changed since.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import anyio
import msgspec
import pytest
from mcp import ClientSession
from mcp.shared.memory import create_client_server_memory_streams
from mcp_types import TextContent

from canon.integrations.mcp import call_tool, serve_tools
from eventstore import Limits, RunContext, Store, ToolBoundary, ToolError, ToolSpec
from machine.codes import SAFE_MESSAGES, ErrorCode
from machine.events import Failed
from machine.failure_detail import SIZE_LIMIT_TYPE, decode_failure_detail
from machine.ids import invocation_id
from machine.limits import LimitName
from projections.receipts.inspection import inspect_invocation
from tests.support.calls import RUN, TOOL, assert_safe_error, envelope
from tests.support.log_scan import forbid_in_logs
from tests.support.tools import FakeTool

#: In every text a tool raises; forbidden in every log of the session.
MARKER = "TOOL-ERROR-LIMIT-7c2d"
forbid_in_logs(MARKER)
TEXT = f"unknown city 'Pariss' ({MARKER}); did you mean 'Paris'?"


class CityNotFound(Exception):
    """What the tests' raising tools raise."""


class Asked:
    """An ``error_result`` that counts how often it was asked."""

    def __init__(self) -> None:
        self.errors: list[Exception] = []

    def __call__(self, error: Exception) -> str:
        self.errors.append(error)
        return str(error)


async def opened(store: Store) -> None:
    """Open the tests' run."""
    await store.open_run(RUN, deadline=timedelta(minutes=5))


async def failed_event(store: Store, call: str) -> Failed:
    """The invocation's last event, which must be its Failed event."""
    events = await store.reader.events(RUN, call)
    failed = events[-1].event
    assert isinstance(failed, Failed)
    return failed


async def receipt_message(store: Store, call: str) -> str:
    """The message of the invocation's receipt, built from the record."""
    receipt = await inspect_invocation(store, RUN, invocation_id(RUN, call))
    assert receipt.result is not None
    message = receipt.result["message"]
    assert isinstance(message, str)
    return message


async def test_a_request_over_its_limit_names_the_limit_for_a_tool_with_a_text(
    make_store: Any,
) -> None:
    """Refused in preflight, before the tool could raise: REQUEST_TOO_LARGE naming the
    request limit, no record, the tool never run and its callable never asked."""
    store: Store = make_store(limits=Limits(request_bytes=64))
    await opened(store)
    tool, asked = FakeTool(raise_in_executor=CityNotFound(TEXT)), Asked()
    boundary = ToolBoundary(store, {TOOL: tool.spec(error_result=asked)})

    reply = await boundary.invoke(RunContext(RUN), envelope("c1", arguments={"q": "x" * 100}))

    assert_safe_error(
        reply,
        ErrorCode.REQUEST_TOO_LARGE,
        "The tool request is larger than the 64 B request limit.",
    )
    assert isinstance(reply, ToolError) and not reply.from_tool
    assert reply.invocation_id is None
    assert (tool.executed, asked.errors) == (0, [])
    assert boundary.refusals[ErrorCode.REQUEST_TOO_LARGE] == 1


@pytest.mark.parametrize(
    ("limits", "fake", "name", "message"),
    [
        pytest.param(
            Limits(raw_bytes=1000),
            {"raw": "x" * 1001},
            LimitName.RAW,
            "The raw tool response is larger than the 1000 B raw response limit.",
            id="raw",
        ),
        pytest.param(
            Limits(result_bytes=1000),
            {"result": "x" * 1001},
            LimitName.RESULT,
            "The tool result is larger than the 1000 B agent result limit.",
            id="result",
        ),
    ],
)
async def test_a_payload_over_its_limit_names_the_limit_for_a_tool_with_a_text(
    make_store: Any, limits: Limits, fake: dict[str, Any], name: LimitName, message: str
) -> None:
    """RESULT_TOO_LARGE naming the limit, never read as the tool's text; the callable is
    never asked, the record keeps no agent result but the size detail, the replayed retry
    reads the same message and the receipt the code's own."""
    store: Store = make_store(limits=limits)
    await opened(store)
    tool, asked = FakeTool(**fake), Asked()
    boundary = ToolBoundary(store, {TOOL: tool.spec(error_result=asked)}, on_duplicate="replay")

    first = await boundary.invoke(RunContext(RUN), envelope("c1"))
    again = await boundary.invoke(RunContext(RUN), envelope("c1"))

    assert_safe_error(first, ErrorCode.RESULT_TOO_LARGE, message)
    assert isinstance(first, ToolError) and not first.from_tool
    assert again == first
    assert (tool.executed, asked.errors) == (1, [])
    fields = await store.reader.fields(RUN, "c1")
    assert b"result" not in fields
    assert (await failed_event(store, "c1")).result_sha256 is msgspec.UNSET
    detail = decode_failure_detail(fields[b"failure_detail"])
    assert detail is not None and detail.type == SIZE_LIMIT_TYPE
    assert not isinstance(detail.limit, msgspec.UnsetType) and detail.limit.name is name
    assert await receipt_message(store, "c1") == SAFE_MESSAGES[ErrorCode.RESULT_TOO_LARGE]


async def test_a_text_over_the_result_limit_is_the_plain_execution_failed_message(
    make_store: Any,
) -> None:
    """The tool's text is over the agent result limit: EXECUTION_FAILED with its fixed
    message (not the result limit's), the exception's own failure detail, no result kept;
    the replayed retry and the receipt say the same."""
    store: Store = make_store(limits=Limits(result_bytes=32))
    await opened(store)
    tool = FakeTool(raise_in_executor=CityNotFound(TEXT))
    boundary = ToolBoundary(store, {TOOL: tool.spec(error_result=str)}, on_duplicate="replay")

    first = await boundary.invoke(RunContext(RUN), envelope("c1"))
    again = await boundary.invoke(RunContext(RUN), envelope("c1"))

    assert_safe_error(first, ErrorCode.EXECUTION_FAILED)
    assert isinstance(first, ToolError) and not first.from_tool
    assert again == first
    assert tool.executed == 1
    fields = await store.reader.fields(RUN, "c1")
    assert b"result" not in fields
    detail = decode_failure_detail(fields[b"failure_detail"])
    assert detail is not None and detail.type.endswith("CityNotFound")
    assert isinstance(detail.limit, msgspec.UnsetType)
    assert await receipt_message(store, "c1") == SAFE_MESSAGES[ErrorCode.EXECUTION_FAILED]


async def test_replayed_size_and_text_errors_keep_their_messages_under_other_limits(
    make_store: Any,
) -> None:
    """Two recorded errors of tools with a text, a size error and the tool's own text,
    replayed by a boundary whose limits changed since (the text is now over its agent
    result limit): each retry reads its first reply, the tools run once."""
    store: Store = make_store(limits=Limits(raw_bytes=1000))
    await opened(store)
    raising = FakeTool(raise_in_executor=CityNotFound(TEXT))
    large = FakeTool(raw="x" * 1001)

    def tools() -> dict[str, ToolSpec]:
        return {
            TOOL: raising.spec(error_result=str),
            "large": large.spec(error_result=str),
        }

    first = ToolBoundary(store, tools(), on_duplicate="replay")
    text_first = await first.invoke(RunContext(RUN), envelope("c1"))
    size_first = await first.invoke(RunContext(RUN), envelope("c2", tool="large"))
    changed = make_store(limits=Limits(raw_bytes=4096, result_bytes=16))
    later = ToolBoundary(changed, tools(), on_duplicate="replay")

    text_again = await later.invoke(RunContext(RUN), envelope("c1"))
    size_again = await later.invoke(RunContext(RUN), envelope("c2", tool="large"))

    assert isinstance(text_first, ToolError) and text_first.from_tool
    assert (text_first.error_code, text_first.message) == (ErrorCode.EXECUTION_FAILED, TEXT)
    assert_safe_error(
        size_first,
        ErrorCode.RESULT_TOO_LARGE,
        "The raw tool response is larger than the 1000 B raw response limit.",
    )
    assert (text_again, size_again) == (text_first, size_first)
    assert (raising.executed, large.executed) == (1, 1)


@asynccontextmanager
async def mcp_session(
    boundary: ToolBoundary, specs: dict[str, ToolSpec]
) -> AsyncIterator[ClientSession]:
    """The SDK's client on ``serve_tools`` over in-memory streams."""
    async with (
        create_client_server_memory_streams() as (client_streams, server_streams),
        anyio.create_task_group() as group,
    ):
        group.start_soon(lambda: serve_tools(boundary, specs, streams=server_streams, run_id=RUN))
        async with ClientSession(*client_streams) as session:
            await session.initialize()
            yield session
        await client_streams[1].aclose()


async def test_mcp_answers_a_size_error_of_a_tool_with_a_text_with_the_safe_json(
    make_store: Any,
) -> None:
    """MCP shows a tool's own text as it is; a size error naming its limit is canon's own
    error, so it stays the safe error JSON, beside the tool's text of another call."""
    store: Store = make_store(limits=Limits(request_bytes=64))
    await opened(store)
    specs = {TOOL: FakeTool(raise_in_executor=CityNotFound(TEXT)).spec(error_result=str)}
    boundary = ToolBoundary(store, specs)

    async with mcp_session(boundary, specs) as session:
        large = await call_tool(session, TOOL, {"q": "x" * 100}, tool_call_id="c1")
        text = await call_tool(session, TOOL, {"q": 1}, tool_call_id="c2")

    assert large.is_error and text.is_error
    assert all(isinstance(result.content[0], TextContent) for result in (large, text))
    assert json.loads(large.content[0].text) == {  # type: ignore[union-attr]
        "error_code": "REQUEST_TOO_LARGE",
        "message": "The tool request is larger than the 64 B request limit.",
    }
    assert text.content[0].text == TEXT  # type: ignore[union-attr]
