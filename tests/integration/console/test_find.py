"""The console finds the bad call: runs filtered by what went wrong, calls searched across
runs, a run's table cut by status and tool, a call's neighbours and sizes, the receipt as
the receipt API answers it, and a run in progress that refreshes itself."""

from __future__ import annotations

import html
import re
from datetime import timedelta
from typing import Any

import httpx
import msgspec
import pytest

from eventstore.store import Store
from machine.codes import ErrorCode
from machine.ids import invocation_id
from tests.support.console_run import FAILED_CALL, OPERATOR_TOKEN, RUN, populate, serving

pytestmark = pytest.mark.backends("single", "cluster")
BEARER = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
CLOSED_RUN = "run-closed"


def run_links(page: str) -> list[str]:
    """The runs a runs page lists, in order."""
    return re.findall(r'<td><a href="/console/runs/([^"?]+)">', page)


def table_calls(page: str, table: str = "calls") -> list[str]:
    """The tool call ids a table of the page lists, in order."""
    body = page.split(f'<table id="{table}">', 1)[1].split("</table>", 1)[0]
    return re.findall(r"<bdi>([^<]+)</bdi>", body)


def same_receipt(shown: dict[str, Any], answered: dict[str, Any]) -> bool:
    """Equal field for field, but for the time each was read (``observed_at``)."""
    assert shown.pop("observed_at") and answered.pop("observed_at")
    return shown == answered


async def two_runs(store: Store) -> str:
    """The console's run (READY, failed and in-flight calls), and a closed run whose one
    call failed in its projection."""
    token = await populate(store)
    await store.open_run(CLOSED_RUN, deadline=timedelta(minutes=5))
    head = await store.writer.create(CLOSED_RUN, "closed-1", "search", b"{}")
    await store.writer.fail(head, ErrorCode.PROJECTION_FAILED)
    await store.close_run(CLOSED_RUN)
    return token


async def test_the_runs_page_filters_by_what_went_wrong(make_store: Any) -> None:
    """status, tool, code and an id prefix keep only the runs asked for; a bad filter is a
    400 naming what the page takes, never an echo of what was sent."""
    store: Store = make_store(shards=2)
    await two_runs(store)
    async with serving(store) as base, httpx.AsyncClient(base_url=base, headers=BEARER) as client:

        async def runs(query: str) -> list[str]:
            page = await client.get(f"/console/?{query}")
            assert page.status_code == 200, query
            return run_links(page.text)

        assert await runs("") == [CLOSED_RUN, RUN]
        assert await runs("status=in_flight") == [RUN]
        assert await runs("status=closed") == [CLOSED_RUN]
        assert await runs("status=errors&tool=fetch") == [RUN]
        assert await runs("code=PROJECTION_FAILED") == [CLOSED_RUN]
        assert await runs("q=c-fail") == [RUN]  # a tool call id prefix
        assert await runs("status=&tool=&code=&q=") == [CLOSED_RUN, RUN]  # an empty form
        assert "No run on this page matches" in (await client.get("/console/?q=zzz")).text
        for bad in ("status=broken", "x=1", "tool=a&tool=b", "q=" + "a" * 201, "q=%07"):
            answer = await client.get(f"/console/?{bad}")
            assert answer.status_code == 400, bad
            assert "broken" not in answer.text


async def test_a_call_search_lists_matching_calls_across_runs(make_store: Any) -> None:
    """/console/search by code or tool lists each matching call with links to it and its
    run; without a tool or code it is a 400."""
    store: Store = make_store(shards=2)
    await two_runs(store)
    async with serving(store) as base, httpx.AsyncClient(base_url=base, headers=BEARER) as client:
        failed = await client.get("/console/search?code=EXECUTION_FAILED")
        assert failed.status_code == 200
        assert table_calls(failed.text, "found") == [FAILED_CALL]
        assert f"/console/runs/{RUN}/invocations/{invocation_id(RUN, FAILED_CALL)}" in failed.text
        searches = await client.get("/console/search?tool=search")
        assert table_calls(searches.text, "found") == ["closed-1", "c1", "c2", "c-flight"]
        assert (await client.get("/console/search")).status_code == 400
        assert (await client.get("/console/search?cursor=1")).status_code == 400


async def test_the_run_page_puts_failed_calls_first_and_cuts_its_table(make_store: Any) -> None:
    """The failed calls are listed above the table; the table keeps a status, a tool or a
    code, and its page links keep the cut."""
    store: Store = make_store(shards=2)
    await populate(store)
    async with serving(store) as base, httpx.AsyncClient(base_url=base, headers=BEARER) as client:
        whole = await client.get(f"/console/runs/{RUN}")
        assert whole.text.index('id="problems"') < whole.text.index('id="calls"')
        assert table_calls(whole.text, "problems") == [FAILED_CALL]
        assert table_calls(whole.text) == ["c1", "c2", FAILED_CALL, "c-flight"]
        errors = await client.get(f"/console/runs/{RUN}?status=ERROR")
        assert table_calls(errors.text) == [FAILED_CALL]
        assert "calls 1\N{EN DASH}1 of 1 listed" in errors.text
        assert table_calls((await client.get(f"/console/runs/{RUN}?tool=fetch")).text) == [
            FAILED_CALL
        ]
        in_flight = await client.get(f"/console/runs/{RUN}?status=PROJECTING&tool=search")
        assert table_calls(in_flight.text) == ["c-flight"]
        assert table_calls((await client.get(f"/console/runs/{RUN}?code=NOPE")).text) == []
        assert (await client.get(f"/console/runs/{RUN}?status=DONE")).status_code == 400
        assert (await client.get(f"/console/runs/{RUN}?status=ERROR&page=2")).status_code == 404


