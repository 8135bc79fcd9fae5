"""The failure detail: type, message and traceback of a raising tool, bounded, cut loudly."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from machine.failure_detail import (
    FailureDetail,
    bounded,
    decode_failure_detail,
    failure_detail,
    type_name,
)


class ToolBroke(Exception):
    """A tool's own exception type (a qualified name outside builtins)."""


def raised(exc: BaseException) -> BaseException:
    """``exc`` after being raised, so that it carries a traceback."""
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_full_keeps_the_qualified_type_the_message_and_the_traceback() -> None:
    """The stored JSON has exactly type, message, traceback and cut_bytes, in that order."""
    data = failure_detail(raised(ToolBroke("backend said no")), "full", 8192)
    assert data is not None
    document = msgspec.json.decode(data)
    assert list(document) == ["type", "message", "traceback", "cut_bytes"]
    assert document["type"] == f"{__name__}.ToolBroke"
    assert document["message"] == "backend said no"
    assert document["traceback"].startswith("Traceback (most recent call last):")
    assert "in raised" in document["traceback"]
    assert document["traceback"].endswith("ToolBroke: backend said no\n")
    assert document["cut_bytes"] == 0


def test_builtins_keep_their_bare_name_and_asyncio_its_module() -> None:
    """ValueError is ``ValueError``; a CancelledError names where it lives."""
    assert type_name(ValueError()) == "ValueError"
    assert type_name(asyncio.CancelledError()) == "asyncio.exceptions.CancelledError"


def test_type_keeps_only_the_type_name_and_none_keeps_nothing() -> None:
    """The ``type`` policy empties message and traceback; ``none`` stores no detail."""
    exc = raised(ToolBroke("secret text"))
    data = failure_detail(exc, "type", 8192)
    assert data is not None and b"secret text" not in data
    assert decode_failure_detail(data) == FailureDetail(
        type=f"{__name__}.ToolBroke", message="", traceback="", cut_bytes=0
    )
    assert failure_detail(exc, "none", 8192) is None


@pytest.mark.parametrize("limit", [200, 1000, 4096, 8192])
def test_a_long_detail_is_cut_to_its_limit_and_says_how_much(limit: int) -> None:
    """Message and traceback are cut, the total stays within the limit, cut_bytes says what."""

    def deep(n: int) -> None:
        if n:
            deep(n - 1)
        raise ToolBroke("é" * 5000 + '"quoted"\n')

    try:
        deep(60)
    except ToolBroke as exc:
        whole = failure_detail(exc, "full", 10**7)
        data = failure_detail(exc, "full", limit)
    assert whole is not None and data is not None
    assert len(data) <= limit
    detail = decode_failure_detail(data)
    full = decode_failure_detail(whole)
    assert detail is not None and full is not None and full.cut_bytes == 0
    kept = sum(len(text.encode()) for text in (detail.type, detail.message, detail.traceback))
    original = sum(len(text.encode()) for text in (full.type, full.message, full.traceback))
    assert detail.cut_bytes > 0 and kept + detail.cut_bytes == original
    # The traceback loses its start: what is kept is its end.
    assert full.traceback.endswith(detail.traceback)
    assert full.message.startswith(detail.message)


def test_nothing_is_kept_when_not_even_the_empty_shape_fits() -> None:
    """Below the size of the empty object there is no detail, rather than a broken one."""
    exc = raised(ToolBroke("x"))
    assert failure_detail(exc, "full", 20) is None
    assert failure_detail(exc, "full", 0) is None
    empty = FailureDetail(type="", message="", traceback="", cut_bytes=0)
    assert bounded(empty, len(msgspec.json.encode(empty))) is not None


def test_an_exception_whose_str_raises_still_gets_a_detail() -> None:
    """A broken ``__str__`` cannot break the failure path."""

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    data = failure_detail(raised(Unprintable()), "full", 8192)
    detail = decode_failure_detail(data or b"")
    assert detail is not None and detail.message == "<str() of the exception failed>"


def test_text_that_is_not_utf8_is_kept_escaped() -> None:
    """A lone surrogate in a message is stored as its backslash escape."""
    data = failure_detail(raised(ToolBroke("bad \ud800 text")), "full", 8192)
    detail = decode_failure_detail(data or b"")
    assert detail is not None and detail.message == "bad \\ud800 text"


def test_bytes_that_are_not_a_detail_decode_to_none() -> None:
    """A tampered field reads as None, not as an exception."""
    assert decode_failure_detail(b"not json") is None
    assert decode_failure_detail(b'{"type":1}') is None
