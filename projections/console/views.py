"""What each console page shows, read from the store (only reads; nothing is rendered here).

The invocation page reads the record's ``failure_detail`` field (compact JSON: type,
message, traceback, cut_bytes) when the store kept one; the payloads (request, raw
response, agent result) are read only for the page that shows them on request, except the
frozen request of a governed call waiting for a decision, which the approvals page and the
call's page show (masked like the payloads page) beside the form that decides it.

No page grows with what is stored: a run page draws the whole run as a fixed number of
columns, lists its first failed calls, and shows :data:`CALLS_PER_PAGE` calls (table and
bars, cut by status, tool, code, exception type or the start of a call id) with links to
the next; a payload, a failure detail's text and a call's events are cut at fixed sizes,
saying so. The invocation page shows the receipt exactly as the receipt API answers it.
Text the console did not write is shown through :func:`visible`, so a bidirectional
control in an id reads as its escape instead of reordering the page.

A failed call is listed with its exception type and the first line of its message
(:class:`Failure`), read from the ``failure_detail`` field alone (never a payload) of at
most :data:`FAILURES_READ` failed calls of a run, and the run page groups them by type
with counts (:class:`FailureGroup`): 71 failures of four kinds read as four lines. A call's
page steps to the previous and next call of the list it was opened from (the filter
rides in its query), not of the whole run.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, Final, cast
from urllib.parse import urlencode

import msgspec

from eventstore.audit import replay_invocation
from eventstore.audit.replay import InvocationReplay
from eventstore.audit.run_calls import CallRow, read_fields, run_calls
from eventstore.audit.run_index import (
    CallSearch,
    RunFilter,
    RunPage,
    RunSummary,
    list_runs,
    run_status,
    search_calls,
)
from eventstore.audit.waiting import pending_approvals
from eventstore.errors import CanonError, redis_errors
from eventstore.runs import Refusal, RunInfo
from eventstore.sealing import DATA_KEY_FIELD, SEALED_OVERHEAD, is_sealed, sealed_key_id
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.codes import Stage
from machine.limits import Limits
from machine.phases import LEFT_IN_FLIGHT, Phase
from machine.scrub import FILTERED, Scrub
from projections.console.timeline import Overview, Timeline, layout, overview
from projections.http_api import receipt_answer
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
#: The stages a run page's table can be cut to (where a call stands beside its status).
CALL_STAGES: Final = tuple(phase.value for phase in Phase)
#: Characters of a settlement's evidence a call's page shows (it keeps at most 2,000).
EVIDENCE_SHOWN_CHARS: Final = 2000
#: Bytes of each payload the payloads page shows; the rest is in ``canon export``.
PAYLOAD_SHOWN_BYTES: Final = 64 * 1024
#: Bytes of each frozen request the approvals page shows (the call's own page shows more).
WAITING_REQUEST_SHOWN_BYTES: Final = 4 * 1024
#: Characters of each failure detail text (message, traceback) the call's page shows.
DETAIL_SHOWN_CHARS: Final = 32 * 1024
#: Events of one call its page lists (a journal holds a handful; a damaged one may not).
EVENTS_SHOWN: Final = 100
#: Failed calls of a run whose failure detail a page reads, at most (the first ones; each
#: detail is at most the store's ``failure_detail_bytes``, 8 KiB by default).
FAILURES_READ: Final = 500
#: Characters of a failure message's first line a list shows.
FAILURE_LINE_CHARS: Final = 200
#: Exception types the run page's groups list (the most frequent first).
FAILURE_GROUPS_SHOWN: Final = 20
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


def rounded_size_text(size: int) -> str:
    """A byte count as people read it: ``850 B``, ``12.5 KiB``, ``1.6 MiB``."""
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KiB".replace(".0 ", " ")
    return f"{size / (1024 * 1024):.1f} MiB".replace(".0 ", " ")


def size_against(size: int, limit: int, name: str) -> str:
    """A size with its unit and its limit: ``1.6 MiB, over the 1 MiB result limit``."""
    verdict = "over" if size > limit else "within"
    return f"{rounded_size_text(size)}, {verdict} the {rounded_size_text(limit)} {name} limit"


class Failure(msgspec.Struct, frozen=True, kw_only=True):
    """What a failure list says of a failed call.

    Attributes:
        kind: the exception's type as the failure detail names it (``size_limit`` for a
            payload refused for its size), or the error code in parentheses when no detail
            was kept (an approval denied, a call cancelled) or none was read.
        line: the first line of its message, scrubbed and cut to
            :data:`FAILURE_LINE_CHARS` characters ("" without one).

    """

    kind: str
    line: str = ""


class FailureGroup(msgspec.Struct, frozen=True, kw_only=True):
    """The failed calls of one kind: how many, and the first one with its line."""

    kind: str
    count: int
    first: CallRow
    line: str


class CallFilter(msgspec.Struct, frozen=True, kw_only=True):
    """Which calls a run page's table lists: every condition given must hold.

    ``type`` is a failed call's :attr:`Failure.kind`; ``q`` the start of a tool call id;
    ``stage`` where a call stands (:data:`CALL_STAGES`: awaiting approval, attempted ...).
    """

    status: str | None = None
    tool: str | None = None
    code: str | None = None
    type: str | None = None
    q: str | None = None
    stage: str | None = None

    def keeps(self, row: CallRow, failures: dict[str, Failure] | None = None) -> bool:
        """Tell whether the table lists ``row`` (``failures``: by invocation id)."""
        if self.type is not None:
            failure = (failures or {}).get(row.invocation_id)
            if failure is None or failure.kind != self.type:
                return False
        return (
            (self.status is None or row.status == self.status)
            and (self.stage is None or row.phase == self.stage)
            and (self.tool is None or row.tool == self.tool)
            and (self.code is None or row.error_code == self.code)
            and (self.q is None or row.tool_call_id.startswith(self.q))
        )

    @property
    def cuts(self) -> bool:
        """Whether any condition is given (the table lists less than the whole run)."""
        return any(value is not None for value in msgspec.structs.astuple(self))

    def query(self, **changes: Any) -> str:
        """The run page's query string for this filter with ``changes`` (None drops one)."""
        fields = {**msgspec.structs.asdict(self), **changes}
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
    failed calls (``problems_total`` of them in all), ``groups`` the failed calls by kind
    (of the first ``failures_read`` of them); ``failures`` says each listed failed call's
    kind and line, by invocation id; ``timeline`` draws the calls of the table page shown,
    ``calls``, which ``where`` selects. ``found`` is the one call the filter's ``q`` finds
    (its exact id, or the only id starting so), for the page to go to. ``refusals`` are the
    run's latest refusals, newest first (its counts per code are in ``run.refused``);
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
    groups: list[FailureGroup] = msgspec.field(default_factory=list)
    failures: dict[str, Failure] = msgspec.field(default_factory=dict)
    failures_read: int = 0
    found: CallRow | None = None
    #: The run's calls left in flight by a process that stopped (attempted, abandoned).
    left: list[CallRow] = msgspec.field(default_factory=list)


