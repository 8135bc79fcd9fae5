"""The operator console over a real socket: off without a token, its login, every page,
the failure detail, payloads only on request, and read-only to the last command and TTL."""

from __future__ import annotations

import itertools
import re
from typing import Any

import httpx
import pytest

from eventstore.store import Store
from machine.ids import invocation_id
from projections.console import CONSOLE_ROUTES, Console, OperatorAuth
from projections.console.auth import CLIENT_REFILL_S, LoginThrottle, Operators
from tests.helpers import commandstats
from tests.support.console_run import (
    DETAIL,
    FAILED_CALL,
    OPERATOR_TOKEN,
    OPERATOR_TOKENS,
    RUN,
    csrf_of,
    failed_invocation,
    populate,
    serving,
    session_cookie,
)

pytestmark = pytest.mark.backends("single", "cluster")

BEARER = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
# Every command that changes data or an expiry (the console may send none of them).
WRITES = {
    "set",
    "hset",
    "hsetnx",
    "hdel",
    "hincrby",
    "del",
    "unlink",
    "expire",
    "pexpire",
    "pexpireat",
    "expireat",
    "persist",
    "xadd",
    "xtrim",
    "xdel",
    "xack",
    "xgroup",
    "zadd",
    "zrem",
    "zremrangebyscore",
    "rpush",
    "lpush",
    "ltrim",
    "evalsha",
    "eval",
    "fcall",
    "getex",
    "touch",
    "restore",
    "rename",
    "copy",
    "flushdb",
    "flushall",
}


def sample_path(route: str) -> str:
    path = route.split(" ", 1)[1]
    return path.replace("<run id>", RUN).replace("<invocation id>", failed_invocation())


async def test_console_is_off_without_a_token(make_store: Any) -> None:
    """Without an operator token every console path is 404, whatever the credentials."""
    store: Store = make_store(shards=2)
    await populate(store)
    async with serving(store, console=False) as base, httpx.AsyncClient(base_url=base) as client:
        for route in CONSOLE_ROUTES:
            response = await client.get(sample_path(route), headers=BEARER)
            assert response.status_code == 404, route
            assert response.headers["cache-control"] == "no-store"


async def test_every_page_needs_the_token_and_challenges_for_a_bearer(make_store: Any) -> None:
    """Without a credential, or with a wrong one (a run's token too), a page is 401 with
    ``WWW-Authenticate: Bearer`` and the login form; the login page itself is open."""
    store: Store = make_store(shards=2)
    run_token = await populate(store)
    # Every route is tried with a wrong token: a clock that moves on by a refill between
    # two tries keeps the failed-login limit (tested on its own) out of this test's way.
    ticks = itertools.count(step=CLIENT_REFILL_S)
    throttle = LoginThrottle(clock=lambda: float(next(ticks)))
    console = Console(
        store, OperatorAuth(Operators.from_tokens(OPERATOR_TOKENS)), throttle=throttle
    )
    async with serving(store, app=console) as base, httpx.AsyncClient(base_url=base) as client:
        for route in CONSOLE_ROUTES:
            method, path = route.split(" ", 1)
            if path == "/console/login":
                continue
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"Authorization": f"Bearer {run_token}"},
            ):
                response = await client.request(method, sample_path(route), headers=headers)
                assert response.status_code == 401, route
                assert response.headers["www-authenticate"].startswith("Bearer"), route
                assert 'name="token"' in response.text
                assert response.headers["cache-control"] == "no-store"
        login = await client.get("/console/login")
        assert login.status_code == 200 and 'name="token"' in login.text


async def test_login_sets_a_strict_httponly_cookie_that_is_not_the_token(make_store: Any) -> None:
    """The form logs in with a session cookie (HttpOnly, SameSite=Strict, Path=/console/)
    that opens the pages; a wrong token is refused; logging out ends the session."""
    store: Store = make_store(shards=2)
    await populate(store)
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        wrong = await client.post("/console/login", data={"token": "nope", "next": "/console/"})
        assert wrong.status_code == 401 and "That token names no operator." in wrong.text
        assert "set-cookie" not in wrong.headers
        response = await client.post(
            "/console/login", data={"token": OPERATOR_TOKEN, "next": f"/console/runs/{RUN}"}
        )
        assert response.status_code == 303
        assert response.headers["location"] == f"/console/runs/{RUN}"
        cookie = response.headers["set-cookie"]
        assert re.search(r"(?i)httponly", cookie) and re.search(r"(?i)samesite=strict", cookie)
        assert "Path=/console/" in cookie
        name, value = session_cookie(response)
        client.cookies.clear()  # each request below names its own cookie
        assert OPERATOR_TOKEN not in value and value
        page = await client.get(f"/console/runs/{RUN}", headers={"Cookie": f"{name}={value}"})
        assert page.status_code == 200 and "<rect" in page.text
        # One hex digit of the MAC changed (never to itself: "00" was already the last two
        # digits of one MAC in 256, and the "forged" cookie was then the real one).
        forged_value = value[:-1] + ("1" if value.endswith("0") else "0")
        forged = await client.get("/console/", headers={"Cookie": f"{name}={forged_value}"})
        assert forged.status_code == 401
        out = await client.post(
            "/console/logout",
            headers={"Cookie": f"{name}={value}"},
            data={"csrf": csrf_of(page.text)},
        )
        assert out.status_code == 303
        again = await client.get("/console/", headers={"Cookie": f"{name}={value}"})
        assert again.status_code == 401
        away = await client.post(
            "/console/login", data={"token": OPERATOR_TOKEN, "next": "//evil.example/"}
        )
        assert away.headers["location"] == "/console/"


