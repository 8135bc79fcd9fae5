"""Replies a harness can route (ids on both kinds), and the agent sees exactly what is stored."""

from __future__ import annotations

import dataclasses
import math
import pathlib
import re
from typing import Any

import msgspec
import pytest

import eventstore
from eventstore import (
    Projection,
    RunContext,
    Store,
    ToolBoundary,
    ToolError,
    ToolResult,
    reply_to_builtins,
)
from machine.codes import SAFE_MESSAGES, ErrorCode, Status
from machine.ids import invocation_id
from tests.support.calls import RUN, TOOL, envelope, open_run
from tests.support.tools import FakeTool

README = pathlib.Path(__file__).parents[3] / "README.md"


def test_reply_to_builtins_is_exported_beside_the_boundary():
    """Harnesses import the reply converter from where they import the boundary."""
    assert "reply_to_builtins" in eventstore.__all__
    assert eventstore.reply_to_builtins is reply_to_builtins


async def test_a_result_names_its_call_and_its_record(store: Store):
    """A READY reply is exactly status, result, evidence, scope and both ids."""
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: FakeTool(result={"count": 3}).spec()})

    reply = await boundary.invoke(RunContext(RUN), envelope("call_7"))

    assert reply_to_builtins(reply) == {
        "status": "READY",
        "result": {"count": 3},
        "evidence_status": "EVIDENCE_FOUND",
        "scope": "orders:2026",
        "tool_call_id": "call_7",
        "invocation_id": invocation_id(RUN, "call_7"),
    }


async def test_an_error_after_creation_names_its_record(store: Store):
    """An ERROR reply of a call that has a record carries both ids."""
    await open_run(store)
    tool = FakeTool(raise_in_executor=RuntimeError("x"))
    boundary = ToolBoundary(store, {TOOL: tool.spec()})

    reply = await boundary.invoke(RunContext(RUN), envelope("call_7"))

    assert reply_to_builtins(reply) == {
        "status": "ERROR",
        "error_code": "EXECUTION_FAILED",
        "message": SAFE_MESSAGES[ErrorCode.EXECUTION_FAILED],
        "tool_call_id": "call_7",
        "invocation_id": invocation_id(RUN, "call_7"),
    }


async def test_a_refusal_names_the_call_but_no_record(store: Store):
    """A refusal before creation carries the tool call id and no invocation id (none exists)."""
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: FakeTool().spec()})

    reply = await boundary.invoke(RunContext(RUN), envelope("call_7", tool="nope"))

    assert reply == ToolError.of(ErrorCode.UNKNOWN_TOOL, tool_call_id="call_7")
    assert reply_to_builtins(reply)["invocation_id"] is None


@pytest.mark.parametrize("call_id", ["", "a b", "a\nb", None])
async def test_a_refused_id_is_never_echoed(store: Store, call_id: Any):
    """An id refused as unsafe is not repeated in the reply."""
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: FakeTool().spec()})

    reply = await boundary.invoke(RunContext(RUN), envelope(call_id))

    assert reply == ToolError.of(ErrorCode.INVALID_TOOL_CALL_ID)


def readme_reply(kind: str) -> dict[str, Any]:
    """The reply dict the README shows after ``<!-- reply: kind -->``."""
    text = README.read_text()
    found = re.search(rf"<!-- reply: {kind} -->\n```python\n(.*?)```", text, re.S)
    assert found is not None, kind
    shown: dict[str, Any] = eval(found.group(1))  # our own README's literal
    return shown


async def test_the_readme_shows_the_exact_reply_dicts(store: Store):
    """The README's result and error dicts are what reply_to_builtins returns for its example."""
    await open_run(store, "run-1")

    def search(arguments: Any, call: Any) -> Any:
        return {"hits": [{"id": 7, "title": "Refund policy", "body": "Refunds within 30 days."}]}

    def project(raw: Any, call: Any) -> Projection:
        titles = [hit["title"] for hit in raw["hits"]]
        return Projection(result={"titles": titles}, evidence_status="EVIDENCE_FOUND", scope="kb")

    def failing(arguments: Any, call: Any) -> Any:
        raise TimeoutError("upstream")

    boundary = ToolBoundary(
        store,
        {
            "search": eventstore.ToolSpec(executor=search, projector=project),
            "fetch": eventstore.ToolSpec(executor=failing, projector=project),
        },
    )
    result = await boundary.invoke(
        RunContext("run-1"), envelope("call-1", tool="search", run_id="run-1")
    )
    error = await boundary.invoke(
        RunContext("run-1"), envelope("call-2", tool="fetch", run_id="run-1")
    )

    assert reply_to_builtins(result) == readme_reply("result")
    assert reply_to_builtins(error) == readme_reply("error")


@dataclasses.dataclass
class Score:
    value: float


class Scored(msgspec.Struct):
    scores: list[float]


@pytest.mark.parametrize(
    "result",
    [
        math.nan,
        math.inf,
        -math.inf,
        {"score": math.nan},
        [1.0, [2.0, {"deep": math.inf}]],
        {"pair": (0.5, -math.inf)},
        Score(math.nan),
        Scored(scores=[1.0, math.nan]),
        {"none": None, "nan": math.nan},
    ],
    ids=["nan", "inf", "-inf", "dict", "nested", "tuple", "dataclass", "struct", "beside-null"],
)
async def test_a_non_finite_number_in_a_result_is_refused(store: Store, result: Any):
    """NaN or an infinity anywhere in a result is SERIALIZATION_FAILED, in the reply and in the
    record: JSON would store null and the agent would be shown a value the record lacks."""
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: FakeTool(result=result).spec()})

    reply = await boundary.invoke(RunContext(RUN), envelope())

    assert isinstance(reply, ToolError) and reply.error_code is ErrorCode.SERIALIZATION_FAILED
    record = await store.get(RUN, "call_1")
    assert record is not None and record.result is None
    assert (record.state.status, record.state.error_code) == (
        Status.ERROR,
        ErrorCode.SERIALIZATION_FAILED,
    )


@pytest.mark.parametrize(
    "result",
    [
        {"none": None, "score": 0.5, "big": 2**63, "tiny": 5e-324},
        (1, 2.5, None),
        Score(1.5),
        Scored(scores=[1.0, -0.0]),
        [None, [None]],
    ],
    ids=["finite", "tuple", "dataclass", "struct", "nulls"],
)
async def test_the_agent_is_shown_exactly_what_the_record_holds(store: Store, result: Any):
    """A finite result reaches the agent as the stored JSON decodes: reply and record agree."""
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: FakeTool(result=result).spec()})

    reply = await boundary.invoke(RunContext(RUN), envelope())

    assert isinstance(reply, ToolResult), reply
    record = await store.get(RUN, "call_1")
    assert record is not None and record.result is not None
    assert reply.result == msgspec.json.decode(record.result)
    assert msgspec.json.encode(reply.result) == record.result
