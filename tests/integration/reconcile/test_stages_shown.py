"""Every door that shows a call's status shows where it stands beside it: waiting for
approval, approved and not dispatched, dispatching, attempted or abandoned by a process that
died, ready, error, reconciled; a paused run is marked with who, why and since when; pausing
a closed or unknown run is refused and pausing a paused run says it already is."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import timedelta
from typing import Any

import httpx
import pytest

from canon.cli import main
from eventstore.store import Store
from machine.ids import invocation_id
from tests.support.console_run import OPERATOR_TOKEN, serving
from tests.support.operators import credentials, logging_kept
from tests.support.stages import PAUSED, RUN, STAGES, every_stage

pytestmark = pytest.mark.backends("single", "cluster")

BEARER = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


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


async def shown(
    capsys: pytest.CaptureFixture[str], store: Store, redis_url: str, *argv: str
) -> str:
    """What ``canon`` prints on standard output, its exit code 0."""
    code, out, err = await canon(capsys, store, redis_url, *argv)
    assert code == 0, err
    return out


@pytest.fixture
def operator_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line run as ana, wide enough for every column."""
    for name, value in credentials("ana").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("COLUMNS", "250")


async def test_the_command_line_shows_each_calls_stage_and_the_pause(
    make_store: Any, redis_url: str, capsys: pytest.CaptureFixture[str], operator_env: None
) -> None:
    """replay (its table, its header, --json), runs (waiting, in flight, paused by whom,
    since when, why; --json), status (records by stage, the paused run) and approvals (the
    waiting calls' stage, the pause) each say where every call stands."""
    store = await every_stage(make_store)
    out = await shown(capsys, store, redis_url, "replay", RUN)
    rows = {line.split()[1]: line for line in out.splitlines() if re.match(r"\s*\d{4}-", line)}
    for call, stage in STAGES.items():
        assert stage in rows[call].split(), (call, rows[call])
    out = await shown(capsys, store, redis_url, "replay", RUN, "s1")
    assert "stage reconciled" in out and "settled by ana" in out
    out = await shown(capsys, store, redis_url, "replay", RUN, "--json")
    phases = {item["tool_call_id"]: item["phase"] for item in json.loads(out)["invocations"]}
    assert phases == STAGES

    out = await shown(capsys, store, redis_url, "runs")
    line = next(line for line in out.splitlines() if line.lstrip("│ ").startswith(RUN))
    # READY, ERROR, waiting (w1, a1), in flight (d1, t1, b1), refused
    assert re.search(r"│\s+1\s+│\s+2\s+│\s+2\s+│\s+3\s+│\s+0\s+│", line), line
    assert "active · paused" in out
    assert re.search(rf"paused: {PAUSED} by ana since \S+Z: incident 42", out), out
    out = await shown(capsys, store, redis_url, "runs", "--json")
    runs = {run["run_id"]: run for run in json.loads(out)["runs"]}
    assert (runs[RUN]["awaiting_approval"], runs[RUN]["approved"], runs[RUN]["in_flight"]) == (
        1,
        1,
        3,
    )
    assert runs[PAUSED]["pause"]["by"] == "ana" and runs[RUN]["pause"] is None

    if store.cluster is None:  # canon status reads one server (see docs/cluster.md)
        out = await shown(capsys, store, redis_url, "status", "--json")
        document = json.loads(out)
        assert document["records_by_stage"] == dict.fromkeys(sorted(STAGES.values()), 1)
        assert [paused["run_id"] for paused in document["paused_runs"]] == [PAUSED]
        out = await shown(capsys, store, redis_url, "status")
        assert "records by stage" in out and "attempted" in out
        assert re.search(rf"paused: run {PAUSED} by ana since \S+Z: incident 42", out)

    out = await shown(capsys, store, redis_url, "approvals", RUN)
    assert re.search(r"w1\s+refund\s+awaiting approval: for a decision", out), out
    assert re.search(r"a1\s+refund\s+approved, for its resume: not dispatched yet", out), out
    out = await shown(capsys, store, redis_url, "approvals", RUN, "--json")
    assert {row["tool_call_id"]: row["phase"] for row in json.loads(out)["waiting"]} == {
        "w1": "awaiting_approval",
        "a1": "approved",
    }
    out = await shown(capsys, store, redis_url, "approvals", PAUSED)
    assert re.search(r"the run is paused by ana since \S+Z: incident 42", out), out


async def test_pausing_says_what_the_run_is(
    make_store: Any, redis_url: str, capsys: pytest.CaptureFixture[str], operator_env: None
) -> None:
    """Pausing a paused run says it already is, by whom, since when and why, and changes
    nothing; a closed or unknown run is refused; each exits 1 with one line."""
    store = await every_stage(make_store)
    before = await store.run_info(PAUSED)
    code, out, err = await canon(capsys, store, redis_url, "pause", PAUSED, "--reason", "again")
    assert code == 1 and out == ""
    said = err.splitlines()[-1]  # after the durability warning of this test server
    pattern = rf"canon: error: run {PAUSED} is already paused by ana since \S+Z: incident 42"
    assert re.fullmatch(pattern, said), said
    assert await store.run_info(PAUSED) == before
    await store.close_run(RUN)
    code, _, err = await canon(capsys, store, redis_url, "pause", RUN, "--reason", "x")
    assert code == 1 and "is closed" in err.splitlines()[-1]
    code, _, err = await canon(capsys, store, redis_url, "pause", "run-nope", "--reason", "x")
    assert code == 1 and "no run run-nope" in err
    code, _, err = await canon(capsys, store, redis_url, "unpause", RUN, "--reason", "x")
    assert code == 1 and "is not paused" in err
    code, out, _ = await canon(capsys, store, redis_url, "unpause", PAUSED, "--reason", "over")
    assert code == 0 and f"{PAUSED}: unpaused by ana" in out