async def test_pages_show_runs_timeline_calls_and_failure_detail(make_store: Any) -> None:
    """Runs list the run with its counts and budget; the run page has one bar per call with
    a hover title; the failed call shows its failure detail, another shows none recorded;
    payloads only on their own page."""
    store: Store = make_store(shards=2)
    await populate(store)
    async with serving(store) as base, httpx.AsyncClient(base_url=base, headers=BEARER) as client:
        runs = await client.get("/console/")
        assert runs.status_code == 200 and f"/console/runs/{RUN}" in runs.text
        assert "4 / 10" in runs.text  # budget used / total
        run = await client.get(f"/console/runs/{RUN}")
        assert run.text.count('<rect class="bar"') == 4
        titles = re.findall(r"<title>([^<]*)</title>", run.text)
        assert any("c-failed: fetch" in t and "EXECUTION_FAILED" in t for t in titles)
        assert any("in flight" in t for t in titles)
        failed = await client.get(f"/console/runs/{RUN}/invocations/{failed_invocation()}")
        assert failed.status_code == 200
        assert DETAIL["type"] in failed.text and DETAIL["message"] in failed.text
        assert "ConnectionResetError: the search backend hung up" in failed.text
        assert "EXECUTION_FAILED" in failed.text and "Replay verdict" in failed.text
        # The detail is the one its Failed event names: the verdict stays intact.
        assert "PROBLEMS FOUND" not in failed.text and "<b>intact</b>" in failed.text
        assert "show harness-only payload" in failed.text
        ok = await client.get(f"/console/runs/{RUN}/invocations/{invocation_id(RUN, 'c1')}")
        assert "none recorded" in ok.text and "EVIDENCE_FOUND" in ok.text
        assert "<b>intact</b>" in ok.text and "Preflighted" in ok.text
        assert "canon.invocation-receipt.v1" in ok.text
        for page in (runs, run, failed, ok):
            # The request and raw response are harness-only; the agent result is in the
            # receipt, as the receipt API answers it, on the call's page only.
            assert "REQUEST-PAYLOAD-MARKER" not in page.text
            assert "RAW-PAYLOAD-MARKER" not in page.text
            assert page.headers["cache-control"] == "no-store"
        assert "RESULT-PAYLOAD-MARKER" not in runs.text + run.text + failed.text
        payloads = await client.get(
            f"/console/runs/{RUN}/invocations/{invocation_id(RUN, 'c1')}/payloads"
        )
        assert "REQUEST-PAYLOAD-MARKER" in payloads.text
        assert "RAW-PAYLOAD-MARKER" in payloads.text and "RESULT-PAYLOAD-MARKER" in payloads.text
        assert (await client.get("/console/?cursor=abc")).status_code == 400
        assert (await client.get(f"/console/runs/{RUN}?x=1")).status_code == 400
        assert (await client.get("/console/runs/run-nope")).status_code == 404
        assert (await client.post(f"/console/runs/{RUN}")).status_code == 405


async def test_browsing_every_page_writes_nothing_and_keeps_every_ttl(
    make_store: Any, redis: Any
) -> None:
    """INFO commandstats before and after browsing every page: no write command ran; the
    PTTL of the records and the run is unchanged (read as absolute expiry)."""
    store: Store = make_store(shards=2)
    await populate(store)
    keys = [store.keys.record(RUN, c) for c in ("c1", "c2", FAILED_CALL)] + [store.keys.run(RUN)]

    async def expiries() -> list[int]:
        return [int(await redis.pttl(key)) for key in keys]

    async with serving(store) as base, httpx.AsyncClient(base_url=base, headers=BEARER) as client:
        await client.get("/console/")  # scripts loaded, templates compiled
        before_ttl = await expiries()
        before = await commandstats(redis)
        paths = [
            "/console/",
            "/console/?status=errors&tool=fetch&q=run-",
            "/console/search?code=EXECUTION_FAILED",
            f"/console/runs/{RUN}",
            f"/console/runs/{RUN}?status=ERROR&tool=fetch",
            "/console/live.js",
        ]
        for call in ("c1", "c2", FAILED_CALL, "c-flight"):
            base_path = f"/console/runs/{RUN}/invocations/{invocation_id(RUN, call)}"
            paths += [base_path, base_path + "/payloads"]
        for path in paths:
            assert (await client.get(path)).status_code == 200, path
        after = await commandstats(redis)
        after_ttl = await expiries()
    ran = {name for name, calls in after.items() if calls != before.get(name, 0)}
    assert ran, "no command was counted: the test would not see a write"
    assert not ran & WRITES, sorted(ran & WRITES)
    for old, new in zip(before_ttl, after_ttl, strict=True):
        assert 0 < new <= old  # a refreshed or extended expiry would have grown
