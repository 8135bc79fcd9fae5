"""The console finds the bad call in one click: failure lists say what each failed call
raised (its exception type and the first line of its message, secrets filtered), the run
page groups them by type with counts, a tool call id (or its start) opens its call, the
call page's previous and next follow the list it was opened from, and the overview of an
open run spans its calls, not the wall clock."""

from __future__ import annotations

import html
import re
from datetime import timedelta
from typing import Any

import httpx
import msgspec
import pytest

from eventstore.store import Store
from eventstore.writer import now_ms
from machine.codes import ErrorCode, EvidenceStatus
from machine.ids import invocation_id
from machine.scrub import scrub_secrets
from projections.console import views
from tests.support.console_run import OPERATOR_TOKEN, next_millisecond, serving

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-failures"
SECRET = "tok-9f8e7d6c5b4a"
#: (tool call id, exception type, message) of each failed call, in creation order.
FAILED = [
    ("call-01", "billing.CardDeclined", "card declined: 402 Payment Required\nretry later"),
    ("call-03", "TimeoutError", "the search backend took 30 s"),
    ("call-04", "billing.CardDeclined", f"card declined (api_key={SECRET})"),
    ("call-06", "KeyError", "'city'"),
    ("call-07", "billing.CardDeclined", "card declined: insufficient funds"),
]


def detail(kind: str, message: str) -> bytes:
    """A failure detail as the boundary keeps it: its texts scrubbed of secrets."""
    traceback = f"Traceback ...\n{kind}: {message}"
    return msgspec.json.encode(
        {"type": kind, "message": scrub_secrets(message), "traceback": scrub_secrets(traceback)}
    )


async def populate(store: Store) -> None:
    """Ten calls, one per millisecond: five failed with a detail, one ended without one
    (RESULT_TOO_LARGE before a detail existed), one still in flight, the rest READY."""
    await store.open_run(RUN, deadline=timedelta(minutes=10))
    failed = {call: (kind, message) for call, kind, message in FAILED}
    for n in range(10):
        call = f"call-{n:02d}"
        await next_millisecond()
        head = await store.writer.create(RUN, call, "charge", b'{"n":1}')
        if call in failed:
            await store.writer.fail(
                head, ErrorCode.EXECUTION_FAILED, failure_detail=detail(*failed[call])
            )
        elif call == "call-08":
            await store.writer.fail(head, ErrorCode.RESULT_TOO_LARGE)
        elif call != "call-09":  # call-09 stays in flight
            head = await store.writer.start_projecting(head, b'{"ok":true}')
            await store.writer.complete(head, b'{"ok":1}', EvidenceStatus.EVIDENCE_FOUND, "s")


def page_of(call: str) -> str:
    return f"/console/runs/{RUN}/invocations/{invocation_id(RUN, call)}"


def text_of(answer: httpx.Response) -> str:
    """The page's text without its markup."""
    return html.unescape(re.sub(r"<[^>]+>", "", answer.text))


@pytest.fixture
async def console(make_store: Any) -> Any:
    """The console over the populated run, as an operator's HTTP client."""
    store: Store = make_store(shards=2)
    await populate(store)
    async with (
        serving(store) as base,
        httpx.AsyncClient(
            base_url=base, headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}
        ) as client,
    ):
        yield client


async def test_failed_calls_are_grouped_by_type_with_counts_and_their_first_line(
    console: httpx.AsyncClient,
) -> None:
    """The run page's groups: CardDeclined 3 (its first call's first line), KeyError 1,
    TimeoutError 1, and the call with no detail under its code; each failed call of the
    list says its type and first line, the secret filtered."""
    page = await console.get(f"/console/runs/{RUN}")
    assert page.status_code == 200
    groups = re.search(r'<table id="failure-groups">(.*?)</table>', page.text, re.S)
    assert groups is not None
    rows = [
        html.unescape(re.sub(r"<[^>]+>", "|", row)).split("|")
        for row in re.findall(r"<tr>(.*?)</tr>", groups.group(1), re.S)[1:]
    ]
    cells = [[cell.strip() for cell in row if cell.strip()] for row in rows]
    assert [row[:2] for row in cells] == [
        ["3", "billing.CardDeclined"],
        ["1", "(RESULT_TOO_LARGE)"],
        ["1", "KeyError"],
        ["1", "TimeoutError"],
    ]
    assert cells[0][2:] == ["card declined: 402 Payment Required", "call-01"]
    assert cells[1][2:] == ["call-08"]  # no detail kept: no line
    assert cells[3][2:] == ["the search backend took 30 s", "call-03"]
    problems = text_of(page).split("calls that ended ERROR", 1)[1]
    assert "billing.CardDeclined: card declined (api_key=[Filtered])" in problems
    assert "retry later" not in problems  # the first line only
    assert SECRET not in page.text
    listed = await console.get(f"/console/runs/{RUN}?status=ERROR")
    table = text_of(listed).split("tool call id", 3)[-1]
    assert "TimeoutError: the search backend took 30 s" in table


