"""The console finds the bad call of a 3,000-call run, in a real headless browser.

An operator logs in, keeps the runs with errors, opens the big run and reads its failures
grouped by exception type (the first line of each, its secret already filtered), cuts its
table to the failed calls, opens the first and reads its failure detail, steps to the next
failed call (the list it came from, not the run), lists one exception type from its count
and steps through it, finds a call by the start of its id and by its id, pages forward
through the whole table, and watches a run in progress show a new call without reloading
the page. A form posted to the console from another origin is refused. The screenshots
are the ones docs/operators.md shows (``.artifacts/console/``, copied to
``docs/img/console/``).
"""

from __future__ import annotations

import asyncio
import http.server
import re
import threading
from collections.abc import Callable, Coroutine, Iterator
from datetime import timedelta
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from eventstore import RunContext, Store, ToolBoundary, ToolSpec
from eventstore.boundary.contracts import Projection, ToolCall
from machine.codes import EvidenceStatus
from tests.support.browser import screenshot
from tests.support.calls import envelope
from tests.support.console_run import OPERATOR_TOKEN, serving

BIG_RUN = "run-3000"
CLEAN_RUN = "run-clean"
LIVE_RUN = "run-live"
CALLS = 3_000
#: Every this many calls of the big run, one fails.
FAIL_EVERY = 97
SECRET = "demo-secret-4f1c"


class CardDeclined(Exception):
    """What the charge tool raises: its message carries a token, as real clients' do."""


class NetworkTimeout(Exception):
    """What the charge tool raises when the card network does not answer."""


#: The failed calls' exception types, in turn, and how many of the 30 raise each.
RAISED = {CardDeclined: 10, NetworkTimeout: 10, KeyError: 10}


