"""Deciding governed calls in a real headless browser (Debian's chromium): the checkboxes
of the approvals table belong to the batch form below it (``form="batch"``), so ticking two
calls and pressing *Deny selected* decides exactly those two; a row's own form decides its
call. Screenshots are written as test artifacts (``.artifacts/console/``)."""

from __future__ import annotations

import asyncio
import pathlib
from datetime import timedelta
from typing import Any

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from eventstore.decisions import new_approval_id
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.codes import ErrorCode, Stage
from machine.ids import invocation_id
from tests.support.browser import replaced, screenshot
from tests.support.console_run import OPERATOR_TOKEN, serving

RUN = "run-browser-desk"
CALLS = ("pay-1", "pay-2", "pay-3")


def decide(driver: webdriver.Chrome, base: str) -> list[pathlib.Path]:
    """Log in, tick pay-1 and pay-3, deny them together, then approve pay-2 from its row."""
    wait = WebDriverWait(driver, 20)
    driver.get(f"{base}/console/approvals")
    wait.until(lambda d: d.find_element(By.ID, "token")).send_keys(OPERATOR_TOKEN)
    driver.find_element(By.ID, "login").click()
    wait.until(lambda d: d.find_elements(By.ID, "waiting"))
    shots = [screenshot(driver, "approvals")]
    for call in ("pay-1", "pay-3"):
        driver.find_element(By.CSS_SELECTOR, f"input[aria-label='select {call}']").click()
    batch = driver.find_element(By.ID, "batch")
    batch.find_element(By.NAME, "reason").send_keys("duplicates of one refund")
    batch.find_element(By.CSS_SELECTOR, "button[value='deny']").click()
    wait.until(replaced(batch))  # the answer's page, not the one the form was on
    notices = wait.until(lambda d: d.find_element(By.ID, "notices"))
    assert notices.text.count("denied now by ana") == 2, notices.text
    row = driver.find_element(By.ID, f"call-{invocation_id(RUN, 'pay-2')}")
    row.find_element(By.NAME, "reason").send_keys("the one to pay")
    row.find_element(By.CSS_SELECTOR, "button[value='approve']").click()
    wait.until(replaced(row))  # the page above has notices too: wait for the next one
    wait.until(lambda d: "pay-2 (run" in d.find_element(By.ID, "notices").text)
    assert "approved now" in driver.find_element(By.ID, "notices").text
    assert driver.find_elements(By.ID, "none-waiting")
    shots.append(screenshot(driver, "approvals-decided"))
    return shots


async def test_an_operator_decides_a_batch_and_a_row_in_the_browser(
    make_store: Any, browser: webdriver.Chrome
) -> None:
    """The two calls ticked are denied under one decision id, the third approved from its
    row; the page then has nothing waiting."""
    store: Store = make_store(shards=2)
    await store.open_run(RUN, deadline=timedelta(minutes=10))
    for call in CALLS:
        await store.writer.request_approval(
            RUN,
            call,
            "refund",
            b'{"amount":5}',
            approval_id=new_approval_id(),
            approval_expires_at_ms=now_ms() + 600_000,
            requested_by="agent",
        )
    async with serving(store) as base:
        shots = await asyncio.to_thread(decide, browser, base)
    records = {call: await store.reader.get(RUN, call) for call in CALLS}
    denied = [records["pay-1"], records["pay-3"]]
    assert all(r is not None and r.state.error_code is ErrorCode.APPROVAL_DENIED for r in denied)
    assert len({r.state.decision_id for r in denied if r is not None}) == 1
    approved = records["pay-2"]
    assert approved is not None and approved.state.stage is Stage.APPROVED
    for shot in shots:
        assert shot.stat().st_size > 10_000, shot
