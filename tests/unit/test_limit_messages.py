"""What a size error tells: the agent the limit and its configured size, the harness the
sizes as well, in the failure detail."""

from __future__ import annotations

import msgspec
import pytest

from eventstore import ToolError
from machine.codes import SAFE_MESSAGES, ErrorCode
from machine.failure_detail import (
    SIZE_LIMIT_TYPE,
    FailureDetail,
    decode_failure_detail,
    size_limit_detail,
)
from machine.limits import LimitHit, LimitName, Limits, size_text

#: The message each limit gives with the default limits, word for word.
DEFAULT_MESSAGES = {
    LimitName.REQUEST: "The tool request is larger than the 64 KiB request limit.",
    LimitName.RAW: "The raw tool response is larger than the 1 MiB raw response limit.",
    LimitName.RESULT: "The tool result is larger than the 16 KiB agent result limit.",
    LimitName.SCOPE: "The scope of the tool result is larger than the 512 B scope limit.",
    LimitName.RECORD: "The tool call's payloads together are larger than the 1120 KiB record "
    "limit.",
}


@pytest.mark.parametrize("name", list(LimitName))
def test_each_limit_names_itself_and_its_configured_size(name: LimitName) -> None:
    """With the default limits, each limit's message is the documented sentence."""
    hit = LimitHit(name=name, limit_bytes=getattr(Limits(), name.value), actual_bytes=1)
    assert hit.message() == DEFAULT_MESSAGES[name]


@pytest.mark.parametrize("name", list(LimitName))
def test_the_message_is_fixed_by_the_limit_never_by_the_payload(name: LimitName) -> None:
    """Two payloads of any sizes over the same limit read the same message; only another
    configured size changes it."""
    sizes = {
        LimitHit(name=name, limit_bytes=1000, actual_bytes=actual).message()
        for actual in (1001, 5_000_000, None)
    }
    assert len(sizes) == 1
    assert "1001" not in next(iter(sizes))
    assert LimitHit(name=name, limit_bytes=2000).message() != next(iter(sizes))


def test_request_is_request_too_large_and_every_other_limit_result_too_large() -> None:
    """The seed's codes: the request before creation, raw and result after it."""
    codes = {name: LimitHit(name=name, limit_bytes=1).code for name in LimitName}
    assert codes == {
        LimitName.REQUEST: ErrorCode.REQUEST_TOO_LARGE,
        LimitName.RAW: ErrorCode.RESULT_TOO_LARGE,
        LimitName.RESULT: ErrorCode.RESULT_TOO_LARGE,
        LimitName.SCOPE: ErrorCode.RESULT_TOO_LARGE,
        LimitName.RECORD: ErrorCode.RESULT_TOO_LARGE,
    }


def test_sizes_are_written_in_whole_units_or_bytes() -> None:
    """A size is KiB, MiB or GiB only when it is a whole number of them."""
    assert [size_text(n) for n in (1, 512, 1000, 1024, 1536, 16384, 1 << 20, 3 << 30)] == [
        "1 B",
        "512 B",
        "1000 B",
        "1 KiB",
        "1536 B",
        "16 KiB",
        "1 MiB",
        "3 GiB",
    ]


def test_a_reply_names_the_limit_of_its_own_code_only() -> None:
    """ToolError.of takes a hit's message for the hit's code, and keeps any other code's
    fixed message."""
    hit = LimitHit(name=LimitName.RESULT, limit_bytes=16384, actual_bytes=20000)
    named = ToolError.of(ErrorCode.RESULT_TOO_LARGE, limit=hit)
    other = ToolError.of(ErrorCode.EXECUTION_FAILED, limit=hit)
    assert named.message == DEFAULT_MESSAGES[LimitName.RESULT]
    assert other.message == SAFE_MESSAGES[ErrorCode.EXECUTION_FAILED]
    assert (
        ToolError.of(ErrorCode.RESULT_TOO_LARGE).message
        == SAFE_MESSAGES[ErrorCode.RESULT_TOO_LARGE]
    )


def test_a_size_message_is_never_read_as_a_tools_own_text() -> None:
    """A reply naming its limit is not ``from_tool``: only EXECUTION_FAILED carries a
    tool's text (so MCP answers a size error with canon's safe error JSON)."""
    for name in LimitName:
        hit = LimitHit(name=name, limit_bytes=1000, actual_bytes=1001)
        reply = ToolError.of(hit.code, limit=hit)
        assert reply.message == hit.message() != SAFE_MESSAGES[hit.code]
        assert not reply.from_tool


def test_a_tools_text_answers_execution_failed_only_and_a_hit_its_own_code() -> None:
    """Given both, each message goes to its own code only: the tool's text to
    EXECUTION_FAILED, the hit's to its size code; any other code keeps its fixed one."""
    hit = LimitHit(name=LimitName.RESULT, limit_bytes=16384, actual_bytes=20000)
    text = "unknown city 'Pariss'"

    failed = ToolError.of(ErrorCode.EXECUTION_FAILED, limit=hit, message=text)
    too_large = ToolError.of(ErrorCode.RESULT_TOO_LARGE, limit=hit, message=text)
    other = ToolError.of(ErrorCode.PROJECTION_FAILED, limit=hit, message=text)

    assert (failed.message, failed.from_tool) == (text, True)
    assert (too_large.message, too_large.from_tool) == (DEFAULT_MESSAGES[LimitName.RESULT], False)
    assert (other.message, other.from_tool) == (SAFE_MESSAGES[ErrorCode.PROJECTION_FAILED], False)


def test_the_size_detail_holds_the_limit_its_size_and_the_measured_size() -> None:
    """The harness-only detail: type size_limit, one line, and the hit as data."""
    hit = LimitHit(name=LimitName.RAW, limit_bytes=1 << 20, actual_bytes=(1 << 20) + 1)
    data = size_limit_detail(hit, 8192)
    assert data is not None
    assert msgspec.json.decode(data) == {
        "type": SIZE_LIMIT_TYPE,
        "message": "the raw response is 1048577 B, over the raw_bytes limit of 1048576 B (1 MiB)",
        "traceback": "",
        "cut_bytes": 0,
        "limit": {"name": "raw_bytes", "limit_bytes": 1048576, "actual_bytes": 1048577},
    }
    assert decode_failure_detail(data) == FailureDetail(
        type=SIZE_LIMIT_TYPE, message=hit.describe(), traceback="", limit=hit
    )


def test_a_size_detail_short_of_room_cuts_its_line_never_its_limit() -> None:
    """With little room the message line is cut (and counted); the limit stays whole, and
    without room for it nothing is kept."""
    hit = LimitHit(name=LimitName.RECORD, limit_bytes=500, actual_bytes=501)
    whole = size_limit_detail(hit, 8192)
    assert whole is not None
    cut = size_limit_detail(hit, len(whole) - 40)
    detail = decode_failure_detail(cut or b"")
    assert detail is not None and detail.limit == hit and detail.cut_bytes >= 40
    assert size_limit_detail(hit, 60) is None
    assert size_limit_detail(hit, 0) is None


def test_a_tampered_limit_does_not_decode() -> None:
    """A stored hit with a size that no limit can have is no detail at all."""
    bad = (
        b'{"type":"size_limit","message":"","traceback":"","cut_bytes":0,'
        b'"limit":{"name":"raw_bytes","limit_bytes":0,"actual_bytes":1}}'
    )
    assert decode_failure_detail(bad) is None
    unknown = bad.replace(b'"raw_bytes","limit_bytes":0', b'"disk_bytes","limit_bytes":9')
    assert decode_failure_detail(unknown) is None
