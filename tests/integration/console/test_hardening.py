"""The console refuses a POST a browser says came from another origin (``Origin`` or
``Sec-Fetch-Site``) before it reads anything, sends a login or a decision back only to a
normalised page under ``/console/``, and forbids framing with ``X-Frame-Options: DENY``
beside the CSP's ``frame-ancestors 'none'``."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from structlog.testing import capture_logs

from eventstore.store import Store
from machine.codes import Stage
from projections.console.app import next_path
from tests.integration.console.test_decisions import RUN, call_page, logged_in, waiting
from tests.support.console_run import OPERATOR_TOKEN, populate, serving

pytestmark = pytest.mark.backends("single", "cluster")

#: What browsers send with a form posted from another site.
ELSEWHERE = [
    {"Origin": "https://evil.example"},
    {"Origin": "http://127.0.0.1:1"},  # another port of this host
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},
    {"Origin": "null", "Sec-Fetch-Site": "cross-site"},
]


def own_origin(base: str) -> list[dict[str, str]]:
    """What browsers send with the console's own forms: chromium (its Referrer-Policy
    no-referrer makes the Origin null), a browser without Sec-Fetch-Site, and one with."""
    return [
        {"Origin": "null", "Sec-Fetch-Site": "same-origin"},
        {"Origin": base},
        {"Origin": base, "Sec-Fetch-Site": "same-origin"},
    ]


async def test_a_decision_posted_from_another_origin_decides_nothing(make_store: Any) -> None:
    """With the session's cookie and CSRF token, a decision whose Origin or Sec-Fetch-Site
    names another origin is 403, logged as console_change_refused, and the call still
    waits; the same form from the console's own origin decides it."""
    store: Store = make_store(shards=2)
    await waiting(store, RUN, "pay-1")
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        csrf = await logged_in(client)
        form = {"csrf": csrf, "decision": "approve", "reason": "checked the invoice"}
        for headers in ELSEWHERE:
            with capture_logs() as logs:
                refused = await client.post(
                    f"{call_page(RUN, 'pay-1')}/approval", data=form, headers=headers
                )
            assert refused.status_code == 403, headers
            assert "console&#39;s own pages" in refused.text
            assert [log["reason"] for log in logs if log["event"] == "console_change_refused"]
            record = await store.reader.get(RUN, "pay-1")
            assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL
        own = own_origin(base)[0]
        decided = await client.post(f"{call_page(RUN, 'pay-1')}/approval", data=form, headers=own)
        assert decided.status_code == 303, decided.text
    record = await store.reader.get(RUN, "pay-1")
    assert record is not None and record.state.stage is Stage.APPROVED


async def test_a_login_or_logout_from_another_origin_is_refused(make_store: Any) -> None:
    """A cross-site login sets no cookie, a cross-site logout ends no session; the
    console's own forms, as each kind of browser sends them, log in; a script that sends
    neither header (a Bearer client, curl) is not refused for it."""
    store: Store = make_store()
    await populate(store)
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        for headers in ELSEWHERE:
            login = await client.post(
                "/console/login", data={"token": OPERATOR_TOKEN}, headers=headers
            )
            assert login.status_code == 403 and "set-cookie" not in login.headers
        csrf = await logged_in(client)
        for headers in ELSEWHERE:
            out = await client.post("/console/logout", data={"csrf": csrf}, headers=headers)
            assert out.status_code == 403
        assert (await client.get("/console/")).status_code == 200  # still logged in
        out = await client.post("/console/logout", data={"csrf": csrf})
        assert out.status_code == 303
        for headers in own_origin(base):
            login = await client.post(
                "/console/login", data={"token": OPERATOR_TOKEN}, headers=headers
            )
            assert login.status_code == 303 and "set-cookie" in login.headers, headers


@pytest.mark.parametrize(
    ("given", "goes_to"),
    [
        ("/console/../v1/approvals", "/console/"),
        ("/console/%2e%2e/v1/approvals", "/console/"),
        ("/console/runs/%2E%2E/%2e%2e/metrics", "/console/"),
        ("/console/./runs/../approvals", "/console/approvals"),
        ("/console/runs/run-1?status=ERROR&page=2", "/console/runs/run-1?status=ERROR&page=2"),
        ("/console/runs/run%2D1", "/console/runs/run-1"),
        ("//evil.example/console/", "/console/"),
        ("https://evil.example/console/", "/console/"),
        ("/console/\\evil", "/console/"),
        ("/console//evil.example", "/console/"),
        ("/console/runs/a#frag", "/console/"),
        ("/console", "/console/"),
        ("/consolex/", "/console/"),
        ("", "/console/"),
        (None, "/console/"),
    ],
)
def test_next_is_normalised_and_kept_under_the_console(given: str | None, goes_to: str) -> None:
    """Dot segments (also percent-encoded) are resolved as a browser would, and whatever
    leaves /console/ or names another host goes to the runs page."""
    assert next_path(given) == goes_to


async def test_a_decisions_next_is_normalised_before_it_is_followed(make_store: Any) -> None:
    """A decision posted with next=/console/../v1/approvals goes back to /console/, never
    to the HTTP API's route; a login with such a next likewise."""
    store: Store = make_store(shards=2)
    await waiting(store, RUN, "pay-2")
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        login = await client.post(
            "/console/login",
            data={"token": OPERATOR_TOKEN, "next": "/console/%2e%2e/v1/approvals"},
        )
        assert login.status_code == 303 and login.headers["location"] == "/console/"
        csrf = await logged_in(client)
        posted = await client.post(
            f"{call_page(RUN, 'pay-2')}/approval",
            data={
                "csrf": csrf,
                "decision": "deny",
                "reason": "duplicate",
                "next": "/console/../v1/approvals",
            },
        )
        assert posted.status_code == 303 and posted.headers["location"] == "/console/"


async def test_no_answer_may_be_framed(make_store: Any) -> None:
    """Every answer, a page, the login form, an error, a refusal, carries both
    X-Frame-Options: DENY and the CSP's frame-ancestors 'none'."""
    store: Store = make_store()
    await populate(store)
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        answers = [
            await client.get("/console/"),  # 401, the login form
            await client.post("/console/login", data={"token": "nope"}),
            await client.post("/console/logout", headers={"Origin": "https://evil.example"}),
        ]
        await logged_in(client)
        answers += [await client.get("/console/"), await client.get("/console/no-such-page")]
        for answer in answers:
            assert answer.headers["x-frame-options"] == "DENY", answer.status_code
            assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
        assert {answer.status_code for answer in answers} == {200, 401, 403, 404}
        assert urlsplit(base).hostname == "127.0.0.1"
