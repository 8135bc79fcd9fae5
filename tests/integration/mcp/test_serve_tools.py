"""ToolSpecs served over MCP: the SDK's own client, in-process memory streams, real Redis."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from typing import Any

import pytest
from mcp_types import CallToolResult, TextContent

from canon.integrations.mcp import (
    INVOCATION_ID_KEY,
    RUN_ID_KEY,
    TOOL_CALL_ID_KEY,
    RunOptions,
    call_meta,
    call_tool,
)
from eventstore import Projection, Store, ToolBoundary, ToolSpec
from machine.codes import Status
from machine.ids import invocation_id
from tests.support.mcp_client import connected
from tests.support.provider_ids import ACCEPTED

RUN = "run-mcp"
SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {"q": {"type": "string"}},
    "required": ["q"],
}


class Counting:
    """An executor that counts its calls and fails on the query ``fail``."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, arguments: dict[str, Any], call: Any) -> Any:
        self.calls.append(arguments)
        if arguments.get("q") == "fail":
            raise RuntimeError("tool detail PAYLOAD-MARKER")
        return {"answer": arguments.get("q", "none"), "internal": "PAYLOAD-MARKER raw only"}


def project(raw: Any, call: Any) -> Projection:
    return Projection(result={"answer": raw["answer"]}, evidence_status="EVIDENCE_FOUND")


def specs(executor: Counting) -> dict[str, ToolSpec]:
    return {
        "lookup": ToolSpec(
            executor=executor,
            projector=project,
            description="Look a query up.",
            input_schema=SCHEMA,
        ),
        "noargs": ToolSpec(executor=executor, projector=project),
        "forbidden": ToolSpec(executor=executor, projector=project, authorized=False),
    }


def payload(result: CallToolResult) -> Any:
    [block] = result.content
    assert isinstance(block, TextContent)
    return json.loads(block.text)


@pytest.fixture
async def served(make_store: Any) -> AsyncIterator[tuple[Store, ToolBoundary, Counting]]:
    store: Store = make_store()
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    executor = Counting()
    boundary = ToolBoundary(store, specs(executor), on_duplicate="replay")
    try:
        yield store, boundary, executor
    finally:
        boundary.close()


async def test_tools_are_listed_with_their_descriptions_and_input_schemas(served: Any) -> None:
    """The listing is the ToolSpecs: names, descriptions, schemas (any object by default)."""
    _, boundary, executor = served
    async with connected(boundary, specs(executor), run_id=RUN) as session:
        listing = {tool.name: tool for tool in (await session.list_tools()).tools}
    assert set(listing) == {"lookup", "noargs", "forbidden"}
    assert listing["lookup"].description == "Look a query up."
    assert listing["lookup"].input_schema == SCHEMA
    assert listing["noargs"].input_schema == {"type": "object"}
    assert listing["noargs"].description is None


async def test_a_call_is_recorded_under_the_hosts_meta_ids_exactly(served: Any) -> None:
    """A provider-shaped id in ``_meta`` is the record's tool call id, unchanged."""
    store, boundary, executor = served
    call_id = ACCEPTED["kimi"]
    async with connected(boundary, specs(executor)) as session:
        result = await call_tool(session, "lookup", {"q": "x"}, tool_call_id=call_id, run_id=RUN)
    assert not result.is_error
    assert payload(result) == {"answer": "x"}
    assert result.meta == {
        RUN_ID_KEY: RUN,
        TOOL_CALL_ID_KEY: call_id,
        INVOCATION_ID_KEY: invocation_id(RUN, call_id),
    }
    record = await store.get(RUN, call_id)
    assert record is not None and record.state.status is Status.READY
    assert json.loads(record.request) == {"q": "x"}
    assert b"PAYLOAD-MARKER" not in json.dumps(payload(result)).encode()


async def test_errors_are_iserror_results_with_the_safe_error(served: Any) -> None:
    """A failing, unknown or unauthorized tool answers isError with the safe error JSON."""
    _, boundary, executor = served
    async with connected(boundary, specs(executor), run_id=RUN) as session:
        failed = await call_tool(session, "lookup", {"q": "fail"}, tool_call_id="call_f")
        unknown = await call_tool(session, "nope", {}, tool_call_id="call_u")
        refused = await call_tool(session, "forbidden", {}, tool_call_id="call_a")
    assert [r.is_error for r in (failed, unknown, refused)] == [True, True, True]
    assert payload(failed) == {
        "error_code": "EXECUTION_FAILED",
        "message": "The tool failed while executing.",
    }
    assert payload(unknown)["error_code"] == "UNKNOWN_TOOL"
    assert payload(refused)["error_code"] == "UNAUTHORIZED"
    assert "PAYLOAD-MARKER" not in failed.model_dump_json()
    assert failed.meta is not None and failed.meta[INVOCATION_ID_KEY] == invocation_id(
        RUN, "call_f"
    )
    assert INVOCATION_ID_KEY not in (unknown.meta or {})
    assert len(executor.calls) == 1


