"""encode_error_text: a tool's own error text as the agent result it is stored as, or none."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from machine.results import encode_error_text
from machine.scrub import FILTERED, scrub_secrets


def test_a_text_is_stored_as_the_json_string_the_agent_is_shown() -> None:
    """Scrubbed, then encoded as one JSON string; control characters escaped by JSON."""
    text = "unknown city 'Pariss'\nretry with password=hunter2"
    stored = encode_error_text(text, scrub_secrets, 1024)
    assert stored is not None
    assert msgspec.json.decode(stored) == f"unknown city 'Pariss'\nretry with password={FILTERED}"


def test_text_that_is_not_utf8_is_escaped_not_dropped() -> None:
    """A lone surrogate (no UTF-8 spelling) is kept as a backslash escape."""
    stored = encode_error_text("bad \ud800 byte", scrub_secrets, 1024)
    assert stored is not None and msgspec.json.decode(stored) == "bad \\ud800 byte"


@pytest.mark.parametrize("limit", [10, 11])
def test_the_limit_counts_the_stored_bytes_and_nothing_is_cut(limit: int) -> None:
    """Eight characters, two of them two bytes each, plus the quotes: 12 bytes stored;
    a text over the limit is not kept at all."""
    assert len(msgspec.json.encode("ééabcdef")) == 12
    assert encode_error_text("ééabcdef", scrub_secrets, 12) == msgspec.json.encode("ééabcdef")
    assert encode_error_text("ééabcdef", scrub_secrets, limit) is None


@pytest.mark.parametrize("value", [None, b"text", 42, ["text"], "", "  \t\n"])
def test_anything_but_a_non_empty_str_keeps_nothing(value: Any) -> None:
    """The agent then sees the code's fixed message."""
    assert encode_error_text(value, scrub_secrets, 1024) is None


def _raising_scrubber(text: str) -> str:
    """A scrubber that breaks."""
    raise RuntimeError("scrubber broke")


@pytest.mark.parametrize(
    "scrub",
    [
        pytest.param(_raising_scrubber, id="raises"),
        pytest.param(lambda text: None, id="no-str"),
        pytest.param(lambda text: "\ud800", id="lone-surrogate"),
    ],
)
def test_a_scrubber_that_fails_keeps_nothing(scrub: Any) -> None:
    """Text a scrubber could not vouch for is never shown: nothing is kept."""
    assert encode_error_text("api_key=abc", scrub, 1024) is None
