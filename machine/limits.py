"""Byte limits counted in UTF-8, the helpers that measure payloads, and size errors.

A size error names the limit that was hit and that limit's configured size, never the
payload's own size: the agent's message (:meth:`LimitHit.message`) is fixed by the error
code, the limit and the configuration, so nothing the tool or the agent sent can change
it. The payload's size goes in the harness-only failure detail
(:func:`machine.failure_detail.size_limit_detail`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Final

import msgspec

from machine.codes import ErrorCode
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


class LimitName(StrEnum):
    """A size limit a payload can go over: the :class:`Limits` field that holds it."""

    REQUEST = "request_bytes"
    RAW = "raw_bytes"
    RESULT = "result_bytes"
    SCOPE = "scope_bytes"
    RECORD = "record_bytes"


#: The agent's message per limit; ``{size}`` is the limit's configured size.
LIMIT_MESSAGES: Final[dict[LimitName, str]] = {
    LimitName.REQUEST: "The tool request is larger than the {size} request limit.",
    LimitName.RAW: "The raw tool response is larger than the {size} raw response limit.",
    LimitName.RESULT: "The tool result is larger than the {size} agent result limit.",
    LimitName.SCOPE: "The scope of the tool result is larger than the {size} scope limit.",
    LimitName.RECORD: "The tool call's payloads together are larger than the {size} record limit.",
}

#: What each limit measures, as the harness-only failure detail says it.
_MEASURED: Final[dict[LimitName, str]] = {
    LimitName.REQUEST: "the request is",
    LimitName.RAW: "the raw response is",
    LimitName.RESULT: "the agent result is",
    LimitName.SCOPE: "the scope is",
    LimitName.RECORD: "request, raw response, result and scope together are",
}


def size_text(size: int) -> str:
    """Return ``size`` bytes as a person writes it: ``16 KiB``, ``1 MiB``, ``1000 B``.

    Only whole units: a size that is no whole number of KiB stays in bytes, so the text
    always names the configured value exactly.
    """
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} B"


class LimitHit(msgspec.Struct, frozen=True, kw_only=True):
    """A payload went over one size limit (the field order is the stored key order).

    Attributes:
        name: the limit that was hit.
        limit_bytes: its configured size.
        actual_bytes: what was measured against it; None when it was not measured (a
            request text too long even to parse).

    """

    name: LimitName
    # Constrained, so a stored hit that was tampered with does not decode at all.
    limit_bytes: Annotated[int, msgspec.Meta(gt=0)]
    actual_bytes: Annotated[int, msgspec.Meta(ge=0)] | None = None

    @property
    def code(self) -> ErrorCode:
        """The error code of this hit: REQUEST_TOO_LARGE before creation, else RESULT_TOO_LARGE."""
        if self.name is LimitName.REQUEST:
            return ErrorCode.REQUEST_TOO_LARGE
        return ErrorCode.RESULT_TOO_LARGE

    def message(self) -> str:
        """The agent's fixed message: the limit and its configured size, nothing measured."""
        return LIMIT_MESSAGES[self.name].format(size=size_text(self.limit_bytes))

    def describe(self) -> str:
        """One line for the harness: what was measured, against which limit."""
        measured = "" if self.actual_bytes is None else f" {self.actual_bytes} B,"
        size = f"{self.limit_bytes} B"
        shown = size_text(self.limit_bytes)
        limit = size if shown == size else f"{size} ({shown})"
        return f"{_MEASURED[self.name]}{measured} over the {self.name.value} limit of {limit}"


_limits_encoder = msgspec.json.Encoder()
_limits_decoder = msgspec.json.Decoder(Limits)


def encode_limits(limits: Limits) -> bytes:
    """``limits`` as the compact JSON a namespace records."""
    return _limits_encoder.encode(limits)


def decode_limits(stored: bytes) -> Limits:
    """The limits a namespace recorded (:func:`encode_limits`).

    Raises:
        msgspec.DecodeError: the bytes are not such JSON.
        msgspec.ValidationError: a size is not a whole number.
        ValueError: a size is out of its range (the Limits' own checks).

    """
    return _limits_decoder.decode(stored)
