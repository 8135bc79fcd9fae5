"""What each console page shows, read from the store (only reads; nothing is rendered here).

The invocation page reads the record's ``failure_detail`` field (compact JSON: type,
message, traceback, cut_bytes) when the store kept one; the payloads (request, raw
response, agent result) are read only for the page that shows them on request, except the
frozen request of a governed call waiting for a decision, which the approvals page and the
call's page show (masked like the payloads page) beside the form that decides it.

No page grows with what is stored: a run page draws the whole run as a fixed number of
columns, lists its first failed calls, and shows :data:`CALLS_PER_PAGE` calls (table and
bars, cut by status, tool or code) with links to the next; a payload, a failure detail's
text and a call's events are cut at fixed sizes, saying so. The invocation page shows
the receipt exactly as the receipt API answers it. Text the console did not write is shown
through :func:`visible`, so a bidirectional control in an id reads as its escape
instead of reordering the page.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final, cast
from urllib.parse import urlencode

import msgspec

from eventstore.approvals import pending_approvals
from eventstore.audit import replay_invocation
from eventstore.audit.replay import InvocationReplay
from eventstore.audit.run_calls import CallRow, run_calls
from eventstore.audit.run_index import (
    CallSearch,
    RunFilter,
    RunPage,
    RunSummary,
    list_runs,
    run_status,
    search_calls,
)
from eventstore.errors import CanonError, redis_errors
from eventstore.runs import Refusal, RunInfo
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.codes import Stage
from machine.scrub import FILTERED, Scrub
from projections.console.timeline import Overview, Timeline, layout, overview
from projections.http import receipt_answer
from projections.receipts.builder import iso_ms

#: The record field holding a failed call's exception detail (harness-only).
FAILURE_DETAIL_FIELD = "failure_detail"
#: Calls one run page shows (its table and its bars), oldest first.
CALLS_PER_PAGE: Final = 100
#: The latest refusals a run page lists (the counts per code cover them all).
REFUSALS_SHOWN: Final = 20
#: Refusals the run's overview marks (as many as a run's log keeps by default).
REFUSALS_MARKED: Final = 1000
#: Failed calls the run page lists first, above its table.
PROBLEMS_SHOWN: Final = 20
#: The statuses a run page's table can be cut to.
CALL_STATUSES: Final = ("ERROR", "PROJECTING", "READY")
#: Bytes of each payload the payloads page shows; the rest is in ``canon export``.
PAYLOAD_SHOWN_BYTES: Final = 64 * 1024
#: Bytes of each frozen request the approvals page shows (the call's own page shows more).
WAITING_REQUEST_SHOWN_BYTES: Final = 4 * 1024
#: Characters of each failure detail text (message, traceback) the call's page shows.
DETAIL_SHOWN_CHARS: Final = 32 * 1024
#: Events of one call its page lists (a journal holds a handful; a damaged one may not).
EVENTS_SHOWN: Final = 100
# Line breaks and tabs lay out tracebacks and payloads; every other character that is not
# printable (controls, bidi and other format characters, separators, private use,
# unassigned) is shown as its escape.
_LAYOUT: Final = str.maketrans("", "", "\n\t")


def visible(text: str) -> str:
    r"""``text`` with every invisible or direction-changing character shown as an escape.

    ``call<U+202E>txt.exe`` (a right-to-left override that would display the id as
    ``callexe.txt``) is shown as ``call\u202etxt.exe``. Line breaks and tabs stay;
    letters of either direction stay as written.
    """
    if text.translate(_LAYOUT).isprintable():
        return text
    return "".join(
        ch
        if ch.isprintable() or ch in "\n\t"
        else f"\\u{ord(ch):04x}"
        if ord(ch) <= 0xFFFF
        else f"\\U{ord(ch):08x}"
        for ch in text
    )


def cut_text(text: str, limit: int) -> tuple[str, int | None]:
    """``text`` cut to ``limit`` characters, and its whole length when it was cut."""
    return (text, None) if len(text) <= limit else (text[:limit], len(text))


def size_text(size: int) -> str:
    """A byte count as people read it: ``850 B``, ``12.5 KiB``, ``1.6 MiB``."""
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KiB".replace(".0 ", " ")
    return f"{size / (1024 * 1024):.1f} MiB".replace(".0 ", " ")


def size_against(size: int, limit: int, name: str) -> str:
    """A size with its unit and its limit: ``1.6 MiB, over the 1 MiB result limit``."""
    verdict = "over" if size > limit else "within"
    return f"{size_text(size)}, {verdict} the {size_text(limit)} {name} limit"


class CallFilter(msgspec.Struct, frozen=True, kw_only=True):
    """Which calls a run page's table lists: every condition given must hold."""

    status: str | None = None
    tool: str | None = None
    code: str | None = None

    def keeps(self, row: CallRow) -> bool:
        """Tell whether the table lists ``row``."""
        return (
            (self.status is None or row.status == self.status)
            and (self.tool is None or row.tool == self.tool)
            and (self.code is None or row.error_code == self.code)
        )

    def query(self, **changes: Any) -> str:
        """The run page's query string for this filter with ``changes`` (None drops one)."""
        fields = {"status": self.status, "tool": self.tool, "code": self.code, **changes}
        return urlencode({name: value for name, value in fields.items() if value is not None})


