"""What ``canon mcp-proxy`` answers a host for a failed call, with ``--forward-tool-errors``."""

from __future__ import annotations

import json

from canon.mcp_proxy.answers import error_result, safe_error_result
from canon.mcp_proxy.relay import (
    UpstreamCallError,
    UpstreamFault,
    UpstreamToolError,
    upstream_error_text,
)
from eventstore.boundary.contracts import ToolError
from machine.codes import SAFE_MESSAGES, ErrorCode
from machine.limits import LimitHit, LimitName, Limits

LIMITS = Limits(request_bytes=1024, raw_bytes=4096, result_bytes=2048, record_bytes=80_000)


def test_only_an_upstream_is_error_result_gives_a_text_to_forward() -> None:
    """The upstream's own ``isError`` text, whole; any other failure of the call gives ``""``
    (the safe error, or the JSON-RPC error, stays the host's answer)."""
    text = "bad city\n" + "x" * 3000
    error = UpstreamToolError(text)
    assert upstream_error_text(error) == text
    assert str(error) == text[:2000]
    assert isinstance(error, UpstreamCallError)
    for other in (
        UpstreamCallError("the upstream's result is not an object"),
        UpstreamFault({"code": -32001, "message": "gone"}),
        TimeoutError(),
    ):
        assert upstream_error_text(other) == ""


def test_a_recorded_tool_text_is_one_is_error_text_block_as_it_is() -> None:
    reply = ToolError.of(ErrorCode.EXECUTION_FAILED, message="no city named 'Pariss'")
    assert reply.from_tool
    assert error_result(reply, limits=LIMITS) == {
        "content": [{"type": "text", "text": "no city named 'Pariss'"}],
        "isError": True,
    }


def test_any_other_failure_is_the_safe_error_json() -> None:
    reply = ToolError.of(ErrorCode.EXECUTION_FAILED)
    assert not reply.from_tool
    answer = error_result(reply, limits=LIMITS)
    assert answer == safe_error_result(reply, limits=LIMITS)
    assert answer["isError"] is True
    assert json.loads(answer["content"][0]["text"]) == {
        "error_code": "EXECUTION_FAILED",
        "message": SAFE_MESSAGES[ErrorCode.EXECUTION_FAILED],
    }


def test_a_size_error_keeps_the_limit_hint_naming_its_flag() -> None:
    """A size error's message names its limit but is no tool text: the safe JSON, with the
    ``limit`` entry naming the ``canon mcp-proxy`` flag."""
    hit = LimitHit(name=LimitName.RESULT, limit_bytes=2048, actual_bytes=5000)
    reply = ToolError.of(ErrorCode.RESULT_TOO_LARGE, limit=hit)
    assert not reply.from_tool
    answer = error_result(reply, limits=LIMITS)
    payload = json.loads(answer["content"][0]["text"])
    assert payload["error_code"] == "RESULT_TOO_LARGE"
    assert payload["message"] == hit.message()
    assert "--max-result-bytes" in payload["limit"]
    request = ToolError.of(
        ErrorCode.REQUEST_TOO_LARGE, limit=LimitHit(name=LimitName.REQUEST, limit_bytes=1024)
    )
    assert (
        "--max-request-bytes"
        in json.loads(error_result(request, limits=LIMITS)["content"][0]["text"])["limit"]
    )
