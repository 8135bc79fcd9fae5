"""The console after the TTL: a run Redis let go is shown from the archive, marked archived
and read-only (no decision form, no refresh), on the same run, call and payloads pages; and
with an archive the search page searches it across runs, a page at a time.

One abstract case (:class:`ArchivedConsoleContract`), once per archive backend (SQLite, and
PostgreSQL on a private server). The browser test lets the run's keys expire (a short TTL,
waited on, never slept); the others delete them, which is what Redis does at expiry.
"""

from __future__ import annotations

import asyncio
import html
import pathlib
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from structlog.testing import capture_logs

from eventstore.decisions import new_approval_id
from eventstore.keyring import Keyring
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.codes import ErrorCode, EvidenceStatus
from machine.ids import invocation_id
from projections.archive import ArchiveWorker, open_archive
from projections.archive.database import ArchiveDatabase
from projections.archive.schema import migrate
from projections.console import Console, OperatorAuth
from tests.integration.console.test_serve import serve_console, stop
from tests.integration.receipts.test_serve import spawn
from tests.support.browser import replaced, screenshot
from tests.support.console_run import (
    DETAIL,
    FAILED_CALL,
    OPERATOR_TOKEN,
    SECRET_REQUEST,
    csrf_of,
    next_millisecond,
    serving,
)
from tests.support.postgres import postgres_url  # noqa: F401 (a fixture)
from tests.support.waiting import wait_for

__all__ = ["spawn"]  # the fixture, used by name

RUN = "run-archived"
KEYRING = Keyring({"k1": bytes(range(32))}, "k1")
SECRET = "sk-live-9f8e7d6c5b4a39281706"
BEARER = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


def call_path(run_id: str, tool_call_id: str) -> str:
    """The console page of one call."""
    return f"/console/runs/{run_id}/invocations/{invocation_id(run_id, tool_call_id)}"


async def write_run(store: Store, deadline: timedelta) -> None:
    """The run: two READY calls, a failed call with its failure detail, a call whose
    request holds a secret, a governed call alice denied, and a call left in flight."""
    await store.open_run(RUN, deadline=deadline)
    for call in ("c1", "c2"):
        await next_millisecond()
        head = await store.writer.create(RUN, call, "search", SECRET_REQUEST)
        head = await store.writer.start_projecting(head, b'{"raw":1}')
        await store.writer.complete(head, b'{"ok":1}', EvidenceStatus.EVIDENCE_FOUND, "s")
    await next_millisecond()
    head = await store.writer.create(RUN, FAILED_CALL, "fetch", SECRET_REQUEST)
    await store.writer.fail(
        head, ErrorCode.EXECUTION_FAILED, failure_detail=msgspec.json.encode(DETAIL)
    )
    await next_millisecond()
    head = await store.writer.create(RUN, "keyed", "fetch", f'{{"api_key":"{SECRET}"}}'.encode())
    head = await store.writer.start_projecting(head, b"{}")
    await store.writer.complete(head, b"{}", EvidenceStatus.EVIDENCE_FOUND, "s")
    await next_millisecond()
    await store.writer.request_approval(
        RUN,
        "pay",
        "refund",
        b'{"amount":5}',
        approval_id=new_approval_id(),
        approval_expires_at_ms=now_ms() + 600_000,
        requested_by="agent",
    )
    await store.decide(RUN, "pay", approve=False, by="alice", reason="not this one")
    await store.writer.create(RUN, "in-flight", "search", b"{}")


async def archive_now(store: Store, database: ArchiveDatabase) -> None:
    """Archive everything finished so far (one burst of the archive worker)."""
    await ArchiveWorker(store, database, consumer="console-test").run(burst=True)


async def forget_run(store: Store, redis: Any) -> None:
    """Delete the run's keys, as Redis does when they expire."""
    keys = [store.keys.run(RUN)]
    for call in ("c1", "c2", FAILED_CALL, "keyed", "pay", "in-flight"):
        keys += [store.keys.record(RUN, call), store.keys.stream(RUN, call)]
    for key in keys:
        await redis.delete(key)


def archived_console(store: Store, database: ArchiveDatabase) -> Console:
    """The console over the store, falling back to the archive."""
    return Console(store, OperatorAuth(OPERATOR_TOKEN), archive=database)


