"""Reconciling and settling at every door: ``canon reconcile`` with the harness's tools
(their hooks settle what they can; what is left is listed, exit 1), ``canon settle`` as the
operator the token names, the HTTP settlement route under an operator's token, and the
console's settle form as the operator signed in; a call settled as not executed may be
requested again as a new call that waits for its own approval."""

from __future__ import annotations

import asyncio
import json
import pathlib
import re
from datetime import timedelta
from typing import Any

import httpx
import pytest

from canon.cli import main
from eventstore import ToolBoundary
from eventstore.store import Store
from machine.codes import ErrorCode, Stage
from machine.ids import invocation_id
from tests.support.console_run import OPERATOR_TOKEN, csrf_of, serving
from tests.support.operators import credentials, logging_kept
from tests.support.reconcile_tools import BANK, TOOLS
from tests.support.stages import RUN, SHORT_LEASE, every_stage

pytestmark = pytest.mark.backends("single", "cluster")

BEARER = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
T1 = invocation_id(RUN, "t1")


async def canon(
    capsys: pytest.CaptureFixture[str], store: Store, redis_url: str, *argv: str
) -> tuple[int, str, str]:
    """Run ``canon`` in-process (a worker thread runs its own loop): exit, out, err."""
    capsys.readouterr()
    with logging_kept():
        code = await asyncio.to_thread(
            main,
            [*argv, "--redis-url", redis_url, "--namespace", store.keys.namespace, "--shards", "2"],
        )
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def as_ana(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line run as ana, wide enough for every column."""
    for name, value in credentials("ana").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("COLUMNS", "250")


async def stage_of(store: Store, call: str) -> Any:
    record = await store.get(RUN, call)
    assert record is not None
    return record.state


async def test_canon_reconcile_settles_with_the_harness_tools_and_lists_the_rest(
    make_store: Any,
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: pathlib.Path,
) -> None:
    """Without tools the abandoned call ends ABANDONED and the attempted one is left for an
    operator (exit 1, its canon settle line); with --tools the hook finds it did not run
    (exit 0); a --tools that cannot be loaded is one line, exit 2."""
    store = await every_stage(make_store)
    monkeypatch.setenv("COLUMNS", "250")
    bank = tmp_path / "bank"
    bank.write_text("")
    monkeypatch.setenv(BANK, str(bank))
    code, out, _ = await canon(capsys, store, redis_url, "reconcile", RUN, "--grace", "0")
    assert code == 1
    assert re.search(r"b1\s.*abandoned: ended ABANDONED\s.*ERROR ABANDONED", out), out
    assert re.search(r"t1\s.*left: needs an operator", out), out
    assert f"canon settle {RUN} t1 --executed|--not-executed --evidence TEXT" in out
    assert (await stage_of(store, "b1")).settled_by == "sweep"
    code, out, _ = await canon(
        capsys,
        store,
        redis_url,
        "reconcile",
        RUN,
        "--grace",
        "0",
        "--tools",
        "tests.support.reconcile_tools:TOOLS",
        "--json",
    )
    assert code == 0, out
    document = json.loads(out)
    assert [(c["tool_call_id"], c["outcome"]) for c in document["calls"]] == [
        ("t1", "not_executed")
    ]
    assert document["left"] == 0
    state = await stage_of(store, "t1")
    assert (state.error_code, state.settled_by) == (
        ErrorCode.RECONCILED_NOT_EXECUTED,
        "hook:refund",
    )
    for spec, said in (
        ("tests.support.nowhere:TOOLS", "cannot import tests.support.nowhere"),
        ("tests.support.reconcile_tools:NOTHING", "has no NOTHING"),
        ("tests.support.reconcile_tools:BANK", "not a mapping of tool names to ToolSpec"),
        ("no-colon", "write MODULE:NAME"),
    ):
        code, out, err = await canon(capsys, store, redis_url, "reconcile", "--tools", spec)
        assert code == 2 and said in err.splitlines()[-1] and "Traceback" not in err, err


async def test_canon_settle_records_the_operator_the_token_names(
    make_store: Any, redis_url: str, capsys: pytest.CaptureFixture[str], as_ana: None
) -> None:
    """settle --not-executed --request-again: the call ends RECONCILED_NOT_EXECUTED by ana
    and t1.again1 waits for its approval (exit 0); a second settlement says the first
    (exit 1); a call still running, one not in flight, a missing evidence or --by are
    refused, nothing written."""
    store = await every_stage(make_store)
    code, out, err = await canon(
        capsys,
        store,
        redis_url,
        "settle",
        RUN,
        "t1",
        "--not-executed",
        "--evidence",
        "bank: no refund under this key",
        "--request-again",
    )
    assert code == 0, err
    assert "t1: settled as not executed" in out and "by ana" in out
    assert "requested again as t1.again1, which waits for its own approval" in out
    state = await stage_of(store, "t1")
    assert (state.error_code, state.settled_by) == (ErrorCode.RECONCILED_NOT_EXECUTED, "ana")
    again = await stage_of(store, "t1.again1")
    assert (again.stage, again.retry_of, again.retried_by) == (
        Stage.AWAITING_APPROVAL,
        "t1",
        "ana",
    )
    code, out, err = await canon(
        capsys, store, redis_url, "settle", RUN, "t1", "--executed", "--evidence", "paid"
    )
    assert code == 1 and "already settled as not executed" in err.splitlines()[-1]
    for argv, said in (
        (("d1", "--executed", "--evidence", "x"), "still running"),
        (("r1", "--executed", "--evidence", "x"), "nothing to settle: the call is READY"),
    ):
        code, _, err = await canon(capsys, store, redis_url, "settle", RUN, *argv)
        assert code == 1 and said in err.splitlines()[-1], err
    for argv in (("b1", "--executed"), ("b1", "--executed", "--evidence", "x", "--by", "bo")):
        code, _, err = await canon(capsys, store, redis_url, "settle", RUN, *argv)
        assert code == 2, err
    assert (await stage_of(store, "b1")).stage is Stage.EXECUTING
    assert (await stage_of(store, "d1")).stage is Stage.EXECUTING


async def test_an_operator_settles_over_http_and_a_run_token_never_does(make_store: Any) -> None:
    """POST .../settlement under an operator's token settles as that operator (a body's by
    is ignored), a second answers the first (made_now false); a run's token is 403; a call
    still running or not in flight is 409, a bad body 400; nothing is written by those."""
    store = await every_stage(make_store)
    run_token = (await store.open_run("run-agent", deadline=timedelta(minutes=5))).access_token
    path = f"/v1/runs/{RUN}/invocations/{T1}/settlement"
    body = {"outcome": "not_executed", "evidence": "bank: none", "by": "mallory"}
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        refused = await client.post(
            path, json=body, headers={"Authorization": f"Bearer {run_token}"}
        )
        assert refused.status_code == 403 and refused.json()["error"] == "operator_token_required"
        for bad, code in (
            ({"outcome": "maybe", "evidence": "x"}, "invalid_outcome"),
            ({"outcome": "executed", "evidence": ""}, "invalid_evidence"),
            ({"outcome": "executed"}, "missing_field"),
            (
                {"outcome": "executed", "evidence": "x", "request_again": True},
                "invalid_request_again",
            ),
        ):
            answer = await client.post(path, json=bad, headers=BEARER)
            assert (answer.status_code, answer.json()["error"]) == (400, code)
        assert (await stage_of(store, "t1")).stage is Stage.EXECUTING
        done = await client.post(path, json={**body, "request_again": True}, headers=BEARER)
        assert done.status_code == 200, done.text
        document = done.json()
        assert document["schema_version"] == "canon.settlement.v1"
        assert (document["settled_as"], document["settled_by"], document["made_now"]) == (
            "not_executed",
            "ana",
            True,
        )
        assert document["requested_again"]["tool_call_id"] == "t1.again1"
        second = await client.post(
            path, json={"outcome": "executed", "evidence": "paid"}, headers=BEARER
        )
        assert second.json()["made_now"] is False and second.json()["settled_by"] == "ana"
        running = await client.post(
            f"/v1/runs/{RUN}/invocations/{invocation_id(RUN, 'd1')}/settlement",
            json={"outcome": "executed", "evidence": "x"},
            headers=BEARER,
        )
        assert (running.status_code, running.json()["error"]) == (409, "call_still_running")
        ended = await client.post(
            f"/v1/runs/{RUN}/invocations/{invocation_id(RUN, 'r1')}/settlement",
            json={"outcome": "executed", "evidence": "x"},
            headers=BEARER,
        )
        assert ended.status_code == 409 and ended.json()["stage"] == "READY"
    state = await stage_of(store, "t1")
    assert (state.settled_by, state.error_code) == ("ana", ErrorCode.RECONCILED_NOT_EXECUTED)


async def test_an_operator_settles_from_the_console(make_store: Any) -> None:
    """The attempted call's page has a settle form; a POST with the session's CSRF token
    settles it as the operator signed in and goes back to the page, which says so and
    offers to request it again; that button records t1.again1; a forged token is 403."""
    store = await every_stage(make_store)
    page_path = f"/console/runs/{RUN}/invocations/{T1}"
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        login = await client.post("/console/login", data={"token": OPERATOR_TOKEN})
        assert login.status_code == 303
        page = await client.get(page_path)
        assert 'id="settle"' in page.text and "may\nhave run" in page.text
        csrf = csrf_of(page.text)
        forged = await client.post(
            f"{page_path}/settlement",
            data={"csrf": "x" * 40, "outcome": "not_executed", "evidence": "none"},
        )
        assert forged.status_code == 403
        assert (await stage_of(store, "t1")).stage is Stage.EXECUTING
        posted = await client.post(
            f"{page_path}/settlement",
            data={"csrf": csrf, "outcome": "not_executed", "evidence": "bank: none"},
        )
        assert posted.status_code == 303
        after = await client.get(posted.headers["location"])
        assert "t1 (run run-st): settled as not executed now by ana." in after.text
        assert 'id="settlement"' in after.text and 'id="request-again"' in after.text
        assert re.search(r'id="stage"[^>]*>reconciled<', after.text)
        again = await client.post(
            f"{page_path}/settlement",
            data={"csrf": csrf, "outcome": "request_again"},
        )
        assert again.status_code == 303
        told = await client.get(again.headers["location"])
        assert "Requested again as t1.again1" in told.text
    assert (await stage_of(store, "t1.again1")).stage is Stage.AWAITING_APPROVAL


async def test_a_settlement_races_a_reconcile_and_one_wins(
    make_store: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    """An operator and a reconcile of the same attempted call at once: one settlement."""
    store = await every_stage(make_store)
    (tmp_path / "bank").write_text("")
    monkeypatch.setenv(BANK, str(tmp_path / "bank"))
    short: Store = make_store(shards=2, lease=SHORT_LEASE, namespace=store.keys.namespace)
    boundary = ToolBoundary(short, TOOLS)

    async def operator() -> Any:
        return await store.settle(RUN, "t1", executed=True, by="ana", evidence="paid")

    async def reconcile() -> Any:
        return await boundary.reconcile(RUN, grace=timedelta(0))

    settled, report = await asyncio.gather(operator(), reconcile())
    events = [type(e.event).__name__ for e in await store.events(RUN, "t1")]
    assert events.count("Settled") == 1
    hook = [c for c in report.calls if c.tool_call_id == "t1"]
    assert settled.made_now != bool(hook and hook[0].outcome == "not_executed")
