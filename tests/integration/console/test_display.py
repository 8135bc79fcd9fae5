"""What the console's pages show of hostile or huge data: ids holding bidirectional and
other invisible controls are shown escaped, never obeyed; a run of thousands of calls is
paged, and no page (run, call, payloads) grows with what is stored."""

from __future__ import annotations

import asyncio
import re
import unicodedata
from datetime import timedelta
from typing import Any

import httpx
import msgspec

from eventstore.store import Store
from machine.codes import ErrorCode, EvidenceStatus
from machine.ids import invocation_id
from projections.console.views import CALLS_PER_PAGE
from tests.support.console_run import OPERATOR_TOKEN, serving

BEARER = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
#: No console page may be larger than this, whatever the run holds.
MAX_PAGE_BYTES = 256 * 1024
#: A call id that reads "callexe.txt" when its U+202E (right-to-left override) is obeyed.
BIDI_CALL = "call\u202etxt.exe"
#: Other invisible characters a call id may hold: isolates, a mark, a zero-width space.
INVISIBLE_CALL = "a\u2066b\u2069c\u200fd\u200be\ufeff"


def invisible(text: str) -> list[str]:
    """The characters of ``text`` a reader cannot see (format, private, unassigned ...),
    the page's own line breaks and tabs aside."""
    return sorted(
        {
            f"U+{ord(ch):04X}"
            for ch in text
            if ch not in "\n\t" and unicodedata.category(ch) in ("Cc", "Cf", "Co", "Cn", "Zl", "Zp")
        }
    )


async def test_ids_with_bidi_controls_are_shown_escaped_everywhere(make_store: Any) -> None:
    """The run page, the call's page (heading, receipt, failure detail) and its payloads
    page hold no bidi control or other invisible character: each is shown as ``\\u202e``,
    and the id sits in a ``<bdi>``."""
    store: Store = make_store(shards=2)
    run = "run-bidi"
    await store.open_run(run, deadline=timedelta(minutes=5))
    head = await store.writer.create(run, BIDI_CALL, "search", b'{"q":"\\u202e"}')
    head = await store.writer.start_projecting(head, '{"raw":"x\u202ey"}'.encode())
    await store.writer.complete(head, b"{}", EvidenceStatus.EVIDENCE_FOUND, "s")
    head = await store.writer.create(run, INVISIBLE_CALL, "fetch", b"{}")
    detail = {"type": "ValueError", "message": "bad \u202eid", "traceback": "t\u2067x"}
    await store.writer.fail(
        head, ErrorCode.EXECUTION_FAILED, failure_detail=msgspec.json.encode(detail)
    )
    async with serving(store) as base, httpx.AsyncClient(base_url=base, headers=BEARER) as client:
        run_page = await client.get(f"/console/runs/{run}")
        assert run_page.status_code == 200
        assert invisible(run_page.text) == []
        assert "call\\u202etxt.exe" in run_page.text
        assert "a\\u2066b\\u2069c\\u200fd\\u200be\\ufeff" in run_page.text
        assert re.search(r"<bdi>[^<]*call\\u202etxt\.exe", run_page.text)
        for call in (BIDI_CALL, INVISIBLE_CALL):
            path = f"/console/runs/{run}/invocations/{invocation_id(run, call)}"
            for page in (await client.get(path), await client.get(path + "/payloads")):
                assert page.status_code == 200
                assert invisible(page.text) == [], (call, page.url)
        failed = await client.get(
            f"/console/runs/{run}/invocations/{invocation_id(run, INVISIBLE_CALL)}"
        )
        assert "bad \\u202eid" in failed.text and "t\\u2067x" in failed.text
        ok = await client.get(f"/console/runs/{run}/invocations/{invocation_id(run, BIDI_CALL)}")
        assert re.search(r"<h1>Call <bdi>call\\u202etxt\.exe</bdi></h1>", ok.text)
        assert "tool_call_id&#34;: &#34;call\\u202etxt.exe" in ok.text  # in the receipt
        assert "<title>call\\u202etxt.exe" in ok.text


