"""What every adapter shares: the extra's import error, arguments, and reply texts."""

from __future__ import annotations

import json

import pytest

from canon.integrations._shared import (
    arguments_or_empty,
    is_error,
    reply_content,
    reply_payload,
    require,
)
from eventstore import ToolError, ToolResult
from machine.codes import ErrorCode, EvidenceStatus


def test_a_missing_sdk_is_one_import_error_naming_the_extra() -> None:
    """The message says which extra to install; nothing else is raised."""
    with pytest.raises(ImportError, match=r"pip install 'canon-store\[openai\]'"):
        require("canon_no_such_sdk_module", "openai")


def test_an_installed_module_is_returned() -> None:
    """``require`` hands back the module itself."""
    assert require("json", "openai") is json


@pytest.mark.parametrize("empty", [None, "", "  ", b""])
def test_no_arguments_mean_an_empty_object(empty: str | bytes | None) -> None:
    """A call of a tool without parameters sends "" or nothing: that is ``{}``."""
    assert arguments_or_empty(empty) == "{}"


@pytest.mark.parametrize("sent", ['{"q": 1}', '{"q": ', "[1, 2]", b'{"q": 1}'])
def test_any_other_arguments_reach_the_boundary_as_sent(sent: str | bytes) -> None:
    """Truncated or non-object JSON is not repaired here: the boundary refuses it."""
    assert arguments_or_empty(sent) == sent


def test_a_result_is_shown_as_its_bounded_value() -> None:
    """READY: the model sees the bounded result as JSON, nothing of the record."""
    reply = ToolResult(
        result={"titles": ["Refund policy"]},
        evidence_status=EvidenceStatus.EVIDENCE_FOUND,
        scope="kb",
        tool_call_id="call_1",
        invocation_id="a" * 64,
    )
    assert not is_error(reply)
    assert reply_payload(reply) == {"titles": ["Refund policy"]}
    assert json.loads(reply_content(reply)) == {"titles": ["Refund policy"]}


def test_an_error_is_shown_as_its_code_and_fixed_message() -> None:
    """ERROR: the model sees the stable code and its fixed message only."""
    reply = ToolError.of(ErrorCode.UNKNOWN_TOOL, tool_call_id="call_1")
    assert is_error(reply)
    assert json.loads(reply_content(reply)) == {
        "error_code": "UNKNOWN_TOOL",
        "message": reply.message,
    }
