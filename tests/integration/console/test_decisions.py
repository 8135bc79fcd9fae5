"""Operators decide governed calls in the console: each waiting call shows its frozen
request (masked) and an Approve / Deny form with a required reason, on the approvals page
and on its own page; the approvals page also decides the calls ticked, all under one
decision id. Every decision is a POST with the session's CSRF token that goes back (303) to
the page, which says once what happened to each call; no GET ever decides."""

from __future__ import annotations

import html
from datetime import timedelta
from typing import Any

import httpx
from structlog.testing import capture_logs

from eventstore.decisions import new_approval_id
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.codes import ErrorCode, Stage
from machine.ids import invocation_id
from tests.support.console_run import OPERATOR_TOKEN, OPERATOR_TOKENS, csrf_of, serving

RUN = "run-desk"
OTHER_RUN = "run-desk-2"
SECRET = "sk-live-1a2b3c4d5e6f7a8b9c0d"
REQUEST = f'{{"amount":125,"api_key":"{SECRET}"}}'.encode()
FORM = "application/x-www-form-urlencoded"


def call_page(run_id: str, call: str) -> str:
    return f"/console/runs/{run_id}/invocations/{invocation_id(run_id, call)}"


async def waiting(store: Store, run_id: str, *calls: str) -> None:
    """Open the run (once) and record each call as a governed call awaiting a decision."""
    if await store.run_info(run_id) is None:
        await store.open_run(run_id, deadline=timedelta(minutes=10))
    for call in calls:
        await store.writer.request_approval(
            run_id,
            call,
            "refund",
            REQUEST,
            approval_id=new_approval_id(),
            approval_expires_at_ms=now_ms() + 600_000,
            requested_by="agent",
        )


async def logged_in(client: httpx.AsyncClient, operator: str = "ana") -> str:
    """Log in as ``operator`` (ana by default); the session's CSRF token."""
    login = await client.post("/console/login", data={"token": OPERATOR_TOKENS[operator]})
    assert login.status_code == 303
    return csrf_of((await client.get("/console/")).text)


async def record_of(store: Store, run_id: str, call: str) -> Any:
    record = await store.reader.get(run_id, call)
    assert record is not None
    return record


async def test_an_operator_approves_from_the_approvals_page(make_store: Any) -> None:
    """The page shows each waiting call's request masked and its form; approving goes back
    to the page (303), which says once that the call was approved now by the console's
    operator; the record holds that approver and the reason, and the call leaves the list."""
    store: Store = make_store(shards=2)
    await waiting(store, RUN, "pay-1", "pay-2")
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        csrf = await logged_in(client)
        page = await client.get("/console/approvals")
        assert page.status_code == 200
        assert SECRET not in page.text and "[Filtered]" in page.text
        assert page.text.count('name="decision" value="approve"') == 3  # two calls, the batch
        assert f"{call_page(RUN, 'pay-1')}/approval" in page.text
        with capture_logs() as logs:
            posted = await client.post(
                f"{call_page(RUN, 'pay-1')}/approval",
                data={
                    "csrf": csrf,
                    "decision": "approve",
                    "reason": "checked the invoice",
                    "next": "/console/approvals",
                },
            )
        assert posted.status_code == 303
        assert posted.headers["location"] == "/console/approvals"
        back = await client.get("/console/approvals")
        told = html.unescape(back.text)
        assert f"pay-1 (run {RUN}): approved now by ana." in told
        assert f"{call_page(RUN, 'pay-1')}/approval" not in back.text  # no longer waiting
        assert f"{call_page(RUN, 'pay-2')}/approval" in back.text
        assert 'id="notices"' not in (await client.get("/console/approvals")).text  # once
    record = await record_of(store, RUN, "pay-1")
    assert record.state.stage is Stage.APPROVED
    assert (record.state.decided_by, record.state.decision_reason) == (
        "ana",
        "checked the invoice",
    )
    assert [(entry["event"], entry.get("door")) for entry in logs] == [
        ("approval_decided", "console")
    ]
    assert "checked the invoice" not in repr(logs) and SECRET not in repr(logs)