async def test_the_api_and_the_console_show_each_calls_stage_and_the_pause(
    make_store: Any,
) -> None:
    """The run's invocations over HTTP carry each call's stage; the console's runs list
    counts waiting and in flight and marks the paused run (who, since when, why), filters
    by awaiting approval, attempted and paused; the run page has a stage column, a stage
    filter and the pause banner; a call's page says its stage (an approved call: approved)."""
    store = await every_stage(make_store)
    token = (await store.open_run("run-api", deadline=timedelta(minutes=5))).access_token
    async with serving(store) as base, httpx.AsyncClient(base_url=base, headers=BEARER) as client:
        runs = (await client.get("/console/")).text
        row = runs[runs.index(f">{RUN}</a>") :].split("</tr>")[0]
        assert re.findall(r'<td class="n">(?:<a[^>]*>)?(\d+)', row)[:5] == ["1", "2", "2", "3", "0"]
        paused_row = runs[runs.index(f">{PAUSED}</a>") :].split("</tr>")[0]
        assert 'class="paused"' in paused_row and "by ana since" in paused_row
        assert "incident 42" in paused_row
        for status, shown in (
            ("awaiting_approval", {RUN}),
            ("attempted", {RUN}),
            ("paused", {PAUSED}),
        ):
            page = (await client.get("/console/", params={"status": status})).text
            found = set(re.findall(r'<a href="/console/runs/([^"?]+)">', page))
            assert found == shown, (status, found)
        run_page = (await client.get(f"/console/runs/{RUN}")).text
        table = run_page.split('<table id="calls">')[1]
        for call, stage in STAGES.items():
            cell = table.split(f"<bdi>{call}</bdi>")[1].split("</tr>")[0]
            assert f'class="stage {stage}"' in cell, (call, cell)
        assert 'id="left-in-flight"' in run_page
        attempted = (await client.get(f"/console/runs/{RUN}", params={"stage": "attempted"})).text
        listed = attempted.split('<table id="calls">')[1]
        assert "<bdi>t1</bdi>" in listed and "<bdi>b1</bdi>" not in listed
        paused_page = (await client.get(f"/console/runs/{PAUSED}")).text
        assert 'id="paused"' in paused_page and "incident 42" in paused_page
        approved = (
            await client.get(f"/console/runs/{RUN}/invocations/{invocation_id(RUN, 'a1')}")
        ).text
        assert re.search(r'id="stage"[^>]*>approved<', approved)
        assert "not dispatched yet" in approved
        bad = await client.get(f"/console/runs/{RUN}", params={"stage": "flying"})
        assert bad.status_code == 400
        found = (await client.get("/console/search", params={"tool": "refund"})).text
        for call in ("w1", "a1", "t1", "s1"):
            cell = found.split(f"<bdi>{call}</bdi>")[1].split("</tr>")[0]
            assert f'class="stage {STAGES[call]}"' in cell, (call, cell)

    async with serving(store, console=False) as base, httpx.AsyncClient(base_url=base) as client:
        response = await client.get(
            "/v1/runs/run-api/invocations", headers={"Authorization": f"Bearer {token}"}
        )
        assert response.status_code == 200
    # The run's own token lists its own calls only; the stage is there for every call.
    own = await store.open_run("run-own", deadline=timedelta(minutes=5))
    await store.writer.create("run-own", "c1", "lookup", b"{}")
    async with serving(store, console=False) as base, httpx.AsyncClient(base_url=base) as client:
        document = (
            await client.get(
                "/v1/runs/run-own/invocations",
                headers={"Authorization": f"Bearer {own.access_token}"},
            )
        ).json()
    assert [call["stage"] for call in document["invocations"]] == ["dispatching"]


async def test_the_console_explains_the_receipt_and_where_an_edit_stands(
    make_store: Any,
) -> None:
    """Beside the receipt the call's page says that business_operation_performed describes
    that read, not the call; an edited call's original page says where the edit stands
    now: waiting for its approval, then approved and waiting for its resume."""
    store = await every_stage(make_store)
    done = await store.decisions.supersede(RUN, "w1", {"amount": 3}, by="ana", reason="cap")
    assert done.edited == "w1.edit1"
    page = f"/console/runs/{RUN}/invocations/{invocation_id(RUN, 'w1')}"
    async with serving(store) as base, httpx.AsyncClient(base_url=base, headers=BEARER) as client:
        original = (await client.get(page)).text
        assert "describe this read of the receipt" in original.replace("\n", " ")
        assert "which waits for its own approval" in original
        await store.decide(RUN, "w1.edit1", approve=True, by="bo", reason="ok")
        original = (await client.get(page)).text
        assert "which was approved and waits for its harness to resume it" in original