def browse(driver: webdriver.Chrome, base: str) -> list[pathlib.Path]:
    """Log in on the expired run's page, open its failed call and its payloads, then find
    the call again on the search page; every page of the run says archived, none decides."""
    wait = WebDriverWait(driver, 20)
    driver.get(f"{base}/console/runs/{RUN}")
    wait.until(lambda d: d.find_element(By.ID, "token")).send_keys(OPERATOR_TOKEN)
    driver.find_element(By.ID, "login").click()
    wait.until(lambda d: d.find_elements(By.ID, "timeline"))
    assert "Archived" in driver.find_element(By.ID, "archived").text
    assert len(driver.find_elements(By.CSS_SELECTOR, "svg#timeline rect.bar")) == 5
    assert not driver.find_elements(By.CSS_SELECTOR, "script[src='/console/live.js']")
    shots = [screenshot(driver, "archived-run")]
    driver.find_element(By.LINK_TEXT, FAILED_CALL).click()
    detail = wait.until(lambda d: d.find_element(By.ID, "failure-detail"))
    assert DETAIL["type"] in detail.text and DETAIL["message"] in detail.text
    assert driver.find_element(By.ID, "archived").is_displayed()
    assert "intact" in driver.find_element(By.ID, "verdict").text
    assert driver.find_element(By.ID, "receipt-status").text == "404"
    receipt = driver.find_element(By.ID, "receipt").text
    assert invocation_id(RUN, FAILED_CALL) in receipt and '"evidence_status": "ERROR"' in receipt
    shots.append(screenshot(driver, "archived-call"))
    driver.find_element(By.ID, "show-payloads").click()
    wait.until(lambda d: "REQUEST-PAYLOAD-MARKER" in d.page_source)
    assert driver.find_element(By.ID, "archived").is_displayed()
    driver.get(f"{base}{call_path(RUN, 'pay')}")
    assert "denied by alice" in wait.until(lambda d: d.find_element(By.ID, "decision")).text
    driver.get(f"{base}/console/search")
    form = wait.until(lambda d: d.find_element(By.ID, "archive-search"))
    form.find_element(By.NAME, "tool").send_keys("fetch")
    form.find_element(By.NAME, "exception").send_keys(DETAIL["type"])
    form.find_element(By.NAME, "where").send_keys('request.q="REQUEST-PAYLOAD-MARKER"')
    form.find_element(By.CSS_SELECTOR, "button[type='submit']").click()
    # The unfiltered page lists every archived call too: wait for the answer's page.
    wait.until(replaced(form))
    found = wait.until(lambda d: d.find_element(By.ID, "found"))
    assert [a.text for a in found.find_elements(By.CSS_SELECTOR, "bdi")] == [FAILED_CALL]
    shots.append(screenshot(driver, "archive-search"))
    found.find_element(By.LINK_TEXT, FAILED_CALL).click()
    wait.until(lambda d: d.find_elements(By.ID, "failure-detail"))
    assert driver.find_element(By.ID, "archived").is_displayed()
    return shots


