"""A tool's approval policy lives on its ToolSpec: one answer for the boundary and for
every adapter that asks before a framework runs the tool."""

from __future__ import annotations

from typing import Any

import pytest

from eventstore import Projection, ToolCall, ToolSpec

CALL = ToolCall(run_id="run-a", tool_call_id="c1", invocation_id="0" * 64, tool="refund")


def spec(approval: Any) -> ToolSpec:
    return ToolSpec(
        executor=lambda arguments, call: None,
        projector=lambda raw, call: Projection(result=None, evidence_status="NO_EVIDENCE"),
        read_only=approval is False,
        approval=approval,
    )


def raises(arguments: dict[str, Any], call: ToolCall) -> bool:
    raise RuntimeError("policy bug")


@pytest.mark.parametrize(
    ("approval", "governed", "needed"),
    [
        (False, False, False),
        (True, True, True),
        (lambda arguments, call: arguments["amount"] >= 100, True, True),
        (lambda arguments, call: arguments["amount"] >= 1000, True, False),
        (lambda arguments, call: None, True, True),
        (raises, True, True),
    ],
)
def test_the_policy_answers_per_call_and_fails_towards_an_approval(
    approval: Any, governed: bool, needed: bool
) -> None:
    """True or a policy governs a tool; a policy's False alone lets a call run at once:
    anything else it answers, and a policy that raises, means the call waits."""
    tool = spec(approval)
    assert tool.governed is governed
    assert tool.needs_approval({"amount": 125}, CALL) is needed
