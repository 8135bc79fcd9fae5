"""The console's login session over a real socket: a cookie bound to the console's path and
to this instance, ``Secure`` over HTTPS, a logout that needs the session's CSRF token, and
failed logins limited per client address and overall."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from eventstore.store import Store
from projections.console import Console, OperatorAuth
from projections.console.auth import CLIENT_BURST, OVERALL_BURST, LoginThrottle
from tests.support.console_run import (
    OPERATOR_TOKEN,
    RUN,
    csrf_of,
    populate,
    serving,
    session_cookie,
)

#: Wrong, but long enough to be a token: every one is a guess the console must count.
WRONG = "not-the-operator-token-0000"


def forwarded(address: str, proto: str = "http") -> dict[str, str]:
    """Headers a TLS-terminating proxy on loopback (trusted by uvicorn) adds."""
    return {"X-Forwarded-For": address, "X-Forwarded-Proto": proto}


async def log_in(client: httpx.AsyncClient, **headers: str) -> httpx.Response:
    return await client.post("/console/login", data={"token": OPERATOR_TOKEN}, headers=headers)


async def test_the_cookie_is_bound_to_the_console_path_and_to_its_instance(
    make_store: Any,
) -> None:
    """Path=/console/ (a browser does not send it to the API's paths), a name of this
    instance (two consoles on one host, whose cookies a browser sends to both ports, never
    read each other's), and a lifetime no longer than the session's."""
    store: Store = make_store()
    await populate(store)
    async with (
        serving(store) as first,
        serving(store) as second,
        httpx.AsyncClient(base_url=first) as one,
        httpx.AsyncClient(base_url=second) as two,
    ):
        login_one, login_two = await log_in(one), await log_in(two)
        (name_one, value_one), (name_two, value_two) = (
            session_cookie(login_one),
            session_cookie(login_two),
        )
        assert name_one != name_two
        for login in (login_one, login_two):
            cookie = login.headers["set-cookie"]
            assert re.search(r"(?i)path=/console/(;|$)", cookie), cookie
            assert re.search(r"(?i)max-age=\d+", cookie), cookie
        # The jar (as a browser's) holds the cookie for /console/ paths only.
        api = await one.get("/v1/invocations/inspection-capabilities")
        assert "cookie" not in api.request.headers
        assert "cookie" in (await one.get("/console/")).request.headers
        # Cookies ignore ports: a browser sends both cookies to both consoles.
        both = f"{name_one}={value_one}; {name_two}={value_two}"
        for client in (one, two):
            client.cookies.clear()
            assert (await client.get("/console/", headers={"Cookie": both})).status_code == 200
        # Each console reads only its own: the other's session, even under its name, fails.
        assert (
            await two.get("/console/", headers={"Cookie": f"{name_one}={value_one}"})
        ).status_code == 401
        assert (
            await two.get("/console/", headers={"Cookie": f"{name_two}={value_one}"})
        ).status_code == 401


async def test_the_cookie_is_secure_over_https_or_when_told(make_store: Any) -> None:
    """Plain HTTP: no ``Secure``; HTTPS as a trusted proxy reports it (X-Forwarded-Proto
    from loopback, which uvicorn honours): ``Secure``; a console told ``secure_cookie``
    marks it always. HttpOnly and SameSite=Strict every time, on logout's deletion too."""
    store: Store = make_store()
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        plain = (await log_in(client)).headers["set-cookie"]
        assert not re.search(r"(?i);\s*secure", plain)
        client.cookies.clear()
        https = await log_in(client, **forwarded("203.0.113.9", "https"))
        cookie = https.headers["set-cookie"]
        assert re.search(r"(?i);\s*secure", cookie), cookie
        assert re.search(r"(?i)httponly", cookie) and re.search(r"(?i)samesite=strict", cookie)
        name, value = session_cookie(https)
        page = await client.get(
            "/console/", headers={"Cookie": f"{name}={value}", **forwarded("203.0.113.9", "https")}
        )
        out = await client.post(
            "/console/logout",
            data={"csrf": csrf_of(page.text)},
            headers={"Cookie": f"{name}={value}", **forwarded("203.0.113.9", "https")},
        )
        assert out.status_code == 303
        deletion = out.headers["set-cookie"]
        assert deletion.startswith(f"{name}=") and re.search(r"(?i);\s*secure", deletion)
        assert re.search(r"(?i)path=/console/(;|$)", deletion)
    always = Console(store, OperatorAuth(OPERATOR_TOKEN), secure_cookie=True)
    async with serving(store, app=always) as base, httpx.AsyncClient(base_url=base) as client:
        cookie = (await log_in(client)).headers["set-cookie"]
        assert re.search(r"(?i);\s*secure", cookie), cookie


async def test_logout_needs_the_csrf_token_of_its_session(make_store: Any) -> None:
    """A logout without the token, with a wrong one, with another session's, or from a
    bearer without a session is 403 and ends nothing; GET is 405; the page's own token
    logs out."""
    store: Store = make_store()
    await populate(store)
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        name, value = session_cookie(await log_in(client))
        other = session_cookie(await log_in(client))[1]
        client.cookies.clear()
        mine = {"Cookie": f"{name}={value}"}
        page = await client.get(f"/console/runs/{RUN}", headers=mine)
        csrf = csrf_of(page.text)
        other_csrf = csrf_of(
            (await client.get("/console/", headers={"Cookie": f"{name}={other}"})).text
        )
        assert csrf != other_csrf and csrf not in value and value not in csrf
        cross_site = {**mine, "Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
        for headers, data in (
            (mine, None),
            (mine, {"csrf": ""}),
            (mine, {"csrf": csrf[:-1] + ("A" if csrf[-1] != "A" else "B")}),
            (mine, {"csrf": other_csrf}),
            (cross_site, None),
            ({"Authorization": f"Bearer {OPERATOR_TOKEN}"}, {"csrf": csrf}),
        ):
            refused = await client.post("/console/logout", headers=headers, data=data)
            assert refused.status_code == 403, (headers, data)
            assert "set-cookie" not in refused.headers
            assert (await client.get("/console/", headers=mine)).status_code == 200
        assert (await client.get("/console/logout", headers=mine)).status_code == 405
        assert (await client.get("/console/", headers=mine)).status_code == 200
        out = await client.post("/console/logout", headers=mine, data={"csrf": csrf})
        assert out.status_code == 303 and out.headers["location"] == "/console/login"
        assert (await client.get("/console/", headers=mine)).status_code == 401
        # The other session was not touched.
        assert (
            await client.get("/console/", headers={"Cookie": f"{name}={other}"})
        ).status_code == 200


def retry_after(response: httpx.Response) -> int:
    assert response.status_code == 429, response.status_code
    seconds = int(response.headers["retry-after"])
    assert seconds >= 1 and f"{seconds} s" in response.text
    return seconds


def held_clock_console(store: Store) -> Console:
    """A console whose login throttle's clock stands still: no allowance comes back while
    the test runs, however slowly a busy machine runs it."""
    return Console(
        store, OperatorAuth(OPERATOR_TOKEN), throttle=LoginThrottle(clock=lambda: 1_000.0)
    )


async def test_failed_logins_are_limited_per_client_address(make_store: Any) -> None:
    """Past a burst of wrong tokens from one address its logins (form or bearer, right token
    or not) are 429 with Retry-After; another address, and a session already open, are
    not affected; successful logins never count."""
    store: Store = make_store()
    app = held_clock_console(store)
    async with serving(store, app=app) as base, httpx.AsyncClient(base_url=base) as client:
        attacker, operator = forwarded("198.51.100.7"), forwarded("198.51.100.8")
        for _ in range(3 * CLIENT_BURST):  # successes never use up the allowance
            assert (await log_in(client, **attacker)).status_code == 303
        session = "=".join(session_cookie(await log_in(client, **attacker)))
        client.cookies.clear()
        for _ in range(CLIENT_BURST):
            wrong = await client.post("/console/login", data={"token": WRONG}, headers=attacker)
            assert wrong.status_code == 401
        retry_after(await client.post("/console/login", data={"token": WRONG}, headers=attacker))
        retry_after(await log_in(client, **attacker))  # not even checked while limited
        bearer = await client.get(
            "/console/", headers={**attacker, "Authorization": f"Bearer {OPERATOR_TOKEN}"}
        )
        retry_after(bearer)
        assert (await log_in(client, **operator)).status_code == 303
        client.cookies.clear()
        opened = await client.get("/console/", headers={**attacker, "Cookie": session})
        assert opened.status_code == 200


async def test_failed_logins_are_limited_overall(make_store: Any) -> None:
    """Wrong tokens spread over many addresses empty the overall allowance: a fresh
    address is then 429 too, while an open session still reads."""
    store: Store = make_store()
    app = held_clock_console(store)
    async with serving(store, app=app) as base, httpx.AsyncClient(base_url=base) as client:
        session = session_cookie(await log_in(client))
        client.cookies.clear()
        for index in range(OVERALL_BURST):
            address = forwarded(f"10.{index // 250}.{index % 250}.1")
            wrong = await client.post("/console/login", data={"token": WRONG}, headers=address)
            assert wrong.status_code == 401, index
        retry_after(await log_in(client, **forwarded("192.0.2.200")))
        opened = await client.get("/console/", headers={"Cookie": "=".join(session)})
        assert opened.status_code == 200


@pytest.mark.parametrize("short", ["x", "too-short-token"])
async def test_a_value_that_cannot_be_the_token_costs_no_allowance(
    make_store: Any, short: str
) -> None:
    """A bearer or form value under the token's minimum length cannot be a guess: 401, and
    never counted (a browser without credentials is never locked out by its own noise)."""
    store: Store = make_store()
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        for _ in range(CLIENT_BURST + 1):
            response = await client.get("/console/", headers={"Authorization": f"Bearer {short}"})
            assert response.status_code == 401
        assert (await log_in(client)).status_code == 303
