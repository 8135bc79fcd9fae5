"""A real headless browser for the console tests: Debian's chromium through its
chromedriver, a fresh profile per test, and screenshots kept as test artifacts.

The browser is required, never skipped: without it a test fails naming the install
command (``scripts/test.sh`` installs it as it installs redis-server).
"""

from __future__ import annotations

import pathlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webelement import WebElement

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


def screenshot(
    driver: webdriver.Chrome, name: str, *, whole: bool = True, keep_scroll: bool = False
) -> pathlib.Path:
    """Save the page as ``.artifacts/console/<name>.png``: the whole page (as tall as its
    content), or what a 1280x900 window shows of its top (with ``keep_scroll``, of where
    it is scrolled to, the window left as it is); print where it went."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    height = driver.execute_script("return document.documentElement.scrollHeight")
    if not keep_scroll:
        driver.set_window_size(1280, max(int(height) + 40, 600) if whole else 900)
    assert driver.save_screenshot(str(path)), name
    print(f"console screenshot: {path}")
    return path


def replaced(element: WebElement) -> Callable[[Any], bool]:
    """A wait condition: ``element`` has left the document (its page was replaced).

    Selenium's ``staleness_of``, plus chromium's other answer for a node of a page being
    replaced: while the new page loads, asking about the old node can fail with "Node
    with given id does not belong to the document" instead of a stale reference.
    """

    def left(_driver: Any) -> bool:
        try:
            element.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as exc:
            if "does not belong to the document" in (exc.msg or ""):
                return True
            raise
        return False

    return left
