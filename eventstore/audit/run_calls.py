"""Every call of one run in order, without payloads: what a timeline or a listing shows.

The run's calls are the invocations its registry names (and its progress list, for calls
recorded before the registry named them); each row is read from the record's lifecycle
fields with HMGET, never the request, raw response or result, and says where the call
stands beside its status (its phase, :mod:`machine.phases`: waiting for approval,
approved, dispatching, attempted or abandoned by a process that died, ended, reconciled),
judged when it is read. Only reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, cast

import msgspec

from eventstore.audit.readonly import run_tool_call_ids
from eventstore.errors import redis_errors
from eventstore.store import Store
from eventstore.wire.exchange import read_many
from eventstore.writer import now_ms
from machine.codes import Stage
from machine.ids import invocation_id
from machine.phases import lease_lapsed, phase_of

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
    "lease_until_ms",
    "approval_id",
    "settled_by",
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
        last_event_at_ms: when its latest event was written (its terminal one once it
            ended; a call in flight has not ended then, but nothing of it is later).
        phase: where it stands, as every door shows it beside the status
            (:class:`machine.phases.Phase`), judged when the row was read.
        governed: it is a governed call (it has an approval id).
        settled_by: who settled it after its process died (an operator, ``hook:<tool>``,
            ``journal`` or ``sweep``), None when nobody did.
        lease_until_ms: when the lease of its process ends (a call in flight), if known.

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
    last_event_at_ms: int | None = None
    phase: str = ""
    governed: bool = False
    settled_by: str | None = None
    lease_until_ms: int | None = None


def left_in_flight(row: CallRow, at_ms: int, grace_ms: int = 0) -> bool:
    """Whether ``row`` is in flight and its lease (and ``grace_ms`` more) passed at ``at_ms``.

    Its process is gone: nobody runs the call (an attempted or abandoned call).
    """
    return row.stage in ("EXECUTING", "PROJECTING") and lease_lapsed(
        row.lease_until_ms, row.last_event_at_ms, at_ms, grace_ms
    )


def _text(value: bytes | None) -> str | None:
    return value.decode("utf-8", "replace") if value is not None else None


def _int(value: bytes | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def _phase(
    stage: str, governed: bool, settled: bool, lease: int | None, updated: int | None, at_ms: int
) -> str:
    try:
        known = Stage(stage)
    except ValueError:
        return ""  # not a stage the machine knows: shown as the record holds it
    return phase_of(
        known,
        governed=governed,
        settled=settled,
        lease_until_ms=lease,
        updated_at_ms=updated,
        now_ms=at_ms,
    ).value


def _row(run_id: str, tool_call_id: str, values: list[bytes | None], at_ms: int) -> CallRow | None:
    fields = dict(zip(ROW_FIELDS, values, strict=True))
    created = _int(fields["created_at_ms"])
    if created is None:
        return None  # the record expired (or is not a record)
    status = _text(fields["status"]) or ""
    updated = _int(fields["updated_at_ms"])
    stage = _text(fields["stage"]) or ""
    governed = fields["approval_id"] is not None
    settled_by = _text(fields["settled_by"])
    lease = _int(fields["lease_until_ms"])
    return CallRow(
        invocation_id=invocation_id(run_id, tool_call_id),
        tool_call_id=tool_call_id,
        tool=_text(fields["tool"]) or "",
        stage=stage,
        status=status,
        evidence_status=_text(fields["evidence_status"]),
        error_code=_text(fields["error_code"]),
        created_at_ms=created,
        finished_at_ms=updated if status in _TERMINAL else None,
        events=_int(fields["version"]) or 0,
        request_bytes=_int(fields["request_bytes"]),
        result_bytes=_int(fields["result_bytes"]),
        last_event_at_ms=updated,
        phase=_phase(stage, governed, settled_by is not None, lease, updated, at_ms),
        governed=governed,
        settled_by=settled_by,
        lease_until_ms=lease,
    )


async def read_fields(
    store: Store, keys: list[str], fields: tuple[str, ...] = ROW_FIELDS
) -> list[list[bytes | None]]:
    """``HMGET`` of ``fields`` of each key, in one exchange: the values, in key order.

    On a single server through :func:`~eventstore.wire.exchange.read_many` (a run of
    3,000 calls is read in a few milliseconds, where a redis-py pipeline spends a
    hundred on its per-reply layers); on a cluster through the client's pipeline (a run's
    keys share one slot, so one node answers).

    Raises:
        StoreUnavailable: Redis failed or timed out.

    """
    if not keys:
        return []
    async with redis_errors():
        if store.cluster is None:
            replies = await read_many(
                store.client,
                [("HMGET", key, *fields) for key in keys],
                store.settings.timeout_s,
            )
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            return cast(list[list[bytes | None]], replies)
        async with store.client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hmget(key, list(fields))
            return cast(list[list[bytes | None]], await pipe.execute())


def call_row(run_id: str, tool_call_id: str, fields: Mapping[bytes, bytes]) -> CallRow | None:
    """One call's row from its record's fields (as HGETALL gives them); None without them.

    How an archive lists a run's calls as Redis would (its phase judged now).
    """
    values = [fields.get(name.encode()) for name in ROW_FIELDS]
    return _row(run_id, tool_call_id, values, now_ms())


async def run_calls(store: Store, run_id: str) -> list[CallRow]:
    """Return every call of the run whose record is still stored, oldest first.

    Calls created in the same millisecond come in call id order.

    Raises:
        InvalidArgument: ``run_id`` is not a run id.
        StoreUnavailable: Redis failed or timed out.

    """
    calls = await run_tool_call_ids(store, run_id)
    replies = await read_fields(store, [store.keys.record(run_id, call) for call in calls])
    at_ms = now_ms()
    rows = [
        row
        for call, values in zip(calls, replies, strict=True)
        if (row := _row(run_id, call, values, at_ms)) is not None
    ]
    return sorted(rows, key=lambda row: (row.created_at_ms, row.tool_call_id))