class CallsPage(msgspec.Struct, frozen=True, kw_only=True):
    """Which calls the table shows: ``first``-``last`` (from 1) of the ``total`` it lists."""

    number: int
    count: int
    first: int
    last: int
    total: int


class RunView(msgspec.Struct, frozen=True, kw_only=True):
    """The run page: the run, its overview, its failed calls, and one page of its table.

    ``overview`` pictures every call and refusal of the run; ``problems`` are its first
    failed calls (``problems_total`` of them in all); ``timeline`` draws the calls of the
    table page shown, ``calls``, which ``where`` selects. ``refusals`` are the run's latest
    refusals, newest first (its counts per code are in ``run.refused``);
    ``refusals_unreadable`` says the log could not be read. ``live``: calls may still
    come or end, so the page refreshes itself.
    """

    run: RunSummary
    overview: Overview
    problems: list[CallRow]
    problems_total: int
    timeline: Timeline
    calls: list[CallRow]
    page: CallsPage
    where: CallFilter
    tools: list[str]
    live: bool
    refusals: list[Refusal] = msgspec.field(default_factory=list)
    refusals_unreadable: bool = False


class FailureDetail(msgspec.Struct, frozen=True, kw_only=True):
    """The exception behind a failed call, as the store kept it (``raw`` if not JSON)."""

    type: str | None = None
    message: str | None = None
    traceback: str | None = None
    cut_bytes: int | None = None
    raw: str | None = None
    #: The whole length in characters of a text shown cut (message, traceback or raw).
    shown_cut: dict[str, int] = msgspec.field(default_factory=dict)


class Payload(msgspec.Struct, frozen=True, kw_only=True):
    """One harness-only payload as shown: its name, size and text (None: not stored).

    ``shown_bytes`` is how much of it the text holds when it was cut; ``masked`` how many
    values that look like secrets the text shows as ``[Filtered]`` (0 once revealed).
    """

    name: str
    size: int | None
    text: str | None
    shown_bytes: int | None = None
    masked: int = 0
    #: Its size with its unit and the store's limit for it.
    size_shown: str = ""


class InvocationView(msgspec.Struct, frozen=True, kw_only=True):
    """The invocation page: its row, replay (events and verdict), receipt, failure detail.

    ``receipt`` is what the receipt API answers for this call (formatted), with its HTTP
    status ``receipt_status``. ``position`` is the call's place in its run (from 1, of
    ``total``), ``previous`` and ``following`` its neighbours; ``sizes`` its request and
    agent result sizes against the store's limits.
    """

    run_id: str
    call: CallRow
    replay: InvocationReplay | None
    receipt: str
    receipt_status: int
    failure_detail: FailureDetail | None
    position: int
    total: int
    previous: CallRow | None
    following: CallRow | None
    sizes: list[tuple[str, str]]
    #: The frozen request of a governed call waiting for a decision, masked (else None).
    waiting_request: Payload | None = None


async def runs_page(
    store: Store, cursor: str | None, where: RunFilter | None = None, limit: int = 25
) -> RunPage:
    """The runs page: recent runs newest first, those ``where`` keeps."""
    return await list_runs(store, limit=limit, cursor=cursor, where=where)


class WaitingCallView(msgspec.Struct, frozen=True, kw_only=True):
    """A governed call waiting for a decision, as the approvals page lists it."""

    run_id: str
    call: CallRow
    #: Its frozen request, masked, its first :data:`WAITING_REQUEST_SHOWN_BYTES` shown.
    request: Payload


