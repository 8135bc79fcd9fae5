"""Tool input validation: only a JSON object of bounded depth becomes a request.

The canonical request is the input re-encoded as compact JSON, so the stored bytes, their
digest and their UTF-8 size are the same whoever built the envelope.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from machine.errors import CanonError


def _mapping_as_dict(value: Any) -> Any:
    # Only reached for mappings that are not dicts (already checked by _check).
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not a JSON value")


_encoder: Final = msgspec.json.Encoder(enc_hook=_mapping_as_dict)


class InvalidRequest(CanonError, ValueError):
    """Raised when a tool input is not a finite JSON object within the nesting bound."""


#: What every door that takes an operator's JSON says of an object naming a member twice.
DUPLICATE_MEMBER: Final = "a JSON object names a member twice"


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for name, value in pairs:
        if name in document:
            raise InvalidRequest(DUPLICATE_MEMBER)
        document[name] = value
    return document


def refuse_duplicate_members(text: str | bytes | bytearray) -> None:
    """Check that no object in the JSON ``text`` names a member twice.

    Which of two values would win is a parser's choice, so an operator's text that names
    a member twice (an edited request) is refused rather than read one way. Text that is
    not JSON at all is left to the caller's own parse.

    Raises:
        InvalidRequest: an object names a member twice (:data:`DUPLICATE_MEMBER`).

    """
    try:
        json.loads(text, object_pairs_hook=_unique_members)
    except InvalidRequest:
        raise
    except (ValueError, RecursionError):
        return


def _check(value: object, depth: int, max_depth: int) -> None:
    """Check one value found at nesting level ``depth`` (the top object is level 1)."""
    if value is None or isinstance(value, bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidRequest("NaN and Infinity are not JSON")
        return
    if isinstance(value, str):
        # Lone surrogates cannot be encoded as UTF-8; refuse rather than replace them.
        value.encode("utf-8")
        return
    # Only arrays and objects nest: a scalar adds no level, so an empty and a full
    # container at the bound are treated alike.
    if depth > max_depth and isinstance(value, list | tuple | Mapping):
        raise InvalidRequest("nested too deeply")
    if isinstance(value, list | tuple):
        for item in value:
            _check(item, depth + 1, max_depth)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidRequest("object keys must be strings")
            key.encode("utf-8")
            _check(item, depth + 1, max_depth)
        return
    raise InvalidRequest(f"{type(value).__name__} is not a JSON value")


def canonical_request(
    tool_input: object, *, max_depth: int, max_text_bytes: int, unique_members: bool = False
) -> bytes:
    """Validate a tool input and return its canonical JSON bytes.

    Args:
        tool_input: a mapping, or JSON text (``str`` or UTF-8 ``bytes``) of an object.
        max_depth: deepest nesting accepted (the object itself is depth 1).
        max_text_bytes: JSON text longer than this is not even parsed.
        unique_members: refuse JSON text in which an object names a member twice (an
            operator's text: :func:`refuse_duplicate_members`); a model's calls are
            taken as their framework parsed them.

    Raises:
        InvalidRequest: not a JSON object, not finite, not UTF-8, nested too deeply, or
            holding a value JSON cannot encode (or, with ``unique_members``, naming a
            member twice).
        OverflowError: the JSON text is longer than ``max_text_bytes``.

    """
    if isinstance(tool_input, str | bytes | bytearray):
        if len(tool_input) > max_text_bytes:
            raise OverflowError("request text too long")
        try:
            data = tool_input.encode("utf-8") if isinstance(tool_input, str) else tool_input
            tool_input = msgspec.json.decode(data)
        except (UnicodeEncodeError, msgspec.DecodeError) as exc:
            raise InvalidRequest("not valid JSON") from exc
        except RecursionError as exc:
            raise InvalidRequest("nested too deeply") from exc
        if unique_members:
            refuse_duplicate_members(data)
    if not isinstance(tool_input, Mapping):
        raise InvalidRequest("the input must be a JSON object")
    try:
        _check(tool_input, 1, max_depth)
    except UnicodeEncodeError as exc:
        raise InvalidRequest("text is not valid Unicode") from exc
    except RecursionError as exc:
        raise InvalidRequest("nested too deeply") from exc
    try:
        return _encoder.encode(tool_input)
    except (TypeError, ValueError) as exc:
        # e.g. an int beyond Python's digit limit for int -> str conversion.
        raise InvalidRequest("the input cannot be encoded as JSON") from exc