class ArchivedConsoleContract:
    """What the console does with each archive backend (subclassed once per backend)."""

    @pytest.fixture
    def archive_url(self) -> str:
        """The URL of an empty archive (migrated by ``archive``)."""
        raise NotImplementedError

    @pytest.fixture
    async def archive(self, archive_url: str) -> AsyncIterator[ArchiveDatabase]:
        """The archive database, migrated, closed after the test."""
        database = open_archive(archive_url)
        await migrate(database)
        try:
            yield database
        finally:
            await database.aclose()

    async def test_an_expired_run_is_browsed_from_the_archive(
        self,
        make_open_store: Any,
        redis: Any,
        archive: ArchiveDatabase,
        browser: webdriver.Chrome,
    ) -> None:
        """Once Redis let the run's keys expire, its run page, a call's page and its
        payloads come from the archive, marked archived, with no decision form; the search
        page finds the call across runs and links to its page."""
        store: Store = await make_open_store(shards=2, ttl=timedelta(seconds=3))
        await write_run(store, deadline=timedelta(seconds=1))
        await archive_now(store, archive)

        async def gone() -> bool:
            return await redis.exists(store.keys.run(RUN), store.keys.record(RUN, "c1")) == 0

        await wait_for(gone, timeout_s=15)
        async with serving(store, app=archived_console(store, archive)) as base:
            shots = await asyncio.to_thread(browse, browser, base)
        for shot in shots:
            assert shot.stat().st_size > 10_000, shot  # a rendered page, not a blank one

    async def test_archived_pages_are_read_only_and_reveal_is_logged(
        self, make_open_store: Any, redis: Any, archive: ArchiveDatabase
    ) -> None:
        """An archived run's pages carry no decision form and never refresh; a decision
        posted anyway decides nothing; a masked payload is revealed by the logged POST;
        a call that was never archived is 404; a run Redis holds is not marked archived."""
        store: Store = await make_open_store(shards=2)
        await write_run(store, deadline=timedelta(minutes=5))
        await archive_now(store, archive)
        console = archived_console(store, archive)
        async with serving(store, app=console) as base, httpx.AsyncClient(base_url=base) as client:
            live = await client.get(f"/console/runs/{RUN}", headers=BEARER)
            assert live.status_code == 200 and 'id="archived"' not in live.text
            await forget_run(store, redis)
            assert (await client.post("/console/login", data={"token": OPERATOR_TOKEN})).is_redirect
            pages = [
                await client.get(path)
                for path in (
                    f"/console/runs/{RUN}",
                    f"/console/runs/{RUN}?status=ERROR",
                    call_path(RUN, "pay"),
                    call_path(RUN, FAILED_CALL),
                    call_path(RUN, "keyed") + "/payloads",
                )
            ]
            for page in pages:
                assert page.status_code == 200, page.url
                assert 'id="archived"' in page.text and "live.js" not in page.text
                assert 'class="decide"' not in page.text and '/approval"' not in page.text
            assert "denied by <b>alice</b>" in pages[2].text
            decided = await client.post(
                call_path(RUN, "pay") + "/approval",
                data={"csrf": csrf_of(pages[2].text), "decision": "approve", "reason": "late"},
                follow_redirects=True,
            )
            assert "no such call (it may have expired); nothing decided" in decided.text
            assert not await redis.exists(store.keys.record(RUN, "pay"))

            masked = pages[4]
            assert SECRET not in masked.text and "[Filtered]" in masked.text
            with capture_logs() as logs:
                revealed = await client.post(
                    call_path(RUN, "keyed") + "/payloads", data={"csrf": csrf_of(masked.text)}
                )
            assert revealed.status_code == 200 and SECRET in html.unescape(revealed.text)
            assert 'id="archived"' in revealed.text
            assert ("payloads_revealed", RUN) in [(e["event"], e.get("run_id")) for e in logs]
            for path in (call_path(RUN, "in-flight"), call_path("run-never", "c1")):
                assert (await client.get(path)).status_code == 404, path
            assert (await client.get("/console/runs/run-never")).status_code == 404

    async def test_an_encrypted_runs_archived_payloads_open_with_the_consoles_keyring(
        self, make_open_store: Any, redis: Any, archive: ArchiveDatabase
    ) -> None:
        """A run encrypted at rest, archived, then gone from Redis: the console whose store
        has the keyring shows its payloads opened from the archive (with the run's
        archived data key); without the keyring each shows as ``encrypted (key k1)``."""
        keyed: Store = await make_open_store(shards=2, keys=KEYRING)
        await write_run(keyed, deadline=timedelta(minutes=5))
        await archive_now(keyed, archive)
        await forget_run(keyed, redis)
        plain: Store = await make_open_store(shards=2)
        path = call_path(RUN, "c1") + "/payloads"
        pages = []
        for store in (keyed, plain):
            async with (
                serving(store, app=archived_console(store, archive)) as base,
                httpx.AsyncClient(base_url=base) as client,
            ):
                pages.append(await client.get(path, headers=BEARER))
        opened, sealed = (html.unescape(page.text) for page in pages)
        assert [page.status_code for page in pages] == [200, 200]
        assert 'id="archived"' in opened and 'id="archived"' in sealed
        assert "REQUEST-PAYLOAD-MARKER" in opened and "encrypted (key" not in opened
        assert "REQUEST-PAYLOAD-MARKER" not in sealed and "encrypted (key k1)" in sealed

    async def test_the_search_page_finds_archived_calls_a_page_at_a_time(
        self, make_open_store: Any, archive: ArchiveDatabase
    ) -> None:
        """Every filter of the search page narrows the archived calls it lists, newest
        first, 50 a page with a link to the next; each call links to its page; a search
        it cannot read is 400 without repeating it."""
        store: Store = await make_open_store(shards=2)
        await write_run(store, deadline=timedelta(minutes=5))
        other = "run-other"
        await store.open_run(other, deadline=timedelta(minutes=5))
        for i in range(52):
            await next_millisecond()  # each created strictly later: "newest first" is one order
            head = await store.writer.create(other, f"r{i}", "refund", b'{"amount":%d}' % (i * 20))
            detail = {"type": "TimeoutError" if i % 2 else "ValueError", "message": "m"}
            await store.writer.fail(
                head, ErrorCode.EXECUTION_FAILED, failure_detail=msgspec.json.encode(detail)
            )
        await archive_now(store, archive)
        async with (
            serving(store, app=archived_console(store, archive)) as base,
            httpx.AsyncClient(base_url=base, headers=BEARER) as client,
        ):

            async def found(query: str) -> tuple[list[str], str | None]:
                page = await client.get(f"/console/search?{query}")
                assert page.status_code == 200, query
                links = re.findall(r'href="(/console/runs/[^"]+/invocations/[^"]+)"', page.text)
                for link in links[:1]:
                    assert (await client.get(link)).status_code == 200, link
                calls = re.findall(r"<bdi>([^<]+)</bdi>", page.text)
                assert len(links) == len(calls)
                more = re.search(r'id="next-page" href="/console/search\?([^"]+)"', page.text)
                return calls, html.unescape(more.group(1)) if more else None

            first, more = await found("tool=refund&code=EXECUTION_FAILED")
            assert len(first) == 50 and more is not None and "cursor=" in more
            rest, last = await found(more)
            assert last is None and {*first, *rest} == {f"r{i}" for i in range(52)}
            assert first[0] == "r51"  # newest first
            timeouts, _ = await found("exception=TimeoutError&run=run-other")
            assert sorted(timeouts) == sorted(f"r{i}" for i in range(1, 52, 2))
            assert (await found("where=request.amount>1000"))[0] == ["r51"]
            assert (await found('where=request.amount="1020"'))[0] == []  # typed: a string
            assert (await found("approver=alice"))[0] == ["pay"]
            assert (await found(f"stage=READY&run={RUN}"))[0] == ["keyed", "c2", "c1"]
            assert (await found(f"since={now_ms() + 60_000}"))[0] == []
            assert len((await found("since=1970-01-01T00:00Z&until=2999-01-01"))[0]) == 50
            newest, _ = await found("")  # no filter: the newest archived calls
            assert len(newest) == 50 and "in-flight" not in newest
            for bad in ("where=zzqq", "since=zzqq", "cursor=zzqq", "zzqq=1", "tool=a&tool=b"):
                answer = await client.get(f"/console/search?{bad}")
                assert answer.status_code == 400, bad
                assert "zzqq" not in answer.text