class FailureDetailView(msgspec.Struct, frozen=True, kw_only=True):
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
    #: Its size with its unit and the namespace's limit for it (Store.namespace_limits).
    size_shown: str = ""


class InvocationView(msgspec.Struct, frozen=True, kw_only=True):
    """The invocation page: its row, replay (events and verdict), receipt, failure detail.

    ``receipt`` is what the receipt API answers for this call (formatted), with its HTTP
    status ``receipt_status``. ``position`` is the call's place (from 1, of ``total``) in
    the list ``where`` selects of its run (the whole run without one), ``previous`` and
    ``following`` its neighbours there; ``sizes`` its request and agent result sizes
    against the store's limits.
    """

    run_id: str
    call: CallRow
    replay: InvocationReplay | None
    receipt: str
    receipt_status: int
    failure_detail: FailureDetailView | None
    position: int
    total: int
    previous: CallRow | None
    following: CallRow | None
    sizes: list[tuple[str, str]]
    #: The frozen request of a governed call waiting for a decision, masked (else None).
    waiting_request: Payload | None = None
    #: The list the neighbours are taken from (no condition: the whole run).
    where: CallFilter = msgspec.field(default_factory=CallFilter)
    #: The calls linked to this one, by tool call id, as they stand now: the edit that
    #: replaced it or the call it replaced, the call it requests again or the calls
    #: requested again in its place.
    linked: dict[str, CallRow] = msgspec.field(default_factory=dict)
    #: The calls requested again in this one's place (``<call>.again<n>``), oldest first.
    again: list[CallRow] = msgspec.field(default_factory=list)
    #: The evidence a settlement of this call rests on, as stored (operator-facing).
    settlement_evidence: str | None = None
    #: Whether an operator may settle it here: its process died while it was in flight.
    settleable: bool = False


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
        (await store.namespace_limits()).request_bytes,
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


