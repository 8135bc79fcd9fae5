"""Byte limits, all counted in UTF-8, and the helpers that measure payloads."""

from __future__ import annotations

import msgspec

from machine.errors import InvalidArgument


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """Byte limits of one store. Every size is UTF-8 bytes of the encoded JSON.

    Attributes:
        request_bytes: the complete request JSON (tool input).
        raw_bytes: the raw tool response as stored.
        result_bytes: the bounded agent result.
        record_bytes: request + raw + result + scope of one record together (for a
            failed call: request + raw + failure detail).
        scope_bytes: the projection's scope description.
        json_depth: deepest nesting of arrays and objects accepted in a request (the
            request object itself is level 1; scalars add no level).
        fact_count: most facts returned by one run-progress read.
        facts_bytes: most bytes of fact text returned by one run-progress read.
        failure_detail_bytes: the harness-only failure detail kept when a tool or
            projector raises (its compact JSON; cut to fit, saying how much was cut).

    """

    request_bytes: int = 64 * 1024
    raw_bytes: int = 1024 * 1024
    result_bytes: int = 16 * 1024
    record_bytes: int = 1024 * 1024 + 96 * 1024
    scope_bytes: int = 512
    json_depth: int = 32
    fact_count: int = 100
    facts_bytes: int = 64 * 1024
    failure_detail_bytes: int = 8 * 1024

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"limit {name} must be positive")


def utf8_size(text: str) -> int:
    """Return the UTF-8 byte size of ``text``; lone surrogates raise UnicodeEncodeError."""
    return len(text.encode("utf-8"))
