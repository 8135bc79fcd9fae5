"""Settling a call whose process died, in a real headless browser (Debian's chromium): the
run page marks the calls left in flight, the attempted call's page explains what is known
and offers the settle form; the operator types the evidence and presses *It did not run*,
the page then says the call is reconciled, by whom, with the evidence, and *Request it
again* records the linked call that waits for its own approval. Screenshots are test
artifacts (``.artifacts/console/``); docs/operators.md shows two of them."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from machine.codes import ErrorCode, Stage
from machine.ids import invocation_id
from tests.support.browser import replaced, screenshot
from tests.support.console_run import OPERATOR_TOKEN, serving
from tests.support.stages import RUN, every_stage


def settle(driver: webdriver.Chrome, base: str) -> list[pathlib.Path]:
    """Log in on the run page, open the attempted call, settle it, request it again."""
    wait = WebDriverWait(driver, 20)
    driver.get(f"{base}/console/runs/{RUN}")
    wait.until(lambda d: d.find_element(By.ID, "token")).send_keys(OPERATOR_TOKEN)
    driver.find_element(By.ID, "login").click()
    wait.until(lambda d: d.find_elements(By.ID, "left-in-flight"))
    shots = [screenshot(driver, "settle-run-page", whole=False)]
    driver.get(f"{base}/console/runs/{RUN}/invocations/{invocation_id(RUN, 't1')}")
    form = wait.until(lambda d: d.find_element(By.ID, "settle"))
    assert "may have run" in form.text, form.text
    form.find_element(By.NAME, "evidence").send_keys("bank: no refund under this call's key")
    shots.append(screenshot(driver, "settle-attempted-call", whole=False))
    form.find_element(By.CSS_SELECTOR, "button[value='not_executed']").click()
    wait.until(replaced(form))  # the answer's page, not the one the form was on
    notices = wait.until(lambda d: d.find_element(By.ID, "notices"))
    assert "settled as not executed now by ana" in notices.text, notices.text
    settlement = driver.find_element(By.ID, "settlement")
    assert "no refund under this call's key" in settlement.text
    assert driver.find_element(By.ID, "stage").text == "reconciled"
    shots.append(screenshot(driver, "settle-settled-call", whole=False))
    driver.find_element(By.ID, "request-again").click()
    wait.until(lambda d: said(d, "Requested again as t1.again1"))
    return shots


def said(driver: webdriver.Chrome, text: str) -> bool:
    """Whether the page's notices say ``text`` (False while the next page loads)."""
    try:
        return text in driver.find_element(By.ID, "notices").text
    except (StaleElementReferenceException, NoSuchElementException):
        return False


async def test_an_operator_settles_an_attempted_call_in_the_browser(
    make_store: Any, browser: webdriver.Chrome
) -> None:
    """The call ends RECONCILED_NOT_EXECUTED settled by the operator signed in, with the
    evidence's digest in its chain, and t1.again1 waits for its own approval."""
    store = await every_stage(make_store)
    async with serving(store) as base:
        shots = await asyncio.to_thread(settle, browser, base)
    record = await store.get(RUN, "t1")
    assert record is not None
    assert (record.state.error_code, record.state.settled_by) == (
        ErrorCode.RECONCILED_NOT_EXECUTED,
        "ana",
    )
    assert record.state.settlement_evidence_sha256 is not None
    again = await store.get(RUN, "t1.again1")
    assert again is not None and again.state.stage is Stage.AWAITING_APPROVAL
    for shot in shots:
        assert shot.stat().st_size > 10_000, shot