async def calls_found(
    store: Store, tool: str | None, code: str | None
) -> tuple[CallSearch, dict[str, Failure]]:
    """The search page: calls of a tool or with an error code across the latest runs.

    With what each failed one raised, by invocation id.
    """
    found = await search_calls(store, tool=tool, code=code)
    failed = [(hit.run_id, hit.call) for hit in found.calls if hit.call.status == "ERROR"]
    return found, await read_failures(store, failed)


def _first_line(text: str) -> str:
    """The first non-blank line of ``text``, cut to :data:`FAILURE_LINE_CHARS`."""
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return cut_text(line, FAILURE_LINE_CHARS)[0]


def parse_failure(row: CallRow, value: bytes | None) -> Failure:
    """A failed call's :class:`Failure` from its stored failure detail (None: none kept).

    Its message was scrubbed of secrets before it was stored (the call's page shows the
    same text): it is shown as stored, never scrubbed twice.
    """
    unknown = Failure(kind=f"({row.error_code or 'ERROR'})")
    if value is None:
        return unknown
    try:
        document = msgspec.json.decode(value)
    except msgspec.DecodeError:
        return unknown
    if not isinstance(document, dict):
        return unknown
    kind, message = document.get("type"), document.get("message")
    if not isinstance(kind, str) or not kind:
        return unknown
    return Failure(
        kind=cut_text(kind, FAILURE_LINE_CHARS)[0],
        line=_first_line(message) if isinstance(message, str) else "",
    )


async def read_failures(
    store: Store, calls: list[tuple[str, CallRow]], limit: int = FAILURES_READ
) -> dict[str, Failure]:
    """What each of the first ``limit`` failed ``calls`` (run id, row) raised, by invocation id.

    One field of each record, ``failure_detail``, read in one exchange: no payload.
    """
    calls = [(run_id, row) for run_id, row in calls if row.status == "ERROR"][:limit]
    values = await read_fields(
        store,
        [store.keys.record(run_id, row.tool_call_id) for run_id, row in calls],
        (FAILURE_DETAIL_FIELD,),
    )
    return {
        row.invocation_id: parse_failure(row, value[0])
        for (_, row), value in zip(calls, values, strict=True)
    }


def group_failures(errors: list[CallRow], failures: dict[str, Failure]) -> list[FailureGroup]:
    """The failed calls read (``failures``), by kind: most frequent first, then by name."""
    counts: Counter[str] = Counter()
    first: dict[str, tuple[CallRow, str]] = {}
    for row in errors:
        failure = failures.get(row.invocation_id)
        if failure is None:
            continue
        counts[failure.kind] += 1
        first.setdefault(failure.kind, (row, failure.line))
    return [
        FailureGroup(kind=kind, count=count, first=first[kind][0], line=first[kind][1])
        for kind, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    ]


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
        approved=info.approved,
        pause=info.pause,
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
    calls = await run_calls(store, run_id)
    problems = [row for row in calls if row.status == "ERROR"]
    failures = await read_failures(store, [(run_id, row) for row in problems])
    refusals = await _refusals(store, run_id, info)
    return run_view(info, calls, refusals, page, where, failures=failures)


