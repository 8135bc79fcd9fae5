"""``CallStop``: how the boundary ends a call early with a stable error code.

A stop carries what the Failed event records besides the code: the size of a payload
refused for its size, the harness-only failure detail of a raising executor or
projector (:mod:`machine.failure_detail`), already encoded and bounded, and the agent
result of a tool that opted in to show its own error text (``ToolSpec.error_result``,
:func:`machine.results.encode_error_text`). The exception object itself is never kept:
only the bytes the record will hold. A stop for a size carries the limit that was hit as
well, which picks the agent's message (:meth:`machine.limits.LimitHit.message`).
"""

from __future__ import annotations

from eventstore.errors import InvalidArgument
from machine.codes import ErrorCode
from machine.errors import CanonError
from machine.failure_detail import (
    FAILURE_DETAIL_POLICIES,
    FailureDetailPolicy,
    failure_detail,
    size_limit_detail,
)
from machine.limits import LimitHit, LimitName, Limits
from machine.results import decode_result, encode_error_text
from machine.scrub import Scrub


class CallStop(CanonError):
    """Raised when the boundary ends a call early with an error code (its control flow).

    Never leaves the boundary: the agent gets the code's fixed message (for a size, the
    one naming the limit), or the tool's own error text when ``result`` holds it.

    Attributes:
        code: the stable error code the agent is answered with.
        rejected_bytes: the size of a payload refused for its size, if any.
        detail: the encoded failure detail to store, if any.
        limit: the size limit that was hit, if that is why the call stops.
        result: the agent result to store and show instead of the fixed message (the
            tool's error text as a JSON string), if any.

    """

    def __init__(
        self,
        code: ErrorCode,
        rejected_bytes: int | None = None,
        detail: bytes | None = None,
        limit: LimitHit | None = None,
        result: bytes | None = None,
    ) -> None:
        super().__init__(code.value)
        self.code = code
        self.rejected_bytes = rejected_bytes
        self.detail = detail
        self.limit = limit
        self.result = result

    @property
    def message(self) -> str | None:
        """The tool's error text the agent is shown, or None for the fixed message."""
        if self.result is None:
            return None
        text = decode_result(self.result)
        assert isinstance(text, str)  # encode_error_text encodes a str only
        return text


def checked_policy(policy: object) -> FailureDetailPolicy:
    """Return ``policy`` if it is a failure-detail policy.

    Raises:
        InvalidArgument: it is not ``"full"``, ``"type"`` or ``"none"``.

    """
    if policy not in FAILURE_DETAIL_POLICIES:
        raise InvalidArgument('failure_detail must be "full", "type" or "none"')
    return policy


def error_text_result(
    text: object, limits: Limits, stored_bytes: int, scrub: Scrub
) -> bytes | None:
    """Return the agent result of a tool's own error ``text``, or None for the fixed message.

    It fits both the agent result limit and what the record limit leaves beside the
    ``stored_bytes`` of payloads the record already holds; see
    :func:`machine.results.encode_error_text` for when none is kept.
    """
    room = min(limits.result_bytes, limits.record_bytes - stored_bytes)
    return encode_error_text(text, scrub, room)


def tool_failed(
    code: ErrorCode,
    exc: BaseException,
    policy: FailureDetailPolicy,
    limits: Limits,
    stored_bytes: int,
    scrub: Scrub,
    result: bytes | None = None,
) -> CallStop:
    """Return the stop of a raising executor or projector, with its failure detail.

    The detail fits both its own limit and what the record limit leaves beside the
    ``stored_bytes`` of payloads the record already holds (request, raw response) and
    the agent ``result``, if any (:func:`error_text_result`), which it carries; its text
    has gone through ``scrub`` (the store's ``StoreSettings.scrub``).
    """
    stored_bytes += len(result) if result is not None else 0
    room = min(limits.failure_detail_bytes, limits.record_bytes - stored_bytes)
    return CallStop(code, detail=failure_detail(exc, policy, room, scrub), result=result)


def too_large(
    name: LimitName,
    actual_bytes: int,
    limits: Limits,
    *,
    rejected_bytes: int,
    stored_bytes: int,
) -> CallStop:
    """Return the stop of a payload over the limit ``name`` (RESULT_TOO_LARGE).

    Its failure detail names the limit, its size and ``actual_bytes`` (what was measured
    against it); ``rejected_bytes`` is the size of the refused payload the Failed event
    records. The detail fits what the record limit leaves beside the ``stored_bytes`` the
    record already holds, as a raising tool's does. No agent result is stored: the
    agent's message is the limit's (a tool's ``error_result`` is never asked).
    """
    hit = LimitHit(name=name, limit_bytes=getattr(limits, name.value), actual_bytes=actual_bytes)
    room = min(limits.failure_detail_bytes, limits.record_bytes - stored_bytes)
    return CallStop(hit.code, rejected_bytes, detail=size_limit_detail(hit, room), limit=hit)
