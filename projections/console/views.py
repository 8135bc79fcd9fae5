"""What each console page shows, read from the store (only reads; nothing is rendered here).

The invocation page reads the record's ``failure_detail`` field (compact JSON: type,
message, traceback, cut_bytes) when the store kept one; the payloads (request, raw
response, agent result) are read only for the page that shows them on request.

No page grows with what is stored: a run page shows :data:`CALLS_PER_PAGE` calls (table
and timeline) and links to the next; a payload, a failure detail's text and a call's
events are cut at fixed sizes, saying so. Text the console did not write is shown
through :func:`visible`, so a bidirectional control in an id reads as its escape
instead of reordering the page.
"""

from __future__ import annotations

from typing import Any, Final, cast

import msgspec

from eventstore.audit import replay_invocation
from eventstore.audit.replay import InvocationReplay
from eventstore.audit.run_calls import CallRow, run_calls
from eventstore.audit.run_index import RunPage, RunSummary, list_runs, run_status
from eventstore.errors import CanonError, redis_errors
from eventstore.runs import Refusal, RunInfo
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.scrub import FILTERED, Scrub
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
#: Calls one run page shows (its table and its timeline), oldest first.
CALLS_PER_PAGE: Final = 200
#: The latest refusals a run page lists (the counts per code cover them all).
REFUSALS_SHOWN: Final = 20
#: Bytes of each payload the payloads page shows; the rest is in ``canon export``.
PAYLOAD_SHOWN_BYTES: Final = 64 * 1024
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


class CallsPage(msgspec.Struct, frozen=True, kw_only=True):
    """Which calls of the run one run page shows: ``first``-``last`` (from 1) of ``total``."""

    number: int
    count: int
    first: int
    last: int
    total: int


class RunView(msgspec.Struct, frozen=True, kw_only=True):
    """The run page: the run, the timeline of this page's calls, and those calls.

    ``refusals`` are the run's latest refusals, newest first (its counts per code are in
    ``run.refused``); ``refusals_unreadable`` says the log could not be read.
    """

    run: RunSummary
    timeline: Timeline
    calls: list[CallRow]
    page: CallsPage
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


class InvocationView(msgspec.Struct, frozen=True, kw_only=True):
    """The invocation page: its row, replay (events and verdict), receipt, failure detail."""

    run_id: str
    call: CallRow
    replay: InvocationReplay | None
    receipt: str | None
    receipt_problem: str | None
    failure_detail: FailureDetail | None


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
        refused=info.refused,
    )


async def run_page(store: Store, run_id: str, page: int = 1) -> RunView | None:
    """Page ``page`` (from 1) of the run's calls, or None.

    None when the run is unknown or expired or has no such page (the first always exists).
    """
    info = await store.runs.info(run_id)
    if info is None:
        return None
    calls = await run_calls(store, run_id)
    start = (page - 1) * CALLS_PER_PAGE
    if page < 1 or (page > 1 and start >= len(calls)):
        return None
    shown = calls[start : start + CALLS_PER_PAGE]
    refusals: list[Refusal] = []
    unreadable = False
    if info.refused:
        try:
            refusals = await store.refusals(run_id, limit=REFUSALS_SHOWN)
        except CanonError:  # an ACL user without the log's read, or a store outage
            unreadable = True
    return RunView(
        refusals=refusals,
        refusals_unreadable=unreadable,
        run=_summary(info, calls),
        timeline=layout(shown, now_ms()),
        calls=shown,
        page=CallsPage(
            number=page,
            count=max(-(-len(calls) // CALLS_PER_PAGE), 1),
            first=start + 1,
            last=start + len(shown),
            total=len(calls),
        ),
    )


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


def _payload(name: str, data: bytes | None, scrub: Scrub | None) -> Payload:
    if data is None:
        return Payload(name=name, size=None, text=None)
    # Cut at a byte count; a character split there shows as one replacement character.
    shown = data[:PAYLOAD_SHOWN_BYTES]
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
    call = await _call(store, run_id, invocation_id)
    if call is None:
        return None
    record = await store.get(run_id, call.tool_call_id)
    if record is None:
        return None
    return call, [
        _payload(name, data, None if reveal else store.settings.scrub)
        for name, data in (
            ("request", record.request),
            ("raw response", record.raw),
            ("agent result", record.result),
        )
    ]