def run_view(
    info: RunInfo,
    calls: list[CallRow],
    refusals: list[Refusal] | None,
    page: int = 1,
    where: CallFilter | None = None,
    *,
    failures: dict[str, Failure] | None = None,
    live: bool = True,
) -> RunView | None:
    """The run page built from what was read of the run, or None when it has no page ``page``.

    ``refusals`` is None when the log could not be read; ``failures`` what the failed calls
    raised (:func:`read_failures`), by invocation id. ``live`` False (an archived run,
    over for good): the page never refreshes itself.
    """
    where = where or CallFilter()
    failures = failures or {}
    problems = [row for row in calls if row.status == "ERROR"]
    listed = [row for row in calls if where.keeps(row, failures)]
    start = (page - 1) * CALLS_PER_PAGE
    if page < 1 or (page > 1 and start >= len(listed)):
        return None
    shown = listed[start : start + CALLS_PER_PAGE]
    at_ms = now_ms()
    summary = _summary(info, calls)
    named = {
        row.invocation_id: failures[row.invocation_id]
        for row in (*problems[:PROBLEMS_SHOWN], *shown)
        if row.invocation_id in failures
    }
    return RunView(
        run=summary,
        overview=overview(
            calls,
            [refusal.at_ms for refusal in refusals or ()],
            per_page=CALLS_PER_PAGE,
            iso=iso_ms,
        ),
        groups=group_failures(problems, failures)[:FAILURE_GROUPS_SHOWN],
        failures=named,
        failures_read=len(failures),
        found=_found(listed, where.q),
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
        live=live and (summary.status == "active" or summary.calls.get("PROJECTING", 0) > 0),
        refusals=(refusals or [])[:REFUSALS_SHOWN],
        refusals_unreadable=refusals is None,
        left=[row for row in calls if row.phase in LEFT_IN_FLIGHT],
    )


def _found(listed: list[CallRow], prefix: str | None) -> CallRow | None:
    """The call a lookup finds among those ``listed`` (all start with ``prefix``).

    The one whose id is ``prefix`` itself, else the only one listed; None otherwise.
    """
    if prefix is None:
        return None
    exact = next((row for row in listed if row.tool_call_id == prefix), None)
    return exact or (listed[0] if len(listed) == 1 else None)


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


async def _listed(
    store: Store, run_id: str, call: CallRow, calls: list[CallRow], where: CallFilter
) -> tuple[list[CallRow], CallFilter]:
    """The list the call was opened from: the run's calls ``where`` keeps.

    Only if it keeps this one: a filter that does not (a link edited by hand) falls back
    to the whole run.
    """
    if not where.cuts:
        return calls, where
    failures: dict[str, Failure] = {}
    if where.type is not None:
        failed = [(run_id, row) for row in calls if row.status == "ERROR"]
        failures = await read_failures(store, failed)
    listed = [row for row in calls if where.keeps(row, failures)]
    return (listed, where) if call in listed else (calls, CallFilter())


def parse_failure_detail(value: bytes) -> FailureDetailView:
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
        return FailureDetailView(
            raw=shown("raw", value.decode("utf-8", "replace")), shown_cut=shown_cut
        )
    get = cast(dict[str, Any], document).get
    cut = get("cut_bytes")
    return FailureDetailView(
        type=shown("type", get("type")),
        message=shown("message", get("message")),
        traceback=shown("traceback", get("traceback")),
        cut_bytes=cut if isinstance(cut, int) else None,
        shown_cut=shown_cut,
    )


