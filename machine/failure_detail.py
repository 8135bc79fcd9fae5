"""The harness-only failure detail: what a raising tool or projector left behind, bounded.

When an executor or a projector raises, the agent only ever sees the stable error code
and its fixed message. The record keeps, for the harness and its operators, the
exception's qualified type name, its message and its formatted traceback as one compact
JSON object::

    {"type": "...", "message": "...", "traceback": "...", "cut_bytes": N}

Its message and traceback are scrubbed of secrets first (:mod:`machine.scrub`: the
value after a name such as ``password`` or ``api_key``, bearer tokens, API-key and JWT
shapes, a URL's password become ``[Filtered]``), so the record never holds them. It
never grows past its limit (:attr:`machine.limits.Limits.failure_detail_bytes`, and
what the record limit leaves), and is never cut silently. When it does not fit, a
message longer than a quarter of the limit is cut to that quarter first (the traceback's
last line repeats it); then the traceback loses its start (the innermost frame and the
exception line are at its end), then the message its end, then the type name its end;
``cut_bytes`` says how many UTF-8 bytes of text were cut. Text that is not valid UTF-8
(lone surrogates) is kept escaped.

A governed call its dispatch permit ended (its record disagreed with its journal, or its
run lost the authority to run it) raised nothing either: its detail
(:func:`governance_detail`) has type ``dispatch_refused`` and the reason as its message.

A payload refused for its size (RESULT_TOO_LARGE) raised nothing, but its record keeps a
detail too (:func:`size_limit_detail`): type ``size_limit``, a one-line message, and the
limit that was hit as data, ``"limit": {"name", "limit_bytes", "actual_bytes"}``
(:class:`machine.limits.LimitHit`). It holds sizes only, never payload text, so it is
kept under every policy. Pure: no I/O.
"""

from __future__ import annotations

import traceback
from typing import Final, Literal

import msgspec
from msgspec import UNSET, UnsetType

from machine.limits import LimitHit
from machine.scrub import Scrub, scrub_secrets

#: What a boundary keeps of a raising tool's exception (see ``ToolBoundary``).
FailureDetailPolicy = Literal["full", "type", "none"]
#: The accepted policies.
FAILURE_DETAIL_POLICIES: Final = ("full", "type", "none")
#: The ``type`` of the detail of a payload refused for its size (no exception raised).
SIZE_LIMIT_TYPE: Final = "size_limit"
#: The ``type`` of the detail of a governed call its dispatch permit ended (nothing ran).
GOVERNANCE_TYPE: Final = "dispatch_refused"


class FailureDetail(msgspec.Struct, frozen=True, kw_only=True):
    """The stored failure detail (field order is the stored key order).

    Attributes:
        type: the exception's qualified type name (``module.Qualname``; builtins bare).
        message: ``str()`` of the exception ("" under the ``"type"`` policy).
        traceback: the formatted traceback, chained exceptions included ("" under
            ``"type"``).
        cut_bytes: UTF-8 bytes of text cut to fit the limit (0 when nothing was cut).
        limit: for a payload refused for its size, the limit it went over (absent, not
            even a key, for an exception's detail).

    """

    type: str
    message: str
    traceback: str
    cut_bytes: int = 0
    limit: LimitHit | UnsetType = UNSET


_encoder: Final = msgspec.json.Encoder()
_decoder: Final = msgspec.json.Decoder(FailureDetail)


def _text(value: str) -> str:
    """``value`` as valid UTF-8 text: lone surrogates kept as backslash escapes."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def type_name(exc: BaseException) -> str:
    """Return the qualified name of ``exc``'s type (builtins by their bare name)."""
    kind = type(exc)
    module = getattr(kind, "__module__", None)
    name = getattr(kind, "__qualname__", kind.__name__)
    return name if module in (None, "builtins") else f"{module}.{name}"