async def test_omitted_arguments_are_an_empty_object(served: Any) -> None:
    """``tools/call`` without ``arguments`` runs the tool with ``{}``."""
    store, boundary, executor = served
    async with connected(boundary, specs(executor), run_id=RUN) as session:
        result = await call_tool(session, "noargs", tool_call_id="call_n")
    assert payload(result) == {"answer": "none"}
    assert executor.calls == [{}]
    record = await store.get(RUN, "call_n")
    assert record is not None and json.loads(record.request) == {}


async def test_parallel_calls_each_get_their_own_reply(served: Any) -> None:
    """Five calls in flight at once on one connection, one failing: each answered as itself."""
    store, boundary, executor = served
    queries = ["a", "b", "fail", "c", "d"]
    async with connected(boundary, specs(executor), run_id=RUN) as session:
        results = await asyncio.gather(
            *(
                call_tool(session, "lookup", {"q": q}, tool_call_id=f"call_{i}")
                for i, q in enumerate(queries)
            )
        )
    for i, (q, result) in enumerate(zip(queries, results, strict=True)):
        assert result.meta is not None and result.meta[TOOL_CALL_ID_KEY] == f"call_{i}"
        if q == "fail":
            assert result.is_error and payload(result)["error_code"] == "EXECUTION_FAILED"
        else:
            assert payload(result) == {"answer": q}
        assert await store.get(RUN, f"call_{i}") is not None


async def test_a_resent_call_replays_without_running_the_tool_again(served: Any) -> None:
    """The same ``_meta`` id twice (a host's retry): one execution, the same result."""
    _, boundary, executor = served
    async with connected(boundary, specs(executor), run_id=RUN) as session:
        first = await call_tool(session, "lookup", {"q": "x"}, tool_call_id="call_r")
    async with connected(boundary, specs(executor), run_id=RUN) as session:
        again = await call_tool(session, "lookup", {"q": "x"}, tool_call_id="call_r")
    assert payload(first) == payload(again) == {"answer": "x"}
    assert first.meta == again.meta
    assert len(executor.calls) == 1


async def test_hosts_without_ids_never_collide_across_connections(served: Any) -> None:
    """No ``_meta`` ids: each connection's fallback ids are its own, so two records exist."""
    store, boundary, executor = served
    results = []
    for _ in range(2):
        async with connected(boundary, specs(executor), run_id=RUN) as session:
            # The first request of each connection: the same JSON-RPC request id.
            results.append(await session.call_tool("lookup", {"q": "x"}))
    ids = [result.meta[TOOL_CALL_ID_KEY] for result in results if result.meta]
    assert len(set(ids)) == 2
    assert all(call_id.startswith("mcp-") for call_id in ids)
    assert len(executor.calls) == 2
    for call_id in ids:
        record = await store.get(RUN, call_id)
        assert record is not None and record.state.status is Status.READY


async def test_meta_ids_that_are_not_strings_are_refused_never_replaced(served: Any) -> None:
    """A number where an id belongs is INVALID_TOOL_CALL_ID; nothing runs."""
    _, boundary, executor = served
    async with connected(boundary, specs(executor), run_id=RUN) as session:
        result = await session.call_tool(
            "lookup", {"q": "x"}, meta={**call_meta(run_id=RUN), TOOL_CALL_ID_KEY: 7}
        )
    assert result.is_error and payload(result)["error_code"] == "INVALID_TOOL_CALL_ID"
    assert executor.calls == []


async def test_with_open_runs_each_connections_run_is_opened_with_the_options(
    served: Any,
) -> None:
    """No run id anywhere: ``open_runs`` opens ``mcp-<connection id>`` with its budget."""
    store, boundary, executor = served
    options = RunOptions(deadline=timedelta(minutes=1), budget=1)
    async with connected(boundary, specs(executor), open_runs=(store, options)) as session:
        first = await session.call_tool("lookup", {"q": "x"})
        second = await session.call_tool("lookup", {"q": "y"})
    assert first.meta is not None and first.meta[RUN_ID_KEY].startswith("mcp-")
    assert payload(first) == {"answer": "x"}
    assert payload(second)["error_code"] == "RUN_BUDGET_EXHAUSTED"
    info = await store.run_info(first.meta[RUN_ID_KEY])
    assert info is not None


async def test_without_open_runs_an_unopened_run_is_refused_unrun(served: Any) -> None:
    """The harness opens its runs: a call into a run nobody opened runs nothing."""
    _, boundary, executor = served
    async with connected(boundary, specs(executor)) as session:
        result = await session.call_tool("lookup", {"q": "x"})
    assert result.is_error and payload(result)["error_code"] == "RUN_INACTIVE"
    assert executor.calls == []