async def invocation_page(
    store: Store, run_id: str, invocation_id: str, where: CallFilter | None = None
) -> InvocationView | None:
    """The invocation page, or None when the run has no such (unexpired) invocation.

    Its previous and next calls are those of the list ``where`` selects (see
    :class:`InvocationView`).
    """
    found = await _call(store, run_id, invocation_id)
    if found is None:
        return None
    call, every_call = found
    calls, where = await _listed(store, run_id, call, every_call, where or CallFilter())
    index = calls.index(call)
    replay = await replay_invocation(store, run_id, call.tool_call_id)
    status, body = await receipt_answer(store, run_id, invocation_id)
    async with redis_errors():
        detail, evidence = cast(
            list[bytes | None],
            await store.client.hmget(
                store.keys.record(run_id, call.tool_call_id),
                [FAILURE_DETAIL_FIELD, "settlement_evidence"],
            ),
        )
    state = replay.record if replay is not None else None
    by_id = {row.tool_call_id: row for row in every_call}
    named = [] if state is None else [state.supersedes, state.superseded_by, state.retry_of]
    again = [row for row in every_call if row.tool_call_id.startswith(f"{call.tool_call_id}.again")]
    limits = await store.namespace_limits()
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
        sizes=call_sizes(call, limits),
        waiting_request=(
            await _frozen_request(store, run_id, call.tool_call_id, PAYLOAD_SHOWN_BYTES)
            if call.stage == Stage.AWAITING_APPROVAL.value
            else None
        ),
        where=where,
        linked={name: by_id[name] for name in named if name is not None and name in by_id},
        again=again,
        settlement_evidence=cut_text(evidence.decode("utf-8", "replace"), EVIDENCE_SHOWN_CHARS)[0]
        if evidence is not None
        else None,
        settleable=call.phase in LEFT_IN_FLIGHT,
    )


def call_sizes(call: CallRow, limits: Limits) -> list[tuple[str, str]]:
    """The call's request and agent result sizes against the store's limits, as shown."""
    return [
        (name, size_against(size, limit, name))
        for name, size, limit in (
            ("request", call.request_bytes, limits.request_bytes),
            ("agent result", call.result_bytes, limits.result_bytes),
        )
        if size is not None
    ]


def _payload(
    name: str,
    data: bytes | None,
    limit: int,
    scrub: Scrub | None,
    shown_bytes: int = PAYLOAD_SHOWN_BYTES,
    key_id: str | None = None,
) -> Payload:
    if data is None:
        return Payload(name=name, size=None, text=None)
    if is_sealed(data):
        # Encrypted at rest and read without the keyring: its size, never its bytes.
        size = max(len(data) - SEALED_OVERHEAD, 0)
        return Payload(
            name=name,
            size=size,
            text=f"encrypted (key {key_id})" if key_id else "encrypted",
            size_shown=size_against(size, limit, name),
        )
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
    Payloads encrypted at rest are shown opened when the console has the keyring, else
    as ``encrypted (key <id>)`` with their size.
    """
    found = await _call(store, run_id, invocation_id)
    if found is None:
        return None
    call = found[0]
    record = await store.get(run_id, call.tool_call_id)
    if record is None:
        return None
    limits = await store.namespace_limits()
    key_id: str | None = None
    if any(is_sealed(data) for data in (record.request, record.raw, record.result)):
        key_id = await run_key_id(store, run_id)
    return call, payloads_shown(
        record.request,
        record.raw,
        record.result,
        limits,
        store.settings.scrub,
        reveal,
        key_id=key_id,
    )


async def run_key_id(store: Store, run_id: str) -> str:
    """The master key id a run's payloads are encrypted under (``erased``: none left)."""
    async with redis_errors():
        wrapped = cast(
            bytes | None, await store.client.hget(store.keys.run(run_id), DATA_KEY_FIELD)
        )
    return sealed_key_id(wrapped) or "erased"


def payloads_shown(
    request: bytes | None,
    raw: bytes | None,
    result: bytes | None,
    limits: Limits,
    scrub: Scrub,
    reveal: bool = False,
    *,
    key_id: str | None = None,
) -> list[Payload]:
    """A call's request, raw response and agent result as its payloads page shows them.

    Each is cut and set against its limit, and masked with ``scrub`` unless ``reveal``;
    one encrypted at rest (not opened) is named with ``key_id``, its run's key.
    """
    return [
        _payload(name, data, limit, None if reveal else scrub, key_id=key_id)
        for name, data, limit in (
            ("request", request, limits.request_bytes),
            ("raw response", raw, limits.raw_bytes),
            ("agent result", result, limits.result_bytes),
        )
    ]