async def test_a_group_lists_its_calls_and_the_search_says_what_each_raised(
    console: httpx.AsyncClient,
) -> None:
    """A group's count lists exactly its calls (?type=); the search across runs by code
    shows each failed call's type and first line too."""
    page = await console.get(f"/console/runs/{RUN}")
    link = re.search(r'class="group-count" href="([^"]+)">3<', page.text)
    assert link is not None
    listed = await console.get(html.unescape(link.group(1)))
    ids = re.findall(r'<table id="calls">.*', listed.text, re.S)[0]
    assert re.findall(r"<bdi>(call-\d+)</bdi>", ids) == ["call-01", "call-04", "call-07"]
    found = await console.get("/console/search?code=EXECUTION_FAILED")
    assert "KeyError: &#39;city&#39;" in found.text or "KeyError: 'city'" in text_of(found)
    assert SECRET not in found.text


@pytest.mark.parametrize(
    ("query", "goes_to"),
    [("call-06", "call-06"), ("call-0", None), ("call-1", None), ("call-07?", None)],
    ids=["exact", "ambiguous", "none", "not-an-id"],
)
async def test_a_tool_call_id_or_its_start_opens_its_call(
    console: httpx.AsyncClient, query: str, goes_to: str | None
) -> None:
    """?q= with a call's id answers 303 to its page; a start shared by several lists them;
    one nobody has says so (no 400, no empty page)."""
    answer = await console.get(f"/console/runs/{RUN}", params={"q": query})
    if goes_to is not None:
        assert answer.status_code == 303
        assert answer.headers["location"] == page_of(goes_to)
        return
    assert answer.status_code == 200
    ids = re.findall(r"<bdi>(call-\d+)</bdi>", answer.text.split('id="calls"', 1)[1])
    if query == "call-0":
        assert ids == [f"call-{n:02d}" for n in range(10)]
    else:
        assert ids == [] and 'id="not-found"' in answer.text


async def test_a_unique_start_opens_its_call_within_the_filter(
    console: httpx.AsyncClient,
) -> None:
    """?status=ERROR&q=call-06 and ?q=call-06 alike open call-06; the filter stays with it."""
    answer = await console.get(f"/console/runs/{RUN}", params={"status": "ERROR", "q": "call-0"})
    assert answer.status_code == 200  # six failed calls start so
    answer = await console.get(f"/console/runs/{RUN}", params={"status": "ERROR", "q": "call-06"})
    assert answer.status_code == 303
    assert answer.headers["location"] == f"{page_of('call-06')}?status=ERROR"


async def test_previous_and_next_follow_the_list_the_call_was_opened_from(
    console: httpx.AsyncClient,
) -> None:
    """Opened from the failed calls, call-04's neighbours are call-03 and call-06, and it is
    call 3 of 6 listed; opened from its type, call-01 and call-07; opened from the whole
    run, call-03 and call-05; a filter that does not keep it gives the run's."""
    cases = [
        ("?status=ERROR", "call-03", "call-06", "call 3 of 6 listed"),
        ("?status=ERROR&type=billing.CardDeclined", "call-01", "call-07", "call 2 of 3 listed"),
        ("", "call-03", "call-05", "call 5 of 10 in its run"),
        ("?status=READY", "call-03", "call-05", "call 5 of 10 in its run"),
    ]
    for query, previous, following, place in cases:
        page = await console.get(page_of("call-04") + query)
        assert page.status_code == 200, (query, page.text[:500])
        previous_link = re.search(r'id="previous-call" href="([^"]+)"', page.text)
        next_link = re.search(r'id="next-call" href="([^"]+)"', page.text)
        assert previous_link is not None and next_link is not None
        kept = html.unescape(query) if "READY" not in query else ""
        assert html.unescape(previous_link.group(1)) == page_of(previous) + kept, query
        assert html.unescape(next_link.group(1)) == page_of(following) + kept, query
        assert place in text_of(page), query
    # Stepping on from the last failed call of a type ends there.
    last = await console.get(page_of("call-07") + "?status=ERROR&type=billing.CardDeclined")
    assert 'id="next-call"' not in last.text and 'id="previous-call"' in last.text


async def test_the_overview_of_an_open_run_spans_its_calls_not_the_wall_clock(
    console: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run is open and call-09 still in flight; ten minutes later by the console's
    clock its overview still spans the ten calls' milliseconds, over many columns."""
    later = now_ms() + 600_000
    monkeypatch.setattr(views, "now_ms", lambda: later)
    page = await console.get(f"/console/runs/{RUN}")
    span = re.search(
        r"Every call of the run by when it was created, (.+?) in\s+(\d+) filled", page.text
    )
    assert span is not None, page.text[:2000]
    assert "min" not in span.group(1) and int(span.group(2)) >= 5, span.groups()
    assert 'data-live="1"' in page.text  # open, with a call in flight: it refreshes
