"""Answering a retried tool call from its record: ``ToolBoundary(on_duplicate="replay")``.

A durable framework (a LangGraph resume, a restarted harness) sends the same calls again.
The creation script refuses the second creation atomically (``DUPLICATE_TOOL_CALL``, before
any budget is reserved), so the tool can never run twice. With replay on, the boundary
then reads the first call's record, read-only (one HMGET: no expiry is set or refreshed),
and answers what it holds:

- the record holds another tool or another canonical request: ``DUPLICATE_TOOL_CALL``,
  exactly as without replay (the digest of the canonical request bytes is compared);
- READY: the stored result, evidence status and scope, as the first reply gave them;
- ERROR: the record's error code, with the message the first reply gave: for a size
  error, the one naming the limit the record says was hit; for a tool that opted in
  (``ToolSpec.error_result``), the tool's own error text when the record keeps one as
  its agent result; else the code's fixed message;
- still PROJECTING: the record is read again with a growing pause until it finishes or
  ``wait_s`` has passed; past the wait, ``DUPLICATE_TOOL_CALL`` with the invocation id,
  so the harness may look the record up later. A record whose holder's lease lapsed
  (its process died, :mod:`machine.phases`) is not waited for: the caller says what
  then (``on_lapsed``): an ungoverned call is handed back :class:`Abandoned`, for the
  boundary to take it over and run it again; a governed one is answered at once;
- gone (expired, or the run remembers an id whose record has expired): ``RECORD_EXPIRED``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final, Literal

import msgspec

from eventstore.boundary.contracts import AgentReply, ToolError, ToolResult
from eventstore.reader import Reader
from eventstore.wire.replies import reply_text
from eventstore.writer import Head, now_ms
from machine.codes import ErrorCode, EvidenceStatus, Status
from machine.failure_detail import decode_failure_detail
from machine.limits import LimitHit
from machine.phases import lease_lapsed
from machine.results import SAME_AS_RAW, decode_result

#: The record fields a replay needs: never the request or the raw response.
_FIELDS: Final = (
    "status",
    "tool",
    "request_sha256",
    "result",
    "evidence_status",
    "scope",
    "error_code",
    "invocation_id",
    # Harness-only: read for the limit a size error names, never shown.
    "failure_detail",
    # Whether the call's process is gone (its lease lapsed), and where it stands then.
    "lease_until_ms",
    "updated_at_ms",
    "approval_id",
    "version",
    "last_hash",
    "expires_at_ms",
    "attempt",
)
#: What a replay does with a record in flight whose holder's lease lapsed: wait as for any
#: (``wait``), hand it back to be taken over (``take_over``, an ungoverned call) or answer
#: at once as still in flight (``answer``).
OnLapsed = Literal["wait", "take_over", "answer"]


class Abandoned(msgspec.Struct, frozen=True, kw_only=True):
    """An ungoverned call in flight whose holder's lease lapsed: to be taken over.

    Attributes:
        head: where the record stands (what a TakenOver must follow).
        attempt: the run of the tool a takeover starts (the record's attempt plus one).
        lapsed_at_ms: when its lease ended (the server's clock).

    """

    head: Head
    attempt: int
    lapsed_at_ms: int


#: First and longest pause between two reads of a record still PROJECTING.
FIRST_PAUSE_S: Final = 0.005
LONGEST_PAUSE_S: Final = 0.1


async def replay_duplicate(
    reader: Reader,
    bounded: Callable[[Awaitable[dict[str, bytes]]], Awaitable[dict[str, bytes]]],
    *,
    run_id: str,
    tool_call_id: str,
    tool: str,
    request: bytes,
    wait_s: float,
    on_lapsed: OnLapsed = "wait",
) -> AgentReply | Abandoned:
    """Return the recorded reply of an earlier call with this (run, tool call id).

    Args:
        reader: reads the record.
        bounded: bounds one read by the store timeout (raises StoreUnavailable past it).
        run_id: the run of the call.
        tool_call_id: the framework's id, already refused once as a duplicate.
        tool: the tool this call names.
        request: this call's canonical request bytes.
        wait_s: longest wait for a record still PROJECTING.
        on_lapsed: what a record in flight whose lease lapsed gets (:data:`OnLapsed`):
            :class:`Abandoned` is returned only for ``take_over``, and only for an
            ungoverned call.

    Raises:
        StoreUnavailable: Redis failed or timed out.

    """
    digest = (await reader.digest_of(run_id))(request)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    pause = FIRST_PAUSE_S
    while True:
        fields = await bounded(reader.select(run_id, tool_call_id, _FIELDS))
        if not fields:
            return ToolError.of(ErrorCode.RECORD_EXPIRED, tool_call_id=tool_call_id)
        if fields.get("tool") != tool.encode() or fields.get("request_sha256") != digest.encode():
            return ToolError.of(ErrorCode.DUPLICATE_TOOL_CALL, tool_call_id=tool_call_id)
        if fields.get("result") == SAME_AS_RAW:
            # The result was stored once, as the raw response: read it there (raw is
            # written before the result and never changes).
            stored = await bounded(reader.select(run_id, tool_call_id, ("raw",)))
            fields["result"] = stored.get("raw") or b""
        reply = _recorded_reply(fields, tool_call_id)
        if reply is not None:
            return reply
        lapsed = on_lapsed != "wait" and _lapsed(fields)
        if lapsed and on_lapsed == "take_over" and "approval_id" not in fields:
            abandoned = _abandoned(run_id, tool_call_id, fields)
            if abandoned is not None:
                return abandoned
        remaining = deadline - loop.time()
        if remaining <= 0 or lapsed:
            return ToolError.of(
                ErrorCode.DUPLICATE_TOOL_CALL,
                tool_call_id=tool_call_id,
                invocation_id=_text(fields.get("invocation_id")),
            )
        await asyncio.sleep(min(pause, remaining))
        pause = min(pause * 2, LONGEST_PAUSE_S)


def _text(value: bytes | None) -> str | None:
    return reply_text(value, "replace") if value is not None else None


def _int(value: bytes | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def _lapsed(fields: dict[str, bytes]) -> bool:
    """Whether the record's holder's lease lapsed, by this machine's clock.

    The script that takes the call over judges it again by the server's.
    """
    until, updated = _int(fields.get("lease_until_ms")), _int(fields.get("updated_at_ms"))
    return lease_lapsed(until, updated, now_ms())


def _abandoned(run_id: str, tool_call_id: str, fields: dict[str, bytes]) -> Abandoned | None:
    """The takeover of a lapsed record (None when its fields do not say where it stands)."""
    version, expires = _int(fields.get("version")), _int(fields.get("expires_at_ms"))
    last_hash = _text(fields.get("last_hash"))
    if version is None or expires is None or last_hash is None:
        return None
    head = Head(
        run_id=run_id,
        tool_call_id=tool_call_id,
        version=version,
        last_hash=last_hash,
        entry_id="",
        expires_at_ms=expires,
    )
    until = _int(fields.get("lease_until_ms")) or 0
    return Abandoned(head=head, attempt=(_int(fields.get("attempt")) or 1) + 1, lapsed_at_ms=until)


def _limit_of(detail: bytes | None) -> LimitHit | None:
    """The size limit a stored failure detail names, if it names one."""
    decoded = decode_failure_detail(detail) if detail is not None else None
    if decoded is None or not isinstance(decoded.limit, LimitHit):
        return None
    return decoded.limit


def _error_text(stored: bytes | None) -> str | None:
    """The tool's error text a failed record keeps as its agent result; None: none kept.

    Raises:
        ValueError: the stored bytes are not a JSON string (the record is not replayed).

    """
    if stored is None:
        return None
    text = decode_result(stored)
    if not isinstance(text, str):
        raise ValueError("a failed record's agent result is a JSON string")
    return text


def _recorded_reply(fields: dict[str, bytes], tool_call_id: str) -> AgentReply | None:
    """The reply a finished record holds; None while it is PROJECTING (or unreadable)."""
    invocation = _text(fields.get("invocation_id"))
    status = fields.get("status")
    try:
        if status == Status.READY.value.encode() and invocation is not None:
            return ToolResult(
                result=decode_result(fields["result"]),
                evidence_status=EvidenceStatus(fields["evidence_status"].decode()),
                scope=_text(fields.get("scope")) or "",
                tool_call_id=tool_call_id,
                invocation_id=invocation,
            )
        if status == Status.ERROR.value.encode():
            code = ErrorCode(fields["error_code"].decode())
            return ToolError.of(
                code,
                tool_call_id=tool_call_id,
                invocation_id=invocation,
                limit=_limit_of(fields.get("failure_detail")),
                message=_error_text(fields.get("result")),
            )
    except (KeyError, ValueError):  # UnicodeDecodeError and msgspec's DecodeError too
        # A record that does not hold a readable reply is not replayed, only refused.
        return ToolError.of(ErrorCode.DUPLICATE_TOOL_CALL, tool_call_id=tool_call_id)
    if status == Status.PROJECTING.value.encode():
        return None
    return ToolError.of(ErrorCode.DUPLICATE_TOOL_CALL, tool_call_id=tool_call_id)