async def write_calls(store: Store, run: str, count: int) -> None:
    """Create ``count`` calls of ``run`` through the Writer, 200 at a time."""
    ids = [f"call-{index:05d}" for index in range(count)]
    for start in range(0, count, 200):
        await asyncio.gather(
            *(
                store.writer.create(run, call, "search", b'{"q":1}')
                for call in ids[start : start + 200]
            )
        )


async def test_a_run_of_thousands_of_calls_is_paged_with_every_page_bounded(
    make_store: Any,
) -> None:
    """1,600 calls: each run page shows at most CALLS_PER_PAGE calls (table and timeline),
    says which of how many, links to the next until the last; every page is under a fixed
    size and together they show each call once. A page past the last is 404, a bad page
    number 400 (an empty one is none)."""
    store: Store = make_store(shards=2)
    run, total = "run-big", 1_600
    await store.open_run(run, deadline=timedelta(minutes=5))
    await write_calls(store, run, total)
    seen: list[str] = []
    async with serving(store) as base, httpx.AsyncClient(base_url=base, headers=BEARER) as client:
        path: str | None = f"/console/runs/{run}"
        pages = 0
        while path is not None:
            page = await client.get(path)
            assert page.status_code == 200, path
            assert len(page.content) < MAX_PAGE_BYTES, (path, len(page.content))
            pages += 1
            first = (pages - 1) * CALLS_PER_PAGE + 1
            last = min(pages * CALLS_PER_PAGE, total)
            assert f"calls {first}\N{EN DASH}{last} of {total}" in page.text
            assert page.text.count('<rect class="bar"') == last - first + 1
            seen += re.findall(r"><bdi>(call-\d{5})</bdi></a>", page.text)
            found = re.search(r'id="later-calls" href="([^"]+)"', page.text)
            path = found.group(1) if found else None
        assert pages == -(-total // CALLS_PER_PAGE) > 1
        assert sorted(seen) == [f"call-{index:05d}" for index in range(total)]
        beyond = await client.get(f"/console/runs/{run}?page={pages + 1}")
        assert beyond.status_code == 404
        earlier = await client.get(f"/console/runs/{run}?page=2")
        assert 'id="earlier-calls" href="/console/runs/run-big?page=1"' in earlier.text
        for bad in ("0", "-1", "x", "1e3", "9" * 30):
            assert (await client.get(f"/console/runs/{run}?page={bad}")).status_code == 400, bad
        # An empty field is what a filter form sends for "any": the first page.
        assert "calls 1\N{EN DASH}" in (await client.get(f"/console/runs/{run}?page=")).text
        assert (await client.get(f"/console/runs/{run}?page=1&x=1")).status_code == 400


async def test_a_huge_payload_and_failure_detail_are_shown_cut(make_store: Any) -> None:
    """A megabyte raw response and a 300 kB failure detail: the payloads page and the call's
    page stay under the fixed size and say how much is shown and where the whole is."""
    store: Store = make_store(shards=2)
    run = "run-huge"
    await store.open_run(run, deadline=timedelta(minutes=5))
    head = await store.writer.create(run, "c-big", "search", b"{}")
    raw = b'"' + b"r" * 1_000_000 + b'"'
    head = await store.writer.start_projecting(head, raw)
    await store.writer.complete(head, b"{}", EvidenceStatus.EVIDENCE_FOUND, "s")
    head = await store.writer.create(run, "c-fail", "fetch", b"{}")
    detail = {"type": "E", "message": "m" * 300_000, "traceback": "t" * 300_000}
    await store.writer.fail(
        head, ErrorCode.EXECUTION_FAILED, failure_detail=msgspec.json.encode(detail)
    )
    async with serving(store) as base, httpx.AsyncClient(base_url=base, headers=BEARER) as client:
        payloads = await client.get(
            f"/console/runs/{run}/invocations/{invocation_id(run, 'c-big')}/payloads"
        )
        assert payloads.status_code == 200
        assert len(payloads.content) < MAX_PAGE_BYTES
        assert f"of {len(raw)} bytes" in payloads.text
        assert f"canon export {run} --with-payloads" in payloads.text
        failed = await client.get(f"/console/runs/{run}/invocations/{invocation_id(run, 'c-fail')}")
        assert failed.status_code == 200
        assert len(failed.content) < MAX_PAGE_BYTES
        assert "of 300000 characters" in failed.text
