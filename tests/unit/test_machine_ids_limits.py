"""Id rules and byte limits: unsafe ids are refused, limits must be positive."""

from __future__ import annotations

import hashlib

import pytest

from machine.ids import (
    MAX_ID_LENGTH,
    invocation_id,
    is_invocation_id,
    is_safe_id,
    is_tool_name,
)
from machine.limits import Limits, utf8_size

_UNSAFE = [
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
    "-dash-first",
    "_under-first",
    "a/b",
    "a*b",
]
_SAFE = ["a", "run-1", "call_01.retry", "A9", "x" * MAX_ID_LENGTH, "toolu_01ABCdef-23.4"]


@pytest.mark.parametrize("value", _UNSAFE, ids=repr)
def test_unsafe_ids_are_refused(value: str) -> None:
    """Empty, over-long, separator, brace, whitespace, control, non-ASCII and dot-led ids fail."""
    assert not is_safe_id(value)


@pytest.mark.parametrize("value", _SAFE)
def test_safe_ids_are_accepted(value: str) -> None:
    """Letters, digits, '.', '_' and '-' up to 128 characters, starting alphanumeric, pass."""
    assert is_safe_id(value)


@pytest.mark.parametrize("value", [None, 7, b"run-1", ["run-1"]], ids=repr)
def test_non_strings_are_not_ids(value: object) -> None:
    """Only str values can be ids."""
    assert not is_safe_id(value)


def test_tool_names() -> None:
    """Tool names start with a letter or '_' and have at most 64 characters."""
    assert is_tool_name("search_docs")
    assert is_tool_name("_private.v2-beta")
    assert not is_tool_name("9lives")
    assert not is_tool_name("a" * 65)
    assert not is_tool_name("tool:x")
    assert not is_tool_name("")


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