def _message(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # an exception whose __str__ raises still gets a detail
        return "<str() of the exception failed>"


def _formatted_traceback(exc: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(exc))
    except Exception:  # a broken exception object must not break the failure path
        return ""


def _scrubbed(scrub: Scrub, text: str) -> str:
    """``text`` through ``scrub``, or hidden whole when the scrubber fails.

    The scrubber may be the harness's own code: a failure path must not fail on it, nor
    keep what it could not scrub.
    """
    try:
        return _text(str(scrub(text)))
    except Exception:
        return "[Filtered: the scrubber raised]"


def _cut_head(text: str, count: int) -> str:
    """``text`` without at least ``count`` UTF-8 bytes from its start (whole characters)."""
    data = text.encode("utf-8")[count:]
    return data.decode("utf-8", "ignore")


def _cut_tail(text: str, count: int) -> str:
    """``text`` without at least ``count`` UTF-8 bytes from its end (whole characters)."""
    data = text.encode("utf-8")
    return data[: max(0, len(data) - count)].decode("utf-8", "ignore")


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def bounded(detail: FailureDetail, limit_bytes: int) -> bytes | None:
    """Return ``detail`` encoded within ``limit_bytes``, cut as the module says.

    None when not even the empty shape fits (nothing is kept then, and the Failed event
    carries no digest).
    """
    kind, message, trace = detail.type, detail.message, detail.traceback
    original = _size(kind) + _size(message) + _size(trace)
    share = limit_bytes // 4
    if _size(message) > share and len(_encoder.encode(detail)) > limit_bytes:
        message = _cut_tail(message, _size(message) - share)
    while True:
        cut = original - _size(kind) - _size(message) - _size(trace)
        encoded = _encoder.encode(
            FailureDetail(
                type=kind, message=message, traceback=trace, cut_bytes=cut, limit=detail.limit
            )
        )
        over = len(encoded) - limit_bytes
        if over <= 0:
            return encoded
        if not (kind or message or trace):
            return None
        # Escaping only lengthens text, so cutting ``over`` bytes of text shortens the
        # encoding by at least that much (``cut_bytes`` may gain a digit: loop again).
        if trace:
            trace = _cut_head(trace, over)
        elif message:
            message = _cut_tail(message, over)
        else:
            kind = _cut_tail(kind, over)


def failure_detail(
    exc: BaseException,
    policy: FailureDetailPolicy,
    limit_bytes: int,
    scrub: Scrub = scrub_secrets,
) -> bytes | None:
    """Return the stored failure detail of ``exc`` under ``policy``; None to keep nothing.

    Args:
        exc: what the executor or projector raised.
        policy: ``"full"`` (type, message, traceback), ``"type"`` (the type name only) or
            ``"none"`` (nothing).
        limit_bytes: the most bytes the detail may take.
        scrub: what replaces the secrets in the message and the traceback (applied
            before the detail is bounded, so a cut never reveals half a secret).

    """
    if policy == "none" or limit_bytes <= 0:
        return None
    full = policy == "full"
    detail = FailureDetail(
        type=_text(type_name(exc)),
        message=_scrubbed(scrub, _text(_message(exc))) if full else "",
        traceback=_scrubbed(scrub, _text(_formatted_traceback(exc))) if full else "",
    )
    return bounded(detail, limit_bytes)


def size_limit_detail(hit: LimitHit, limit_bytes: int) -> bytes | None:
    """Return the stored detail of a payload refused for its size; None when it cannot fit.

    ``limit_bytes`` is the room the record leaves it, as for any detail; the limit's data
    is never cut, only its message line.
    """
    if limit_bytes <= 0:
        return None
    detail = FailureDetail(type=SIZE_LIMIT_TYPE, message=hit.describe(), traceback="", limit=hit)
    return bounded(detail, limit_bytes)


def governance_detail(reason: str, limit_bytes: int) -> bytes | None:
    """Return the stored detail of a governed call whose permit ended it; None if no room.

    Type ``dispatch_refused`` and a one-line ``reason`` of the store's own words (why the
    journal, the record or the run refused the dispatch): no payload, no exception.
    """
    if limit_bytes <= 0:
        return None
    return bounded(FailureDetail(type=GOVERNANCE_TYPE, message=reason, traceback=""), limit_bytes)


def decode_failure_detail(data: bytes) -> FailureDetail | None:
    """Return a stored failure detail, or None when the bytes are not one (tampered)."""
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError:
        return None
