"""Malformed console forms: each is a 400 and one log line naming why, never a 500, and
neither the answer nor the log holds what was posted."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from structlog.testing import capture_logs

from eventstore.store import Store
from tests.support.console_run import OPERATOR_TOKEN, csrf_of, serving, session_cookie

FORM = "application/x-www-form-urlencoded"
# Every value posted holds this marker: the session log scan fails the run if a log has it.
MARK = "FORM-PAYLOAD-MARKER"

#: A login body and its content type that the console must refuse, by the reason it logs.
BAD_LOGINS = {
    "nine fields": (urlencode([(f"f{i}", MARK) for i in range(9)]), FORM, "too_many_fields"),
    "a thousand empty fields": ("&".join(["a="] * 1000), FORM, "too_many_fields"),
    "too large": (urlencode({"token": MARK * 300}), FORM, "too_large"),
    "percent-encoding that is not UTF-8": (f"token=%ff%fe{MARK}", FORM, "encoding"),
    "bytes that are not UTF-8": (f"token=\xff{MARK}".encode("latin-1"), FORM, "encoding"),
    "a field without '='": (f"token{MARK}", FORM, "malformed"),
    "missing token": (urlencode({"next": "/console/"}), FORM, "missing_field"),
    "repeated token": (f"token={MARK}&token={OPERATOR_TOKEN}", FORM, "repeated_field"),
    "unknown field": (urlencode({"token": OPERATOR_TOKEN, "other": MARK}), FORM, "unknown_field"),
    "json": (f'{{"token": "{MARK}"}}', "application/json", "content_type"),
    "text/plain": (f"token={MARK}", "text/plain", "content_type"),
    "multipart": (f"--b\r\n{MARK}\r\n--b--\r\n", "multipart/form-data; boundary=b", "content_type"),
    "latin-1 charset": (f"token={MARK}", f"{FORM}; charset=latin-1", "content_type"),
    "no content type": (f"token={MARK}", None, "content_type"),
}


def refusals(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] == "console_form_refused"]


@pytest.mark.parametrize(("body", "content_type", "reason"), BAD_LOGINS.values(), ids=BAD_LOGINS)
async def test_a_malformed_login_form_is_400_with_one_log_line(
    make_store: Any, body: str | bytes, content_type: str | None, reason: str
) -> None:
    """Too many fields, too large, bad encoding, missing, repeated or unknown fields, a wrong
    content type: 400, no cookie, one ``console_form_refused`` line naming the reason and
    nothing posted; no error logged."""
    store: Store = make_store()
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        headers = {"Content-Type": content_type} if content_type else {}
        with capture_logs() as logs:
            response = await client.post("/console/login", content=body, headers=headers)
        assert response.status_code == 400, response.text
        assert "set-cookie" not in response.headers
        assert MARK not in response.text and OPERATOR_TOKEN not in response.text
        assert [(entry["reason"], entry["log_level"]) for entry in refusals(logs)] == [
            (reason, "warning")
        ]
        assert not [entry for entry in logs if entry["log_level"] in ("error", "critical")]
        assert MARK not in repr(logs) and OPERATOR_TOKEN not in repr(logs)
        # The console still answers, and the real token still logs in.
        login = await client.post("/console/login", data={"token": OPERATOR_TOKEN})
        assert login.status_code == 303


async def test_a_megabyte_body_is_refused_unread(make_store: Any) -> None:
    """A megabyte posted to the login form is refused as too large (400), not buffered."""
    store: Store = make_store()
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        with capture_logs() as logs:
            response = await client.post(
                "/console/login",
                content=b"token=" + b"x" * 1_000_000,
                headers={"Content-Type": FORM},
            )
        assert response.status_code == 400
        assert [entry["reason"] for entry in refusals(logs)] == ["too_large"]


async def test_a_malformed_logout_form_is_400_and_ends_nothing(make_store: Any) -> None:
    """A logged-in operator's logout with a repeated or unknown field is 400 and the session
    stays open."""
    store: Store = make_store()
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        login = await client.post("/console/login", data={"token": OPERATOR_TOKEN})
        name, value = session_cookie(login)
        csrf = csrf_of((await client.get("/console/")).text)
        for body in (f"csrf={csrf}&csrf={csrf}", f"csrf={csrf}&x={MARK}", "csrf=%ff"):
            with capture_logs() as logs:
                out = await client.post(
                    "/console/logout", content=body, headers={"Content-Type": FORM}
                )
            assert out.status_code == 400, body
            assert len(refusals(logs)) == 1 and MARK not in repr(logs)
            assert (await client.get("/console/")).status_code == 200
        assert client.cookies.get(name) == value
