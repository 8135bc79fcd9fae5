"""Governed ToolSpecs served over MCP (``serve_tools``): the SDK's own client, real Redis.

A governed call answers at once with a pending result (not an error; its approval id and,
with a console URL, its console page in ``_meta``); the tool runs only when the host sends
the same call again after an operator approved it, and then once; a denial is an
``isError`` result with APPROVAL_DENIED.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from mcp import ClientSession
from mcp_types import CallToolResult

from canon.integrations.mcp import (
    APPROVAL_ID_KEY,
    CONSOLE_URL_KEY,
    INVOCATION_ID_KEY,
    call_tool,
)
from eventstore import Projection, Store, ToolBoundary, ToolSpec
from eventstore.boundary.contracts import ToolCall
from machine.codes import SAFE_MESSAGES, ErrorCode, Stage, Status
from machine.ids import invocation_id
from tests.support.mcp_client import assert_pending, connected, text_of

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-governed-mcp"
ORDER = {"amount": 125, "to": "acct-9"}
CONSOLE = "https://ops.example.com/console/"


class Refunds:
    """A side-effecting tool that counts what it did, so a test can see it ran once."""

    def __init__(self) -> None:
        self.done: list[dict[str, Any]] = []

    async def __call__(self, arguments: dict[str, Any], call: ToolCall) -> Any:
        self.done.append(arguments)
        return {"refunded": arguments["amount"]}


def project(raw: Any, call: ToolCall) -> Projection:
    return Projection(result=raw, evidence_status="EVIDENCE_FOUND", scope="refunds")


def large(arguments: dict[str, Any], call: ToolCall) -> bool:
    """The approval policy: only refunds over 100 wait for an operator."""
    return bool(arguments["amount"] > 100)


def specs(refunds: Refunds) -> dict[str, ToolSpec]:
    return {
        "refund": ToolSpec(executor=refunds, projector=project, read_only=False, approval=True),
        "small_refund": ToolSpec(
            executor=refunds, projector=project, read_only=False, approval=large
        ),
    }


@pytest.fixture
async def served(make_store: Any) -> AsyncIterator[tuple[Store, ToolBoundary, Refunds]]:
    store: Store = make_store()
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    refunds = Refunds()
    boundary = ToolBoundary(store, specs(refunds))
    try:
        yield store, boundary, refunds
    finally:
        boundary.close()


async def refund(session: ClientSession, call: str = "c1", **changed: Any) -> CallToolResult:
    return await call_tool(session, "refund", {**ORDER, **changed}, tool_call_id=call, run_id=RUN)


async def test_a_governed_call_answers_pending_with_its_console_page(served: Any) -> None:
    """Pending at once, its console page named; the tool has not run, a retry is pending."""
    store, boundary, refunds = served
    async with connected(boundary, specs(refunds), console_url=CONSOLE) as session:
        first = await refund(session)
        again = await refund(session)
    approval_id = assert_pending(first, RUN, "c1")
    assert assert_pending(again, RUN, "c1") == approval_id
    assert first.meta is not None
    assert first.meta[CONSOLE_URL_KEY] == (
        f"https://ops.example.com/console/runs/{RUN}/invocations/{invocation_id(RUN, 'c1')}"
    )
    assert refunds.done == []
    record = await store.get(RUN, "c1")
    assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL
    assert record.state.approval_id == approval_id


async def test_approved_the_retry_runs_the_tool_once_and_later_retries_replay(
    served: Any,
) -> None:
    """``store.decide`` approves; the same call again runs it once; later, the recorded
    answer; other arguments under that id are refused. No console URL unless asked."""
    store, boundary, refunds = served
    async with connected(boundary, specs(refunds)) as session:
        pending = await refund(session)
        assert_pending(pending, RUN, "c1")
        assert pending.meta is not None and CONSOLE_URL_KEY not in pending.meta
        decision = await store.decide(RUN, "c1", approve=True, by="ops", reason="checked")
        assert decision.made_now
        assert refunds.done == []  # a decision alone runs nothing
        done = await refund(session)
        replayed = await refund(session)
        changed = await refund(session, amount=999)
    assert not done.is_error and json.loads(text_of(done)) == {"refunded": 125}
    assert done.meta is not None and APPROVAL_ID_KEY not in done.meta
    assert not replayed.is_error and json.loads(text_of(replayed)) == {"refunded": 125}
    assert changed.is_error
    assert json.loads(text_of(changed))["error_code"] == ErrorCode.DUPLICATE_TOOL_CALL.value
    assert refunds.done == [ORDER]
    record = await store.get(RUN, "c1")
    assert record is not None and record.state.status is Status.READY


async def test_a_denied_call_answers_iserror_with_the_denial(served: Any) -> None:
    """Denied: every retry is an isError result with APPROVAL_DENIED; the tool never ran."""
    store, boundary, refunds = served
    async with connected(boundary, specs(refunds)) as session:
        assert_pending(await refund(session), RUN, "c1")
        await store.decide(RUN, "c1", approve=False, by="ops", reason="not this one")
        first = await refund(session)
        again = await refund(session)
    for result in (first, again):
        assert result.is_error
        assert json.loads(text_of(result)) == {
            "error_code": "APPROVAL_DENIED",
            "message": SAFE_MESSAGES[ErrorCode.APPROVAL_DENIED],
        }
        assert result.meta is not None
        assert result.meta[INVOCATION_ID_KEY] == invocation_id(RUN, "c1")
    assert refunds.done == []


async def test_a_policy_lets_some_calls_run_at_once(served: Any) -> None:
    """``approval=callable``: a small refund runs at once, a large one waits."""
    _, boundary, refunds = served
    async with connected(boundary, specs(refunds)) as session:
        small = await call_tool(
            session, "small_refund", {"amount": 5}, tool_call_id="s1", run_id=RUN
        )
        big = await call_tool(
            session, "small_refund", {"amount": 500}, tool_call_id="s2", run_id=RUN
        )
    assert not small.is_error and json.loads(text_of(small)) == {"refunded": 5}
    assert_pending(big, RUN, "s2")
    assert refunds.done == [{"amount": 5}]


async def test_a_pause_holds_an_approved_call_and_the_resume_after_it_runs_it_once(
    served: Any,
) -> None:
    """Approve, pause, resume: still waiting (not an error); unpause, resume: it runs once."""
    store, boundary, refunds = served
    async with connected(boundary, specs(refunds)) as session:
        approval_id = assert_pending(await refund(session), RUN, "c1")
        await store.decide(RUN, "c1", approve=True, by="ops", reason="checked")
        await store.pause_run(RUN, by="ops", reason="incident")
        held = await refund(session)
        held_again = await refund(session)
        assert refunds.done == []
        await store.unpause_run(RUN, by="ops", reason="resolved")
        done = await refund(session)
        replayed = await refund(session)
    for result in (held, held_again):
        assert not result.is_error
        assert result.meta is not None and result.meta[APPROVAL_ID_KEY] == approval_id
        assert "paused" in text_of(result) and "has not run" in text_of(result)
    assert not done.is_error and json.loads(text_of(done)) == {"refunded": 125}
    assert json.loads(text_of(replayed)) == {"refunded": 125}
    assert refunds.done == [ORDER]
