"""The console in a real headless browser (Debian's chromium through chromedriver): log in,
open a run and see its bars, open the failed call and read its failure detail, log out;
screenshots are written as test artifacts (``.artifacts/console/``, their paths printed).

The browser is required, never skipped: without it the test fails naming the install
command (``scripts/test.sh`` installs it as it installs redis-server).
"""

from __future__ import annotations

import asyncio
import pathlib
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from eventstore.store import Store
from tests.support.console_run import DETAIL, FAILED_CALL, OPERATOR_TOKEN, RUN, populate, serving

CHROMIUM = pathlib.Path("/usr/bin/chromium")
CHROMEDRIVER = pathlib.Path("/usr/bin/chromedriver")
INSTALL = "apt-get install -y chromium chromium-driver"
ARTIFACTS = pathlib.Path(__file__).parents[2] / ".artifacts" / "console"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,1100",
)


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    """A headless chromium with a fresh profile, quit (and its profile removed) afterwards."""
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if missing:
        pytest.fail(f"the console browser test needs {', '.join(missing)}: run '{INSTALL}'")
    profile = tempfile.mkdtemp(prefix="canon-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)  # Debian's, never a downloaded one
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot(driver: webdriver.Chrome, name: str) -> pathlib.Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    # The whole page: as tall as its content.
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, max(int(height) + 40, 600))
    assert driver.save_screenshot(str(path)), name
    print(f"console screenshot: {path}")
    return path


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