class TestSqliteArchivedConsole(ArchivedConsoleContract):
    """The console over a SQLite archive."""

    @pytest.fixture
    def archive_url(self, tmp_path: Path) -> str:
        """A new SQLite file in the test's temp dir."""
        return f"sqlite:///{tmp_path / 'archive.db'}"


class TestPostgresArchivedConsole(ArchivedConsoleContract):
    """The console over a PostgreSQL archive (a private server, one namespace per test)."""

    @pytest.fixture
    def archive_url(self, postgres_url: str) -> str:  # noqa: F811 (the fixture's name)
        """The session's PostgreSQL database (tests keep apart by namespace)."""
        return postgres_url


async def test_serve_reads_the_archive_it_is_given(
    make_open_store: Any,
    redis: Any,
    redis_url: str,
    namespace: str,
    spawn: Any,
    tmp_path: Path,
) -> None:
    """``canon serve --archive URL`` shows a run Redis no longer holds from that archive;
    without an operator token it refuses to start (the archive is the console's alone),
    and an archive that was never migrated stops it with the command that migrates it."""
    url = f"sqlite:///{tmp_path / 'archive.db'}"
    store: Store = await make_open_store(shards=2)
    await write_run(store, deadline=timedelta(minutes=5))
    async with open_archive(url) as database:
        await migrate(database)
        await archive_now(store, database)
    await forget_run(store, redis)
    token_file = tmp_path / "operator-token"
    token_file.write_text(OPERATOR_TOKEN + "\n")
    process, output, port = await serve_console(
        spawn, redis_url, namespace, f"--operator-token-file={token_file}", "--archive", url
    )
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=BEARER) as client:
        page = await client.get(f"/console/runs/{RUN}")
        assert page.status_code == 200 and 'id="archived"' in page.text
        search = await client.get("/console/search?approver=alice")
        assert search.status_code == 200 and "<bdi>pay</bdi>" in search.text
    await stop(process)
    assert url not in output.read_text()

    fresh = f"sqlite:///{tmp_path / 'new.db'}"
    for extra, says in (
        (("--archive", url), "needs operators"),
        ((f"--operator-token-file={token_file}", "--archive", fresh), "canon archive --migrate"),
    ):
        process, output = spawn(
            "serve", f"--redis-url={redis_url}", f"--namespace={namespace}", "--port=0", *extra
        )
        assert await asyncio.to_thread(process.wait, 30) == 2, output.read_text()
        assert says in output.read_text()
