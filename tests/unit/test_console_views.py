"""What the console shows of text it did not write: every invisible or direction-changing
character as a visible escape, line breaks and tabs kept; long text cut, saying so."""

from __future__ import annotations

import pytest

from projections.console.views import cut_text, rounded_size_text, size_against, visible


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("call_1", "call_1"),
        ("call\u202etxt.exe", "call\\u202etxt.exe"),  # right-to-left override
        ("\u2066\u2067\u2068\u2069", "\\u2066\\u2067\\u2068\\u2069"),  # isolates
        ("\u200e\u200f\u061c", "\\u200e\\u200f\\u061c"),  # marks
        ("a\u200bb\u2060c\ufeff", "a\\u200bb\\u2060c\\ufeff"),  # zero-width, BOM
        ("\x00\x1b[31m\x7f\x85", "\\u0000\\u001b[31m\\u007f\\u0085"),  # controls
        ("\u2028\u2029", "\\u2028\\u2029"),  # line and paragraph separators
        ("\U000e0041\U000f0000", "\\U000e0041\\U000f0000"),  # tag, private use
        ("line\n\ttab", "line\n\ttab"),
        ("\r", "\\u000d"),
        ("שלום عربي", "שלום عربي"),  # letters of either direction stay as written
    ],
)
def test_invisible_and_bidi_characters_are_shown_as_escapes(text: str, shown: str) -> None:
    assert visible(text) == shown


def test_long_text_is_cut_and_says_how_long_it_was() -> None:
    assert cut_text("short", 10) == ("short", None)
    assert cut_text("x" * 11, 10) == ("x" * 10, 11)


def test_sizes_are_shown_with_their_unit_and_against_their_limit() -> None:
    assert rounded_size_text(850) == "850 B"
    assert rounded_size_text(16 * 1024) == "16 KiB"
    assert rounded_size_text(12_800) == "12.5 KiB"
    assert rounded_size_text(1_677_722) == "1.6 MiB"
    assert size_against(1_677_722, 1024 * 1024, "agent result") == (
        "1.6 MiB, over the 1 MiB agent result limit"
    )
    assert size_against(30, 64 * 1024, "request") == "30 B, within the 64 KiB request limit"
