"""The console in a real headless browser (Debian's chromium through chromedriver): log in,
open a run and see its bars, open the failed call and read its failure detail, log out;
screenshots are written as test artifacts (``.artifacts/console/``, their paths printed).
"""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from eventstore.store import Store
from tests.support.browser import screenshot
from tests.support.console_run import DETAIL, FAILED_CALL, OPERATOR_TOKEN, RUN, populate, serving


def browse(driver: webdriver.Chrome, base: str) -> list[pathlib.Path]:
    """Everything a person does, in the browser's own thread of control."""
    wait = WebDriverWait(driver, 20)
    driver.get(f"{base}/console/")
    token = wait.until(lambda d: d.find_element(By.ID, "token"))  # the login form (401)
    token.send_keys(OPERATOR_TOKEN)
    driver.find_element(By.ID, "login").click()
    wait.until(lambda d: d.find_elements(By.ID, "runs"))
    (cookie,) = [c for c in driver.get_cookies() if c["name"].startswith("canon_console_")]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/console/" and not cookie["secure"]  # plain HTTP
    assert OPERATOR_TOKEN not in cookie["value"]
    shots = [screenshot(driver, "runs")]
    driver.find_element(By.LINK_TEXT, RUN).click()
    wait.until(lambda d: d.find_elements(By.ID, "timeline"))
    bars = driver.find_elements(By.CSS_SELECTOR, "svg#timeline rect.bar")
    assert len(bars) == 4
    assert all(float(bar.get_attribute("width") or 0) > 0 for bar in bars)
    assert bars[0].is_displayed()
    shots.append(screenshot(driver, "run"))
    driver.find_element(By.LINK_TEXT, FAILED_CALL).click()
    detail = wait.until(lambda d: d.find_element(By.ID, "failure-detail"))
    assert DETAIL["type"] in detail.text and DETAIL["message"] in detail.text
    assert "EXECUTION_FAILED" in driver.find_element(By.ID, "error-code").text
    assert "PAYLOAD-MARKER" not in driver.page_source
    shots.append(screenshot(driver, "failed-call"))
    driver.find_element(By.ID, "show-payloads").click()
    wait.until(lambda d: "REQUEST-PAYLOAD-MARKER" in d.page_source)
    # Logging out is a POST carrying the page's CSRF token: it ends the session.
    driver.find_element(By.CSS_SELECTOR, "header form button").click()
    wait.until(lambda d: d.find_elements(By.ID, "token"))
    assert not [c for c in driver.get_cookies() if c["name"].startswith("canon_console_")]
    driver.get(f"{base}/console/")
    wait.until(lambda d: d.find_elements(By.ID, "token"))  # logged out: the login form
    return shots


async def test_an_operator_finds_the_failed_call_and_why(
    make_store: Any, browser: webdriver.Chrome
) -> None:
    """Log in, open the run, see its bars, open the failed call, read its failure detail,
    log out with the page's button."""
    store: Store = make_store(shards=2)
    await populate(store)
    async with serving(store) as base:
        shots = await asyncio.to_thread(browse, browser, base)
    for shot in shots:
        assert shot.stat().st_size > 10_000, shot  # a rendered page, not a blank one
