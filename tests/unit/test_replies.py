"""Reply values become text in one place: bytes as UTF-8, the rest through str."""

from __future__ import annotations

import pytest

from eventstore.wire.replies import reply_text


@pytest.mark.parametrize(
    ("value", "text"),
    [(b"1700000000000-0", "1700000000000-0"), ("receipts", "receipts"), (384, "384"), (b"", "")],
)
def test_reply_values_become_text(value: object, text: str) -> None:
    """Bytes (RESP2 with decode_responses off), str and int replies all read as text."""
    assert reply_text(value) == text


def test_bytes_that_are_not_utf8_are_refused_not_guessed() -> None:
    """A reply that should be text but is not UTF-8 raises instead of turning into mojibake."""
    with pytest.raises(UnicodeDecodeError):
        reply_text(b"\xff\xfe")
