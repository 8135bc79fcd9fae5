"""Id rules and byte limits: unsafe ids are refused, limits must be positive."""

from __future__ import annotations

import hashlib
import re
import sys
import unicodedata

import pytest

from machine.ids import (
    MAX_ID_LENGTH,
    MAX_TOOL_CALL_ID_BYTES,
    invocation_id,
    is_invocation_id,
    is_run_id,
    is_tool_call_id,
    is_tool_name,
)
from machine.limits import Limits, utf8_size
from tests.support.provider_ids import ACCEPTED, REFUSED

_BAD_RUN_IDS = [
    "",
    "x" * (MAX_ID_LENGTH + 1),
    "run:1",
    "run{1",
    "run}1",
    "{s01}",
    "run 1",
    "run\t1",
    "run\n1",
    "run\r1",
    "run\x001",
    "run\x7f",
    "rün",
    "run-①",
    ".hidden",
    ".",
    "..",
    "a/b",
    "a*b",
    "a?b",
    "a[b]",
]
_RUN_IDS = [
    "a",
    "run-1",
    "call_01.retry",
    "A9",
    "x" * MAX_ID_LENGTH,
    "-dash-first",
    "_under-first",
    "thread_8f14e45f-ceea-467f-a0a6-2b4f4c5e9e1d",
]


@pytest.mark.parametrize("value", _BAD_RUN_IDS, ids=repr)
def test_unsafe_run_ids_are_refused(value: str) -> None:
    """Empty, over-long, separator, brace, glob, whitespace, control, non-ASCII and dot-led
    run ids fail."""
    assert not is_run_id(value)


@pytest.mark.parametrize("value", _RUN_IDS)
def test_key_safe_run_ids_are_accepted(value: str) -> None:
    """Letters, digits, '.', '_' and '-' up to 128 characters, not starting with '.', pass."""
    assert is_run_id(value)


@pytest.mark.parametrize("value", [None, 7, b"run-1", ["run-1"]], ids=repr)
def test_non_strings_are_not_ids(value: object) -> None:
    """Only str values can be run ids or tool call ids."""
    assert not is_run_id(value)
    assert not is_tool_call_id(value)


@pytest.mark.parametrize("name", list(ACCEPTED))
def test_every_provider_id_shape_is_a_tool_call_id(name: str) -> None:
    """Every id shape the providers publish (and ':', braces, glob characters, a leading
    '_' or '-', 512 multi-byte UTF-8 bytes) is accepted as it is."""
    assert is_tool_call_id(ACCEPTED[name])


def test_the_id_table_has_the_shapes_the_providers_publish() -> None:
    """The table's ids are the published shapes: Gemini 3 via LiteLLM is 284 characters with
    __thought__ and base64 (+, / and =), Mistral's is 9 alphanumerics, Kimi's names the
    function and an index, the longest one is 512 bytes of multi-byte UTF-8."""
    gemini = ACCEPTED["gemini-3"]
    assert len(gemini) == 284 and "__thought__" in gemini
    assert {"+", "/", "="} <= set(gemini.partition("__thought__")[2])
    assert re.fullmatch(r"[a-zA-Z0-9]{9}", ACCEPTED["mistral-9"])
    assert re.fullmatch(r"functions\.[a-z_]+:\d+", ACCEPTED["kimi"])
    assert re.fullmatch(r"call_0_[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", ACCEPTED["deepseek"])
    assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{32}", ACCEPTED["vllm"])
    longest = ACCEPTED["longest-multibyte"]
    assert len(longest.encode()) == MAX_TOOL_CALL_ID_BYTES and not longest.isascii()
    assert len(str(REFUSED["513-bytes-multibyte"]).encode()) == MAX_TOOL_CALL_ID_BYTES + 1


@pytest.mark.parametrize("name", list(REFUSED))
def test_unsafe_tool_call_ids_are_refused(name: str) -> None:
    """Empty, over 512 bytes, whitespace, control characters, lone surrogates and non-str
    values are refused."""
    assert not is_tool_call_id(REFUSED[name])


def test_the_tool_call_id_limit_is_utf8_bytes() -> None:
    """512 bytes pass and 513 fail, whatever the characters' widths."""
    for char in ("a", "é", "€", "\U0001f980"):
        count = MAX_TOOL_CALL_ID_BYTES // len(char.encode())
        longest = char * count + "a" * (MAX_TOOL_CALL_ID_BYTES - count * len(char.encode()))
        assert len(longest.encode()) == MAX_TOOL_CALL_ID_BYTES
        assert is_tool_call_id(longest)
        assert not is_tool_call_id(longest + "a")


def test_only_whitespace_control_and_surrogates_are_refused_characters() -> None:
    """Over all of Unicode, a one-character id is refused exactly when the character is
    whitespace, a control character (Cc) or a surrogate (Cs)."""
    wrong = [
        code
        for code in range(sys.maxunicode + 1)
        if is_tool_call_id(chr(code))
        == (chr(code).isspace() or unicodedata.category(chr(code)) in {"Cc", "Cs"})
    ]
    assert wrong == []


def test_tool_names_follow_the_mcp_rule() -> None:
    """Tool names are 1-128 characters of A-Z a-z 0-9 _ - . (a digit or dot may lead)."""
    for name in ("search_docs", "_private.v2-beta", "2fa.verify", ".hidden", "-x", "a" * 128):
        assert is_tool_name(name), name
    for name in ("", "a" * 129, "tool:x", "tool x", "tööl", "a/b", "a{b}", None, 7):
        assert not is_tool_name(name), name


def test_invocation_id_is_sha256_of_run_nul_call() -> None:
    """The invocation id is the SHA-256 hex of run id, NUL, tool call id."""
    expected = hashlib.sha256(b"run-1\x00call-1").hexdigest()
    assert invocation_id("run-1", "call-1") == expected
    assert is_invocation_id(expected)
    assert invocation_id("run-1", "call-1") != invocation_id("run-1c", "all-1")
    assert not is_invocation_id(expected.upper())
    assert not is_invocation_id(expected[:-1])


@pytest.mark.parametrize("field", list(Limits.__struct_fields__))
@pytest.mark.parametrize("value", [0, -1])
def test_limits_reject_non_positive_values(field: str, value: int) -> None:
    """Every limit must be positive; zero and negative values raise ValueError."""
    with pytest.raises(ValueError, match=field):
        Limits(**{field: value})


def test_limits_defaults_are_positive_and_consistent() -> None:
    """Defaults are accepted and the record limit covers request, raw and result."""
    limits = Limits()
    assert limits.record_bytes >= limits.request_bytes + limits.raw_bytes
    assert Limits(request_bytes=1).request_bytes == 1


def test_utf8_size_counts_bytes() -> None:
    """Sizes are UTF-8 bytes, not characters."""
    assert utf8_size("é") == 2
    assert utf8_size("abc") == 3
    with pytest.raises(UnicodeEncodeError):
        utf8_size("\ud800")