async def charge(arguments: dict[str, Any], call: ToolCall) -> Any:
    """Succeed, except every FAIL_EVERY-th call, which raises one of RAISED in turn; a
    declined card's message has a secret in its text."""
    n = arguments["n"]
    if n % FAIL_EVERY == FAIL_EVERY - 1:
        kind = list(RAISED)[n // FAIL_EVERY % len(RAISED)]
        if kind is CardDeclined:
            raise CardDeclined(
                f"POST https://api.example/v1/charges?token={SECRET} answered 402 Payment "
                "Required\n(the issuer gave no reason)"
            )
        if kind is NetworkTimeout:
            raise NetworkTimeout(f"the card network took 30 s to answer charge {n}")
        raise KeyError("currency")
    return {"charged": n}


def type_name(kind: type[BaseException]) -> str:
    """The type's name as a failure detail keeps it (builtins bare)."""
    if kind.__module__ == "builtins":
        return kind.__name__
    return f"{kind.__module__}.{kind.__qualname__}"


def scrolled_screenshot(driver: webdriver.Chrome, name: str, element_id: str) -> None:
    """A 1280x900 screenshot with the element ``element_id`` at its top."""
    driver.set_window_size(1280, 900)
    driver.execute_script(
        "document.getElementById(arguments[0]).scrollIntoView({block: 'start'})", element_id
    )
    screenshot(driver, name, whole=False, keep_scroll=True)


def project(raw: Any, call: ToolCall) -> Projection:
    """The agent sees what was charged."""
    return Projection(result=raw, evidence_status=EvidenceStatus.EVIDENCE_FOUND, scope="cards")


async def fill(boundary: ToolBoundary, run: str, first: int, count: int) -> None:
    """Make ``count`` calls of ``run`` through the boundary, 100 at a time."""
    for start in range(first, first + count, 100):
        await asyncio.gather(
            *(
                boundary.invoke(
                    RunContext(run),
                    envelope(f"call-{n:05d}", tool="charge", run_id=run, arguments={"n": n}),
                )
                for n in range(start, min(start + 100, first + count))
            )
        )


def tour(
    driver: webdriver.Chrome,
    base: str,
    submit: Callable[[Coroutine[Any, Any, None]], None],
    add_live_call: Callable[[], Coroutine[Any, Any, None]],
) -> None:
    """What the operator does, in the browser's own thread of control."""
    # Every run of the tour is still open, so each page it reads refreshes itself: a wait
    # may find a section just as a refresh puts its new copy in place.
    wait = WebDriverWait(driver, 30, ignored_exceptions=(StaleElementReferenceException,))
    driver.get(f"{base}/console/")
    wait.until(lambda d: d.find_element(By.ID, "token")).send_keys(OPERATOR_TOKEN)
    driver.find_element(By.ID, "login").click()
    wait.until(lambda d: d.find_elements(By.ID, "runs"))

    # Only the runs with errors.
    Select(driver.find_element(By.NAME, "status")).select_by_value("errors")
    driver.find_element(By.CSS_SELECTOR, "#filter button").click()
    wait.until(lambda d: "status=errors" in d.current_url)
    listed = [a.text for a in driver.find_elements(By.CSS_SELECTOR, "#runs td:first-child a")]
    assert listed == [BIG_RUN], listed
    screenshot(driver, "tour-runs-with-errors", whole=False)

    # The big run: its overview pictures all 3,000 calls; its failed calls come first,
    # grouped by what they raised, with counts and the first line of each.
    driver.find_element(By.LINK_TEXT, BIG_RUN).click()
    wait.until(lambda d: d.find_elements(By.ID, "overview"))
    assert driver.find_elements(By.CSS_SELECTOR, "svg#overview g.column")
    failed = CALLS // FAIL_EVERY
    assert f"of {failed} calls that ended ERROR" in driver.find_element(By.TAG_NAME, "main").text
    screenshot(driver, "tour-run", whole=False)
    groups = [
        [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        for tr in driver.find_elements(By.CSS_SELECTOR, "#failure-groups tr")[1:]
    ]
    assert sorted((row[1], int(row[0])) for row in groups) == sorted(
        (type_name(kind), count) for kind, count in RAISED.items()
    ), groups
    declined = next(row for row in groups if row[1] == type_name(CardDeclined))
    assert declined[2] == (
        "POST https://api.example/v1/charges?token=[Filtered] answered 402 Payment Required"
    )
    assert SECRET not in driver.page_source
    problems = driver.find_element(By.ID, "problems").text
    assert f"{type_name(NetworkTimeout)}: the card network took 30 s" in problems
    scrolled_screenshot(driver, "tour-failures-grouped", "failed-calls")

    # The table cut to the failed calls, then the first of them.
    Select(
        driver.find_element(By.CSS_SELECTOR, "#calls-filter select[name=status]")
    ).select_by_value("ERROR")
    driver.find_element(By.CSS_SELECTOR, "#calls-filter button").click()
    wait.until(lambda d: "status=ERROR" in d.current_url)
    statuses = [td.text for td in driver.find_elements(By.CSS_SELECTOR, "#calls td:nth-child(4)")]
    assert statuses == ["ERROR"] * failed, statuses
    driver.find_element(By.CSS_SELECTOR, "#calls td:nth-child(2) a").click()
    detail = wait.until(lambda d: d.find_element(By.ID, "failure-detail"))
    assert "CardDeclined" in detail.text and "402 Payment Required" in detail.text
    assert "[Filtered]" in detail.text and SECRET not in driver.page_source
    assert f"call-{FAIL_EVERY - 1:05d}" in driver.find_element(By.TAG_NAME, "h1").text
    screenshot(driver, "tour-failed-call", whole=False)

    # Its next is the next failed call (the list it was opened from), not the run's next.
    assert "call 1 of 30 listed (status ERROR)" in driver.find_element(By.ID, "neighbours").text
    driver.find_element(By.ID, "next-call").click()
    wait.until(lambda d: "call 2 of 30 listed" in d.find_element(By.ID, "neighbours").text)
    assert f"call-{2 * FAIL_EVERY - 1:05d}" in driver.find_element(By.TAG_NAME, "h1").text
    assert type_name(NetworkTimeout) in driver.find_element(By.ID, "failure-detail").text

    # One exception type, from its count on the run page: its calls only, stepped through.
    driver.get(f"{base}/console/runs/{BIG_RUN}")
    wait.until(lambda d: d.find_elements(By.ID, "failure-groups"))
    row = next(
        tr
        for tr in driver.find_elements(By.CSS_SELECTOR, "#failure-groups tr")[1:]
        if type_name(KeyError) in tr.text
    )
    row.find_element(By.CSS_SELECTOR, "a.group-count").click()
    wait.until(lambda d: "type=KeyError" in d.current_url)
    ids = [td.text for td in driver.find_elements(By.CSS_SELECTOR, "#calls td:nth-child(2)")]
    assert ids == [f"call-{n:05d}" for n in range(CALLS) if n % 291 == 290], ids
    driver.find_element(By.CSS_SELECTOR, "#calls td:nth-child(2) a").click()
    wait.until(lambda d: d.find_elements(By.ID, "neighbours"))
    driver.find_element(By.ID, "next-call").click()
    wait.until(lambda d: "call 2 of 10 listed" in d.find_element(By.ID, "neighbours").text)
    assert "exception type KeyError" in driver.find_element(By.ID, "neighbours").text
    assert f"call-{290 + 291:05d}" in driver.find_element(By.TAG_NAME, "h1").text
    screenshot(driver, "tour-failed-call-next", whole=False)

    # A call found by the start of its id (several: listed), then by its id (opened).
    driver.get(f"{base}/console/runs/{BIG_RUN}")
    box = wait.until(lambda d: d.find_element(By.ID, "call-id"))
    box.send_keys("call-0150")
    driver.find_element(By.CSS_SELECTOR, "#calls-filter button").click()
    wait.until(lambda d: "q=call-0150" in d.current_url)
    ids = [td.text for td in driver.find_elements(By.CSS_SELECTOR, "#calls td:nth-child(2)")]
    assert ids == [f"call-{n:05d}" for n in range(1500, 1510)], ids
    scrolled_screenshot(driver, "tour-call-lookup", "calls-heading")
    box = driver.find_element(By.ID, "call-id")
    box.clear()
    box.send_keys("call-01503")
    driver.find_element(By.CSS_SELECTOR, "#calls-filter button").click()
    wait.until(lambda d: "/invocations/" in d.current_url)
    assert "call-01503" in driver.find_element(By.TAG_NAME, "h1").text

    # Back to the whole table, paged forward.
    driver.get(f"{base}/console/runs/{BIG_RUN}")
    wait.until(lambda d: d.find_elements(By.ID, "later-calls"))
    driver.find_element(By.ID, "later-calls").click()
    wait.until(lambda d: "calls 101\N{EN DASH}200 of 3000" in d.page_source)
    # The second hundred made (the boundary made them a hundred at a time).
    ids = {td.text for td in driver.find_elements(By.CSS_SELECTOR, "#calls td:nth-child(2)")}
    assert ids == {f"call-{n:05d}" for n in range(100, 200)}, sorted(ids)[:3]
    # A refresh that brings nothing new leaves the page as it is: what the operator reads
    # (or has selected) is not swapped under them.
    table = driver.find_element(By.ID, "calls")
    wait.until(lambda d: "live: refreshed" in d.find_element(By.ID, "live-status").text)
    assert "call-00100" in table.text  # the same element, not a stale one

    # A run in progress: a new call shows up on its open page, which never reloads.
    driver.get(f"{base}/console/runs/{LIVE_RUN}")
    wait.until(lambda d: "live: refreshing" in d.find_element(By.ID, "live-status").text)
    driver.execute_script("window.canonTourMarker = 'not reloaded'")
    assert "call-live-new" not in driver.page_source
    submit(add_live_call())
    wait.until(lambda d: "call-live-new" in d.find_element(By.ID, "calls").text)
    assert driver.execute_script("return window.canonTourMarker") == "not reloaded"
    assert re.search(r"live: refreshed", driver.find_element(By.ID, "live-status").text)
    screenshot(driver, "tour-live-run", whole=False)


class Elsewhere:
    """A page of another origin (another port of this host: the same site, so the login
    cookie's SameSite=Strict does not hold it back) whose form posts a login to a console."""

    def __init__(self) -> None:
        self.target = ""
        page = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = (
                    f'<form method="post" action="{page.target}/console/login">'
                    f'<input name="token" value="{OPERATOR_TOKEN}">'
                    '<button id="forged" type="submit">go</button></form>'
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return  # nothing on the test's output

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """Where the page is."""
        return f"http://127.0.0.1:{self.server.server_address[1]}/"


@pytest.fixture
def elsewhere() -> Iterator[Elsewhere]:
    """The other origin's page, served on a thread that is stopped and joined after."""
    page = Elsewhere()
    page.thread.start()
    try:
        yield page
    finally:
        page.server.shutdown()
        page.server.server_close()
        page.thread.join(timeout=10)


def forged_login(driver: webdriver.Chrome, base: str, elsewhere: Elsewhere) -> None:
    """A login form of another origin, posted by the browser itself: refused by origin."""
    elsewhere.target = base
    driver.get(elsewhere.url)
    driver.find_element(By.ID, "forged").click()
    WebDriverWait(driver, 30).until(lambda d: "console's own pages" in d.page_source)
    assert driver.current_url == f"{base}/console/login"


async def test_an_operator_filters_a_3000_call_run_to_its_errors_and_watches_a_live_run(
    make_store: Any,
    browser: webdriver.Chrome,
    elsewhere: Elsewhere,
) -> None:
    """Runs with errors, the run's failures grouped by type, its failed calls, the first
    one's filtered detail, its next failed call, one type's calls stepped through, a call
    found by its id, the table paged forward, a new call of a live run shown without a
    reload; and a login form of another origin refused."""
    store: Store = make_store(shards=2)
    boundary = ToolBoundary(store, {"charge": ToolSpec(executor=charge, projector=project)})
    for run in (BIG_RUN, CLEAN_RUN, LIVE_RUN):
        await store.open_run(run, deadline=timedelta(minutes=10))
    await fill(boundary, CLEAN_RUN, 0, 10)  # none of these fails
    await fill(boundary, BIG_RUN, 0, CALLS)
    await fill(boundary, LIVE_RUN, 0, 3)
    loop = asyncio.get_running_loop()

    def submit(coroutine: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout=30)

    async def add_live_call() -> None:
        await boundary.invoke(
            RunContext(LIVE_RUN),
            envelope("call-live-new", tool="charge", run_id=LIVE_RUN, arguments={"n": 1}),
        )

    async with serving(store) as base:
        await asyncio.to_thread(tour, browser, base, submit, add_live_call)
        await asyncio.to_thread(forged_login, browser, base, elsewhere)