async def test_a_call_page_decides_its_call_and_a_second_decision_is_answered(
    make_store: Any,
) -> None:
    """A waiting call's page shows its masked request and the form; denying goes back to
    that page saying so; approving it afterwards changes nothing and says it was already
    denied, and by whom."""
    store: Store = make_store(shards=2)
    await waiting(store, RUN, "pay-1")
    page_path = call_page(RUN, "pay-1")
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        csrf = await logged_in(client)
        page = await client.get(page_path)
        assert page.status_code == 200 and 'id="decide"' in page.text
        assert SECRET not in page.text and "[Filtered]" in page.text
        denied = await client.post(
            f"{page_path}/approval",
            data={"csrf": csrf, "decision": "deny", "reason": "duplicate payment"},
        )
        assert denied.status_code == 303 and denied.headers["location"] == page_path
        after = html.unescape((await client.get(page_path)).text)
        assert f"pay-1 (run {RUN}): denied now by ana." in after
        assert 'id="decide"' not in after  # the call no longer waits
        again = await client.post(
            f"{page_path}/approval",
            data={"csrf": csrf, "decision": "approve", "reason": "changed my mind"},
        )
        assert again.status_code == 303
        told = html.unescape((await client.get(page_path)).text)
        assert "not approved here: it was already denied by ana." in told
    record = await record_of(store, RUN, "pay-1")
    assert record.state.error_code is ErrorCode.APPROVAL_DENIED
    assert record.state.decision_reason == "duplicate payment"


async def test_a_decision_without_the_sessions_csrf_token_is_refused_and_logged(
    make_store: Any,
) -> None:
    """A forged or missing CSRF token, or the operator's Bearer token without a login
    session, is 403 with one console_change_refused line; nothing is decided."""
    store: Store = make_store(shards=2)
    await waiting(store, RUN, "pay-1")
    one = f"{call_page(RUN, 'pay-1')}/approval"
    call_value = f"{RUN}/{invocation_id(RUN, 'pay-1')}"
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        await logged_in(client)
        with capture_logs() as logs:
            forged = await client.post(
                one, data={"csrf": "forged", "decision": "approve", "reason": "r"}
            )
            missing = await client.post(one, data={"decision": "approve", "reason": "r"})
            batch = await client.post(
                "/console/approvals",
                data={"csrf": "forged", "decision": "approve", "reason": "r", "call": call_value},
            )
        client.cookies.clear()
        bearer = await client.post(
            one,
            data={"decision": "approve", "reason": "r"},
            headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
        )
    for answer in (forged, missing, batch, bearer):
        assert answer.status_code == 403
    refused = [entry for entry in logs if entry["event"] == "console_change_refused"]
    assert [(entry["reason"], entry["route"]) for entry in refused] == [
        ("csrf", "approval"),
        ("csrf", "approval"),
        ("csrf", "approvals"),
    ]
    assert not [entry for entry in logs if entry["event"] == "approval_decided"]
    assert (await record_of(store, RUN, "pay-1")).state.stage is Stage.AWAITING_APPROVAL


