"""The console finds the bad call of a 3,000-call run, in a real headless browser.

An operator logs in, keeps the runs with errors, opens the big run, cuts its table to the
failed calls, opens the first and reads its failure detail with the secret the tool's
exception carried already filtered, steps to the next failed call, pages forward through
the whole table, and watches a run in progress show a new call without reloading the
page. The screenshots are the ones docs/operators.md shows (``.artifacts/console/``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any

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


async def charge(arguments: dict[str, Any], call: ToolCall) -> Any:
    """Succeed, except every FAIL_EVERY-th call, which raises with a secret in its text."""
    if arguments["n"] % FAIL_EVERY == FAIL_EVERY - 1:
        raise CardDeclined(
            f"POST https://api.example/v1/charges?token={SECRET} answered 402 Payment Required"
        )
    return {"charged": arguments["n"]}


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

    # The big run: its overview pictures all 3,000 calls; its failed calls come first.
    driver.find_element(By.LINK_TEXT, BIG_RUN).click()
    wait.until(lambda d: d.find_elements(By.ID, "overview"))
    assert driver.find_elements(By.CSS_SELECTOR, "svg#overview g.column")
    failed = CALLS // FAIL_EVERY
    assert f"of {failed} calls that ended ERROR" in driver.find_element(By.TAG_NAME, "main").text
    screenshot(driver, "tour-run", whole=False)

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

    # Its neighbour in the run, then back to the whole table, paged forward.
    place = re.search(r"call (\d+) of 3000", driver.find_element(By.ID, "neighbours").text)
    assert place is not None
    driver.find_element(By.ID, "next-call").click()
    wait.until(
        lambda d: (
            f"call {int(place.group(1)) + 1} of 3000" in d.find_element(By.ID, "neighbours").text
        )
    )
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


async def test_an_operator_filters_a_3000_call_run_to_its_errors_and_watches_a_live_run(
    make_store: Any,
    browser: webdriver.Chrome,
) -> None:
    """Runs with errors, the run's failed calls, the first one's filtered detail, its next,
    the table paged forward, and a new call of a live run shown without a reload."""
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