class ApprovalsView(msgspec.Struct, frozen=True, kw_only=True):
    """The approvals page: the calls waiting across the latest runs, oldest first.

    ``runs_examined`` is how many runs were read; ``complete`` whether every waiting call
    of those runs is listed.
    """

    calls: list[WaitingCallView]
    runs_examined: int
    complete: bool


async def _frozen_request(
    store: Store, run_id: str, tool_call_id: str, shown_bytes: int
) -> Payload:
    """The request of a waiting call as shown: masked with the store's scrubber, cut."""
    fields = await store.reader.select(run_id, tool_call_id, ("request",))
    return _payload(
        "request",
        fields.get("request"),
        store.settings.limits.request_bytes,
        store.settings.scrub,
        shown_bytes,
    )


async def approvals_page(store: Store) -> ApprovalsView:
    """The approvals page: governed calls waiting for a decision, oldest first.

    Each call's frozen request is read (one HMGET of that field; each is bounded by the
    store's request limit, and at most 100 calls are listed) and shown masked and cut.
    """
    waiting = await pending_approvals(store)
    requests = await asyncio.gather(
        *(
            _frozen_request(store, item.run_id, item.call.tool_call_id, WAITING_REQUEST_SHOWN_BYTES)
            for item in waiting.calls
        )
    )
    return ApprovalsView(
        calls=[
            WaitingCallView(run_id=item.run_id, call=item.call, request=request)
            for item, request in zip(waiting.calls, requests, strict=True)
        ],
        runs_examined=waiting.runs_examined,
        complete=waiting.complete,
    )


async def calls_found(store: Store, tool: str | None, code: str | None) -> CallSearch:
    """The search page: calls of a tool or with an error code across the latest runs."""
    return await search_calls(store, tool=tool, code=code)


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
        refused=info.refused,
        failed=info.failed,
        tools=info.used,
        awaiting_approval=info.awaiting_approval,
    )


async def _refusals(store: Store, run_id: str, info: RunInfo) -> list[Refusal] | None:
    """The run's latest refusals (None: the log could not be read)."""
    if not info.refused:
        return []
    try:
        return await store.refusals(run_id, limit=REFUSALS_MARKED)
    except CanonError:  # an ACL user without the log's read, or a store outage
        return None