async def test_a_batch_decides_exactly_the_ticked_calls_under_one_decision_id(
    make_store: Any,
) -> None:
    """The calls ticked, across two runs, are denied under one decision id, as made by the
    operator signed in; an already approved one is left as it was; an unticked one still
    waits; the page says, per call, what happened."""
    store: Store = make_store(shards=2)
    await waiting(store, RUN, "pay-1", "pay-2", "pay-3", "left-alone")
    await waiting(store, OTHER_RUN, "pay-9")
    ticked = [(RUN, "pay-1"), (OTHER_RUN, "pay-9"), (RUN, "pay-3"), (RUN, "pay-2")]
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        csrf = await logged_in(client, "bo")
        assert "signed in as <b>bo</b>" in (await client.get("/console/approvals")).text
        await client.post(
            f"{call_page(RUN, 'pay-3')}/approval",
            data={"csrf": csrf, "decision": "approve", "reason": "urgent"},
        )
        page = await client.get("/console/approvals")
        assert 'form="batch"' in page.text and 'id="batch"' in page.text
        fields = {
            "csrf": csrf,
            "decision": "deny",
            "reason": "a duplicate batch",
            "call": [f"{run}/{invocation_id(run, call)}" for run, call in ticked],
        }
        posted = await client.post("/console/approvals", data=fields)
        assert posted.status_code == 303
        assert posted.headers["location"] == "/console/approvals"
        told = html.unescape((await client.get("/console/approvals")).text)
    assert f"pay-1 (run {RUN}): denied now by bo." in told
    assert f"pay-9 (run {OTHER_RUN}): denied now by bo." in told
    assert f"pay-3 (run {RUN}): not denied here: it was already approved by bo." in told
    denied = [await record_of(store, run, call) for run, call in ticked if call != "pay-3"]
    assert {record.state.error_code for record in denied} == {ErrorCode.APPROVAL_DENIED}
    assert len({record.state.decision_id for record in denied}) == 1
    assert {record.state.decided_by for record in denied} == {"bo"}
    assert (await record_of(store, RUN, "pay-3")).state.stage is Stage.APPROVED
    assert (await record_of(store, RUN, "left-alone")).state.stage is Stage.AWAITING_APPROVAL


async def test_a_batch_without_calls_or_reason_or_with_a_forged_call_decides_nothing(
    make_store: Any,
) -> None:
    """Nothing ticked, or a blank reason: back to the page saying nothing was decided; a
    call value the page never writes is 400 console_form_refused."""
    store: Store = make_store(shards=2)
    await waiting(store, RUN, "pay-1")
    call_value = f"{RUN}/{invocation_id(RUN, 'pay-1')}"
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        csrf = await logged_in(client)
        nothing = await client.post(
            "/console/approvals", data={"csrf": csrf, "decision": "approve", "reason": "r"}
        )
        assert nothing.status_code == 303
        assert "nothing was decided" in (await client.get("/console/approvals")).text
        blank = await client.post(
            "/console/approvals",
            data={"csrf": csrf, "decision": "approve", "reason": "  ", "call": call_value},
        )
        assert blank.status_code == 303
        assert "needs a reason" in (await client.get("/console/approvals")).text
        with capture_logs() as logs:
            for value in ("bad:run/" + "a" * 64, f"{RUN}/not-hex", call_value):
                content = f"csrf={csrf}&decision=approve&reason=r&call={call_value}&call={value}"
                forged = await client.post(
                    "/console/approvals", content=content, headers={"Content-Type": FORM}
                )
                assert forged.status_code == 400, value
            other = await client.post(
                f"{call_page(RUN, 'pay-1')}/approval",
                data={"csrf": csrf, "decision": "yes", "reason": "r"},
            )
            assert other.status_code == 400
        reasons = [entry["reason"] for entry in logs if entry["event"] == "console_form_refused"]
        assert reasons == ["malformed", "malformed", "malformed", "missing_field"]
    assert (await record_of(store, RUN, "pay-1")).state.stage is Stage.AWAITING_APPROVAL


async def test_reading_the_pages_never_decides(make_store: Any) -> None:
    """The approvals page, the call's page, its payloads page and a GET of the decision
    route (405) leave the waiting call's record and journal exactly as they were."""
    store: Store = make_store(shards=2)
    await waiting(store, RUN, "pay-1")
    before = await store.reader.fields(RUN, "pay-1")
    events = len(await store.reader.events(RUN, "pay-1"))
    page_path = call_page(RUN, "pay-1")
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        await logged_in(client)
        for path in ("/console/approvals", page_path, f"{page_path}/payloads"):
            assert (await client.get(path)).status_code == 200, path
        route = await client.get(f"{page_path}/approval")
        assert route.status_code == 405 and route.headers["allow"] == "POST"
    assert await store.reader.fields(RUN, "pay-1") == before
    assert len(await store.reader.events(RUN, "pay-1")) == events
