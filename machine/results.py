"""Payloads as stored: raw response bytes, and agent results as JSON the agent sees exactly.

JSON has no NaN or Infinity. An encoder that writes them as ``null`` would store one value
and hand the agent another, so a result holding a non-finite number is refused instead.

A failed call's agent result, when its tool opted in (a ``ToolSpec``'s ``error_result``),
is the tool's own error text as a JSON string: scrubbed of secrets and within the agent
result limit, or not kept at all (:func:`encode_error_text`), never cut.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from machine.errors import CanonError
from machine.scrub import Scrub

_encoder: Final = msgspec.json.Encoder()
#: What every non-finite float becomes in msgspec's JSON: without it, none was there.
_NULL: Final = b"null"


class NonFiniteNumber(CanonError, ValueError):
    """Raised when a result holds NaN or an infinity, which JSON cannot carry."""


def _has_non_finite(value: object) -> bool:
    """Tell whether a builtins tree (``msgspec.to_builtins`` output) holds NaN or infinity."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, Mapping):
            pending.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            pending.extend(item)
    return False


def encode_result(value: Any) -> bytes:
    """Return a projector result's stored JSON bytes.

    Raises:
        NonFiniteNumber: the value holds NaN or an infinity.
        TypeError: the value holds something JSON cannot encode.
        OverflowError: an integer out of JSON's range.

    """
    encoded = _encoder.encode(value)
    # The walk runs only when a null was written: a real None and a NaN both look like it.
    if _NULL in encoded and _has_non_finite(msgspec.to_builtins(value)):
        raise NonFiniteNumber("NaN and Infinity are not JSON")
    return encoded


def decode_result(stored: bytes) -> Any:
    """Return the value the agent is shown for stored result bytes."""
    return msgspec.json.decode(stored)


#: The record's ``result`` field when the agent result is byte for byte the raw response:
#: those bytes are stored once, in ``raw`` (never valid JSON, so never a real result).
SAME_AS_RAW: Final = b"=raw"
# Below this size a second copy costs less than the read a marker asks for.
_SHARED_FROM_BYTES = 1024


def stored_result(result: bytes, raw: bytes | None) -> bytes:
    """The bytes the ``result`` field keeps for ``result`` beside the raw response ``raw``.

    :data:`SAME_AS_RAW` for a large result equal to the raw response (stored once), else
    the result itself. Digests are always the result's.
    """
    if raw is not None and len(result) >= _SHARED_FROM_BYTES and result == raw:
        return SAME_AS_RAW
    return result


def resolve_result(stored: bytes | None, raw: bytes | None) -> bytes | None:
    """The agent result a record's ``result`` field stands for.

    The raw response's bytes for :data:`SAME_AS_RAW` (None when the record holds no raw
    response), else the field as stored.
    """
    if stored == SAME_AS_RAW:
        return raw
    return stored


def encode_raw(value: Any) -> bytes:
    """Return a raw response's stored bytes: bytes as given, text as UTF-8, else JSON."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return _encoder.encode(value)


def encode_error_text(text: object, scrub: Scrub, limit_bytes: int) -> bytes | None:
    """Return the stored agent result of a tool's own error text, or None to keep none.

    The text is scrubbed of secrets (``scrub``, the store's scrubber; text that is not
    valid UTF-8, lone surrogates, is escaped first) and encoded as a JSON string. None,
    and the agent is shown the code's fixed message instead, when ``text`` is not a
    ``str``, is empty or only white space, the scrubber raises or returns no ``str``, or
    the encoded text is over ``limit_bytes``: a text that does not fit is never cut, as a
    cut text could say something the tool never said.
    """
    if not isinstance(text, str) or not text.strip():
        return None
    try:
        scrubbed = scrub(text.encode("utf-8", "backslashreplace").decode("utf-8"))
    except Exception:  # the scrubber may be the harness's code: fall back, keep nothing
        return None
    if not isinstance(scrubbed, str):
        return None
    try:
        encoded = _encoder.encode(scrubbed)
    except UnicodeEncodeError:  # a scrubber that put a lone surrogate back
        return None
    return encoded if len(encoded) <= limit_bytes else None
