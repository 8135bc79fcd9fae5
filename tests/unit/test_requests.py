"""Tool input validation: only a finite JSON object of bounded depth becomes a request."""

from __future__ import annotations

import collections
import types
from typing import Any

import msgspec
import pytest

from machine.requests import InvalidRequest, canonical_request

DEPTH = 8
TEXT = 10_000


def canonical(value: object, *, depth: int = DEPTH, text: int = TEXT) -> bytes:
    return canonical_request(value, max_depth=depth, max_text_bytes=text)


def nested(levels: int) -> dict[str, Any]:
    """An object whose deepest value sits at nesting level ``levels`` (the object is 1)."""
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def test_mapping_becomes_compact_json_in_insertion_order() -> None:
    """A dict is re-encoded as compact JSON, keys in the order given, text as UTF-8."""
    value = {"z": 1, "a": [True, None, 1.5], "t": "naïve 東京 🚀"}

    assert canonical(value) == b'{"z":1,"a":[true,null,1.5],"t":"na\xc3\xafve ' + (
        "東京 🚀".encode() + b'"}'
    )


@pytest.mark.parametrize(
    "text",
    ['{"b": 2, "a": [1, 2]}', b'{"b":2,"a":[1,2]}', bytearray(b' {"b":2, "a":[1,2]}\n')],
    ids=["str", "bytes", "bytearray-with-whitespace"],
)
def test_json_text_of_an_object_is_canonicalized(text: str | bytes) -> None:
    """JSON text (str, bytes or bytearray) of an object gives the same compact bytes."""
    assert canonical(text) == b'{"b":2,"a":[1,2]}'


def test_mapping_and_its_json_text_give_the_same_bytes() -> None:
    """Whoever built the envelope, the canonical bytes (and so the digest) are the same."""
    value = {"q": "ü€𝄞", "n": [1, {"x": None}], "f": 0.25}

    assert canonical(value) == canonical(msgspec.json.encode(value).decode())


def test_non_dict_mappings_are_accepted_at_every_level() -> None:
    """Read-only and user mappings are objects too; they encode like dicts."""
    value = types.MappingProxyType({"a": collections.UserDict({"b": collections.OrderedDict(c=1)})})

    assert canonical(value) == b'{"a":{"b":{"c":1}}}'


def test_tuples_encode_as_arrays() -> None:
    """A tuple is a JSON array."""
    assert canonical({"a": (1, "x")}) == b'{"a":[1,"x"]}'


def test_large_integers_within_python_limits_are_kept_exactly() -> None:
    """Integers beyond 64 bits are valid JSON numbers and are stored digit for digit."""
    assert canonical({"n": 2**70}) == b'{"n":1180591620717411303424}'
    assert canonical('{"n":-99999999999999999999999}') == b'{"n":-99999999999999999999999}'


_INVALID: dict[str, object] = {
    "array": [1, 2],
    "array-text": "[1, 2]",
    "int": 42,
    "int-text": "42",
    "string-text": '"text"',
    "null-text": "null",
    "none": None,
    "bool": True,
    "float": 1.5,
    "empty-bytes": b"",
    "empty-text": "",
    "truncated-text": "{",
    "python-repr-text": "{'a': 1}",
    "nan-text": "NaN",
    "nan-in-object-text": '{"a": NaN}',
    "infinity-text": '{"a": Infinity}',
    "minus-infinity-text": '{"a": -Infinity}',
    "overflowing-float-text": '{"a": 1e999}',
    "nan-float": {"a": float("nan")},
    "infinity-float": {"a": float("inf")},
    "minus-infinity-float-in-array": {"a": [float("-inf")]},
    "invalid-utf8-bytes": b'{"a": "\xff"}',
    "utf8-bom": b"\xef\xbb\xbf{}",
    "escaped-lone-surrogate-value": '{"a": "\\ud800"}',
    "escaped-lone-surrogate-key": '{"\\udc00": 1}',
    "lone-surrogate-value": {"a": "\ud800"},
    "lone-surrogate-key": {"\udfff": 1},
    "lone-surrogate-in-text": '{"a": "\ud800"}',
    "int-key": {1: "x"},
    "none-key-nested": {"a": {None: 1}},
    "set": {"a": {1, 2}},
    "frozenset": {"a": frozenset()},
    "object": {"a": object()},
    "bytes-value": {"a": b"bytes"},
    "bytearray-value": {"a": bytearray(b"x")},
    "int-past-digit-limit": {"a": 10**5000},
    "memoryview": memoryview(b"{}"),
}


@pytest.mark.parametrize("value", list(_INVALID.values()), ids=list(_INVALID))
def test_invalid_inputs_are_refused(value: object) -> None:
    """Non-objects, invalid JSON, NaN/Infinity, invalid UTF-8, lone surrogates, non-str keys
    and non-JSON values are refused as InvalidRequest."""
    with pytest.raises(InvalidRequest):
        canonical(value)


def test_depth_is_bounded_with_the_object_itself_at_level_one() -> None:
    """Nesting exactly at the bound passes; one level deeper is refused."""
    assert canonical(nested(DEPTH)).count(b"{") == DEPTH
    with pytest.raises(InvalidRequest):
        canonical(nested(DEPTH + 1))


def test_only_containers_count_as_levels() -> None:
    """An innermost container at the bound passes whether it is empty or holds scalars."""
    assert canonical({"a": {}}, depth=2) == b'{"a":{}}'
    assert canonical({"a": {"b": 1, "c": "x"}}, depth=2) == b'{"a":{"b":1,"c":"x"}}'
    assert canonical({"a": 1}, depth=1) == b'{"a":1}'
    with pytest.raises(InvalidRequest):
        canonical({"a": []}, depth=1)


def test_arrays_count_towards_depth() -> None:
    """Arrays nest like objects."""
    value: Any = 1
    for _ in range(DEPTH - 1):
        value = [value]
    assert canonical({"a": value})
    with pytest.raises(InvalidRequest):
        canonical({"a": [value]})


def test_depth_bound_holds_for_json_text() -> None:
    """JSON text nested beyond the bound is refused after parsing."""
    at_bound = msgspec.json.encode(nested(DEPTH))
    assert canonical(at_bound) == at_bound
    with pytest.raises(InvalidRequest):
        canonical(msgspec.json.encode(nested(DEPTH + 1)))


def test_absurdly_deep_json_text_is_refused_not_crashed() -> None:
    """Text nested past the parser's recursion limit is an InvalidRequest, not a RecursionError."""
    text = '{"a":' + "[" * 200_000 + "]" * 200_000 + "}"
    with pytest.raises(InvalidRequest):
        canonical(text, text=len(text))


def test_self_referencing_input_is_refused() -> None:
    """A mapping that contains itself stops at the depth bound."""
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(InvalidRequest):
        canonical(loop)


def test_overlong_json_text_is_not_parsed() -> None:
    """Text longer than max_text_bytes raises OverflowError before any parsing."""
    text = '{"a":"' + "x" * 20 + '"}'
    assert canonical(text, text=len(text))
    with pytest.raises(OverflowError):
        canonical(text, text=len(text) - 1)
    with pytest.raises(OverflowError):
        canonical(b"not even json" * 10, text=10)


def test_invalid_request_is_a_value_error() -> None:
    """Callers that catch ValueError also catch InvalidRequest."""
    assert issubclass(InvalidRequest, ValueError)