async def run_page(
    store: Store, run_id: str, page: int = 1, where: CallFilter | None = None
) -> RunView | None:
    """Page ``page`` (from 1) of the run's calls that ``where`` keeps, or None.

    None when the run is unknown or expired or has no such page (the first always exists).
    """
    info = await store.runs.info(run_id)
    if info is None:
        return None
    where = where or CallFilter()
    calls = await run_calls(store, run_id)
    listed = [row for row in calls if where.keeps(row)]
    start = (page - 1) * CALLS_PER_PAGE
    if page < 1 or (page > 1 and start >= len(listed)):
        return None
    shown = listed[start : start + CALLS_PER_PAGE]
    problems = [row for row in calls if row.status == "ERROR"]
    refusals = await _refusals(store, run_id, info)
    at_ms = now_ms()
    summary = _summary(info, calls)
    return RunView(
        run=summary,
        overview=overview(
            calls,
            [refusal.at_ms for refusal in refusals or ()],
            at_ms,
            per_page=CALLS_PER_PAGE,
            iso=iso_ms,
        ),
        problems=problems[:PROBLEMS_SHOWN],
        problems_total=len(problems),
        timeline=layout(shown, at_ms),
        calls=shown,
        page=CallsPage(
            number=page,
            count=max(-(-len(listed) // CALLS_PER_PAGE), 1),
            first=start + 1,
            last=start + len(shown),
            total=len(listed),
        ),
        where=where,
        tools=sorted(info.used),
        live=summary.status == "active" or summary.calls.get("PROJECTING", 0) > 0,
        refusals=(refusals or [])[:REFUSALS_SHOWN],
        refusals_unreadable=refusals is None,
    )


async def _call(
    store: Store, run_id: str, invocation_id: str
) -> tuple[CallRow, list[CallRow]] | None:
    """The call, and every call of its run (oldest first), or None."""
    tool_call_id = await store.runs.tool_call_id_of(run_id, invocation_id)
    if tool_call_id is None:
        return None
    calls = await run_calls(store, run_id)
    found = next((row for row in calls if row.tool_call_id == tool_call_id), None)
    return None if found is None else (found, calls)


def parse_failure_detail(value: bytes) -> FailureDetail:
    """Read the stored failure detail; text that is not its JSON shape is shown as is."""
    try:
        document = msgspec.json.decode(value)
    except msgspec.DecodeError:
        document = None
    shown_cut: dict[str, int] = {}

    def shown(name: str, text: object) -> str | None:
        if text is None:
            return None
        kept, whole = cut_text(str(text), DETAIL_SHOWN_CHARS)
        if whole is not None:
            shown_cut[name] = whole
        return kept

    if not isinstance(document, dict):
        return FailureDetail(
            raw=shown("raw", value.decode("utf-8", "replace")), shown_cut=shown_cut
        )
    get = cast(dict[str, Any], document).get
    cut = get("cut_bytes")
    return FailureDetail(
        type=shown("type", get("type")),
        message=shown("message", get("message")),
        traceback=shown("traceback", get("traceback")),
        cut_bytes=cut if isinstance(cut, int) else None,
        shown_cut=shown_cut,
    )


async def invocation_page(store: Store, run_id: str, invocation_id: str) -> InvocationView | None:
    """The invocation page, or None when the run has no such (unexpired) invocation."""
    found = await _call(store, run_id, invocation_id)
    if found is None:
        return None
    call, calls = found
    index = calls.index(call)
    replay = await replay_invocation(store, run_id, call.tool_call_id)
    status, body = await receipt_answer(store, run_id, invocation_id)
    async with redis_errors():
        detail = cast(
            bytes | None,
            await store.client.hget(
                store.keys.record(run_id, call.tool_call_id), FAILURE_DETAIL_FIELD
            ),
        )
    limits = store.settings.limits
    sizes = [
        (name, size_against(size, limit, name))
        for name, size, limit in (
            ("request", call.request_bytes, limits.request_bytes),
            ("agent result", call.result_bytes, limits.result_bytes),
        )
        if size is not None
    ]
    return InvocationView(
        run_id=run_id,
        call=call,
        replay=replay,
        receipt=msgspec.json.format(body, indent=2).decode(),
        receipt_status=status,
        failure_detail=parse_failure_detail(detail) if detail is not None else None,
        position=index + 1,
        total=len(calls),
        previous=calls[index - 1] if index > 0 else None,
        following=calls[index + 1] if index + 1 < len(calls) else None,
        sizes=sizes,
        waiting_request=(
            await _frozen_request(store, run_id, call.tool_call_id, PAYLOAD_SHOWN_BYTES)
            if call.stage == Stage.AWAITING_APPROVAL.value
            else None
        ),
    )


def _payload(
    name: str,
    data: bytes | None,
    limit: int,
    scrub: Scrub | None,
    shown_bytes: int = PAYLOAD_SHOWN_BYTES,
) -> Payload:
    if data is None:
        return Payload(name=name, size=None, text=None)
    # Cut at a byte count; a character split there shows as one replacement character.
    shown = data[:shown_bytes]
    text = shown.decode("utf-8", "replace")
    masked = 0
    if scrub is not None:
        scrubbed = _masked(scrub, text)
        masked = max(scrubbed.count(FILTERED) - text.count(FILTERED), 0)
        text = scrubbed if masked else text
    return Payload(
        name=name,
        size=len(data),
        text=text,
        shown_bytes=len(shown) if len(shown) < len(data) else None,
        masked=masked,
        size_shown=size_against(len(data), limit, name),
    )


def _masked(scrub: Scrub, text: str) -> str:
    """``text`` with its secrets masked; hidden whole when the store's scrubber fails."""
    try:
        return str(scrub(text))
    except Exception:
        return FILTERED


async def payloads_page(
    store: Store, run_id: str, invocation_id: str, *, reveal: bool = False
) -> tuple[CallRow, list[Payload]] | None:
    """The harness-only payloads of one invocation, or None when it is not stored.

    The record keeps them whole (they are the audit record); the page masks what looks
    like a secret with the store's scrubber (``StoreSettings.scrub``) unless ``reveal``.
    """
    found = await _call(store, run_id, invocation_id)
    if found is None:
        return None
    call = found[0]
    record = await store.get(run_id, call.tool_call_id)
    if record is None:
        return None
    limits = store.settings.limits
    return call, [
        _payload(name, data, limit, None if reveal else store.settings.scrub)
        for name, data, limit in (
            ("request", record.request, limits.request_bytes),
            ("raw response", record.raw, limits.raw_bytes),
            ("agent result", record.result, limits.result_bytes),
        )
    ]