async def test_the_call_page_shows_the_receipt_as_the_api_answers_it(make_store: Any) -> None:
    """The console's receipt is, field for field, what GET /v1/invocations/<id>/receipt
    answers the run's token holder, with the same HTTP status, also once the tool is
    revoked (409)."""
    store: Store = make_store(shards=2)
    token = await populate(store)
    async with (
        serving(store) as base,
        httpx.AsyncClient(base_url=base, headers=BEARER) as console,
        httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}) as api,
    ):
        for call in ("c1", FAILED_CALL, "c-flight"):
            inv = invocation_id(RUN, call)
            answer = await api.get(f"/v1/invocations/{inv}/receipt")
            page = (await console.get(f"/console/runs/{RUN}/invocations/{inv}")).text
            shown = re.search(r'<pre id="receipt">(.*?)</pre>', page, re.S)
            status = re.search(r'<span id="receipt-status">(\d+)</span>', page)
            assert shown is not None and status is not None
            assert same_receipt(msgspec.json.decode(html.unescape(shown.group(1))), answer.json())
            assert int(status.group(1)) == answer.status_code == 200
        await store.runs.revoke_tool(RUN, "search")
        inv = invocation_id(RUN, "c1")
        answer = await api.get(f"/v1/invocations/{inv}/receipt")
        page = (await console.get(f"/console/runs/{RUN}/invocations/{inv}")).text
        shown = re.search(r'<pre id="receipt">(.*?)</pre>', page, re.S)
        assert answer.status_code == 409 and 'id="receipt-status">409<' in page
        assert shown is not None
        assert msgspec.json.decode(html.unescape(shown.group(1))) == answer.json()


async def test_the_call_page_links_its_neighbours_and_sizes_each_payload(
    make_store: Any,
) -> None:
    """Previous and next call in the run's order, its place in the run, and each size with
    its unit and the store's limit for it."""
    store: Store = make_store(shards=2)
    await populate(store)
    async with serving(store) as base, httpx.AsyncClient(base_url=base, headers=BEARER) as client:
        second = await client.get(f"/console/runs/{RUN}/invocations/{invocation_id(RUN, 'c2')}")
        assert "call 2 of 4 in its run" in second.text
        previous = re.search(r'id="previous-call" href="([^"]+)"', second.text)
        following = re.search(r'id="next-call" href="([^"]+)"', second.text)
        assert previous is not None and previous.group(1).endswith(invocation_id(RUN, "c1"))
        assert following is not None and following.group(1).endswith(
            invocation_id(RUN, FAILED_CALL)
        )
        first = await client.get(previous.group(1))
        assert 'id="previous-call"' not in first.text and "call 1 of 4" in first.text
        assert "request 30 B, within the 64 KiB request limit" in second.text
        assert "agent result 34 B, within the 16 KiB agent result limit" in second.text
        payloads = await client.get(
            f"/console/runs/{RUN}/invocations/{invocation_id(RUN, 'c2')}/payloads"
        )
        assert "28 B, within the 1 MiB raw response limit" in payloads.text


async def test_a_run_in_progress_refreshes_itself_and_an_ended_one_does_not(
    make_store: Any,
) -> None:
    """A run page with calls in flight (or an open run) loads the console's one script,
    served as JavaScript under the page's policy (scripts of the console only); a closed
    run with nothing in flight loads none. The script needs the login as every page."""
    store: Store = make_store(shards=2)
    await two_runs(store)
    async with serving(store) as base, httpx.AsyncClient(base_url=base, headers=BEARER) as client:
        live = await client.get(f"/console/runs/{RUN}")
        assert '<script src="/console/live.js"></script>' in live.text
        assert 'id="live" data-live="1"' in live.text
        assert "script-src 'self'" in live.headers["content-security-policy"]
        ended = await client.get(f"/console/runs/{CLOSED_RUN}")
        assert "<script" not in ended.text and 'id="live" data-live="0"' in ended.text
        script = await client.get("/console/live.js")
        assert script.status_code == 200
        assert script.headers["content-type"].startswith("text/javascript")
        assert "data-live" in script.text and "fetch(" in script.text
        assert (await client.get("/console/live.js?x=1")).status_code == 400
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as anonymous:
        assert (await anonymous.get("/console/live.js")).status_code == 401
