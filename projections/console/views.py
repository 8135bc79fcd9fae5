"""What each console page shows, read from the store (only reads; nothing is rendered here).

The invocation page reads the record's ``failure_detail`` field (compact JSON: type,
message, traceback, cut_bytes) when the store kept one; the payloads (request, raw
response, agent result) are read only for the page that shows them on request.
"""

from __future__ import annotations

from typing import Any, cast

import msgspec

from eventstore.audit import replay_invocation
from eventstore.audit.replay import InvocationReplay
from eventstore.audit.run_calls import CallRow, run_calls
from eventstore.audit.run_index import RunPage, RunSummary, list_runs, run_status
from eventstore.errors import redis_errors
from eventstore.runs import RunInfo
from eventstore.store import Store
from eventstore.writer import now_ms
from projections.console.timeline import Timeline, layout
from projections.receipts.builder import encode_receipt
from projections.receipts.inspection import (
    CapabilityChanged,
    InvocationNotFound,
    inspect_invocation,
)

#: The record field holding a failed call's exception detail (harness-only).
FAILURE_DETAIL_FIELD = "failure_detail"
#: Stands for the receipt's result on the invocation page.
RESULT_ELIDED = "(the agent result: see the harness-only payload page)"


class RunView(msgspec.Struct, frozen=True, kw_only=True):
    """The run page: the run, its timeline and its calls."""

    run: RunSummary
    timeline: Timeline
    calls: list[CallRow]


class FailureDetail(msgspec.Struct, frozen=True, kw_only=True):
    """The exception behind a failed call, as the store kept it (``raw`` if not JSON)."""

    type: str | None = None
    message: str | None = None
    traceback: str | None = None
    cut_bytes: int | None = None
    raw: str | None = None


class InvocationView(msgspec.Struct, frozen=True, kw_only=True):
    """The invocation page: its row, replay (events and verdict), receipt, failure detail."""

    run_id: str
    call: CallRow
    replay: InvocationReplay | None
    receipt: str | None
    receipt_problem: str | None
    failure_detail: FailureDetail | None


class Payload(msgspec.Struct, frozen=True, kw_only=True):
    """One harness-only payload as shown: its name, size and text (None: not stored)."""

    name: str
    size: int | None
    text: str | None


async def runs_page(store: Store, cursor: str | None, limit: int = 25) -> RunPage:
    """The runs page: recent runs newest first."""
    return await list_runs(store, limit=limit, cursor=cursor)


def _summary(info: RunInfo, calls: list[CallRow]) -> RunSummary:
    counts = {status: 0 for status in ("PROJECTING", "READY", "ERROR")}
    for row in calls:
        counts[row.status] = counts.get(row.status, 0) + 1
    fields = {"active": b"1" if info.active else b"0", "deadline_ms": b"%d" % info.deadline_ms}
    return RunSummary(
        run_id=info.run_id,
        status=run_status(fields, now_ms()),
        opened_at_ms=info.created_at_ms,
        deadline_ms=info.deadline_ms,
        expires_at_ms=info.expires_at_ms,
        calls=counts,
        budget_used=info.used_total,
        budget_total=info.budget_total,
    )


async def run_page(store: Store, run_id: str) -> RunView | None:
    """The run page, or None when the run is unknown or expired."""
    info = await store.runs.info(run_id)
    if info is None:
        return None
    calls = await run_calls(store, run_id)
    return RunView(run=_summary(info, calls), timeline=layout(calls, now_ms()), calls=calls)


async def _call(store: Store, run_id: str, invocation_id: str) -> CallRow | None:
    tool_call_id = await store.runs.tool_call_id_of(run_id, invocation_id)
    if tool_call_id is None:
        return None
    return next(
        (row for row in await run_calls(store, run_id) if row.tool_call_id == tool_call_id), None
    )


def parse_failure_detail(value: bytes) -> FailureDetail:
    """Read the stored failure detail; text that is not its JSON shape is shown as is."""
    try:
        document = msgspec.json.decode(value)
    except msgspec.DecodeError:
        document = None
    if not isinstance(document, dict):
        return FailureDetail(raw=value.decode("utf-8", "replace"))
    get = cast(dict[str, Any], document).get
    cut = get("cut_bytes")
    return FailureDetail(
        type=str(get("type")) if get("type") is not None else None,
        message=str(get("message")) if get("message") is not None else None,
        traceback=str(get("traceback")) if get("traceback") is not None else None,
        cut_bytes=cut if isinstance(cut, int) else None,
    )


async def invocation_page(store: Store, run_id: str, invocation_id: str) -> InvocationView | None:
    """The invocation page, or None when the run has no such (unexpired) invocation."""
    call = await _call(store, run_id, invocation_id)
    if call is None:
        return None
    replay = await replay_invocation(store, run_id, call.tool_call_id)
    receipt = problem = None
    try:
        found = await inspect_invocation(store, run_id, invocation_id)
        # The agent result is a harness-only payload here: it has its own page.
        document = msgspec.json.decode(encode_receipt(found))
        if document.get("result") is not None:
            document["result"] = RESULT_ELIDED
        receipt = msgspec.json.format(msgspec.json.encode(document), indent=2).decode()
    except InvocationNotFound:
        problem = "no receipt: the invocation is not visible to its run"
    except CapabilityChanged:
        problem = "no receipt: the tool was revoked from the run since the call"
    async with redis_errors():
        detail = cast(
            bytes | None,
            await store.client.hget(
                store.keys.record(run_id, call.tool_call_id), FAILURE_DETAIL_FIELD
            ),
        )
    return InvocationView(
        run_id=run_id,
        call=call,
        replay=replay,
        receipt=receipt,
        receipt_problem=problem,
        failure_detail=parse_failure_detail(detail) if detail is not None else None,
    )


def _payload(name: str, data: bytes | None) -> Payload:
    if data is None:
        return Payload(name=name, size=None, text=None)
    return Payload(name=name, size=len(data), text=data.decode("utf-8", "replace"))


async def payloads_page(
    store: Store, run_id: str, invocation_id: str
) -> tuple[CallRow, list[Payload]] | None:
    """The harness-only payloads of one invocation, or None when it is not stored."""
    call = await _call(store, run_id, invocation_id)
    if call is None:
        return None
    record = await store.get(run_id, call.tool_call_id)
    if record is None:
        return None
    return call, [
        _payload("request", record.request),
        _payload("raw response", record.raw),
        _payload("agent result", record.result),
    ]
