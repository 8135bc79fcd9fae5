"""Every call of one run in order, without payloads: what a timeline or a listing shows.

The run's calls are the invocations its registry names (and its progress list, for calls
recorded before the registry named them); each row is read from the record's lifecycle
fields with HMGET, never the request, raw response or result. Only reads.
"""

from __future__ import annotations

from typing import Final, cast

import msgspec

from eventstore.audit.replay import run_tool_call_ids
from eventstore.errors import redis_errors
from eventstore.store import Store
from machine.ids import invocation_id

#: The record fields a row is built from (sizes and digests, no payload bytes).
ROW_FIELDS: Final = (
    "tool",
    "stage",
    "status",
    "evidence_status",
    "error_code",
    "created_at_ms",
    "updated_at_ms",
    "version",
    "request_bytes",
    "result_bytes",
)
_TERMINAL: Final = frozenset({"READY", "ERROR"})


class CallRow(msgspec.Struct, frozen=True, kw_only=True):
    """One call of a run as listed.

    Attributes:
        invocation_id: the invocation id (the receipt's id).
        tool_call_id: the call id the harness gave.
        tool: the tool called.
        stage: where the lifecycle stands (NEW, EXECUTING, PROJECTING, READY, ERROR).
        status: READY, ERROR or PROJECTING.
        evidence_status: the evidence status (READY calls), else the record's value.
        error_code: the error code of an ERROR call, None otherwise.
        created_at_ms: when the call was recorded.
        finished_at_ms: when its terminal event was written, None while in flight.
        events: how many events its journal holds (the record's version).
        request_bytes: the request's size.
        result_bytes: the agent result's size, None without one.

    """

    invocation_id: str
    tool_call_id: str
    tool: str
    stage: str
    status: str
    evidence_status: str | None
    error_code: str | None
    created_at_ms: int
    finished_at_ms: int | None
    events: int
    request_bytes: int | None
    result_bytes: int | None


def _text(value: bytes | None) -> str | None:
    return value.decode("utf-8", "replace") if value is not None else None


def _int(value: bytes | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def _row(run_id: str, tool_call_id: str, values: list[bytes | None]) -> CallRow | None:
    fields = dict(zip(ROW_FIELDS, values, strict=True))
    created = _int(fields["created_at_ms"])
    if created is None:
        return None  # the record expired (or is not a record)
    status = _text(fields["status"]) or ""
    return CallRow(
        invocation_id=invocation_id(run_id, tool_call_id),
        tool_call_id=tool_call_id,
        tool=_text(fields["tool"]) or "",
        stage=_text(fields["stage"]) or "",
        status=status,
        evidence_status=_text(fields["evidence_status"]),
        error_code=_text(fields["error_code"]),
        created_at_ms=created,
        finished_at_ms=_int(fields["updated_at_ms"]) if status in _TERMINAL else None,
        events=_int(fields["version"]) or 0,
        request_bytes=_int(fields["request_bytes"]),
        result_bytes=_int(fields["result_bytes"]),
    )


async def run_calls(store: Store, run_id: str) -> list[CallRow]:
    """Return every call of the run whose record is still stored, oldest first.

    Calls created in the same millisecond come in call id order.

    Raises:
        InvalidArgument: ``run_id`` is not a run id.
        StoreUnavailable: Redis failed or timed out.

    """
    calls = await run_tool_call_ids(store, run_id)
    async with redis_errors(), store.client.pipeline(transaction=False) as pipe:
        for call in calls:
            pipe.hmget(store.keys.record(run_id, call), list(ROW_FIELDS))
        replies = cast(list[list[bytes | None]], await pipe.execute()) if calls else []
    rows = [
        row
        for call, values in zip(calls, replies, strict=True)
        if (row := _row(run_id, call, values)) is not None
    ]
    return sorted(rows, key=lambda row: (row.created_at_ms, row.tool_call_id))
