"""``canon approvals|approve|deny|pause|unpause`` in a real process: an operator lists a
run's waiting governed calls, decides them (the first decision wins, a second says what was
decided), and pauses and unpauses the run, each with who and why kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from typing import Any

import httpx

from eventstore.decisions import new_approval_id
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.codes import ErrorCode, Stage
from machine.ids import invocation_id
from projections.console.auth import Operators
from tests.support.console_run import OPERATOR_TOKEN, serving
from tests.support.operators import TOKENS, credentials, without_credentials

RUN = "run-ops"
BEARER = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


def canon(
    redis_url: str,
    namespace: str,
    *args: str,
    operator: str | None = "ana",
    token: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``canon`` as ``operator`` (their token, or ``token``, and the operators, in the
    environment)."""
    given = credentials(operator, token) if operator is not None else {}
    environment = without_credentials(dict(os.environ))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "canon.cli",
            *args,
            "--redis-url",
            redis_url,
            "--namespace",
            namespace,
            "--shards",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**environment, **given, "COLUMNS": "200"},
    )


async def waiting(store: Store, *calls: str) -> None:
    await store.open_run(RUN, deadline=timedelta(minutes=10))
    for call in calls:
        await store.writer.request_approval(
            RUN,
            call,
            "refund",
            b'{"amount":5}',
            approval_id=new_approval_id(),
            approval_expires_at_ms=now_ms() + 600_000,
            requested_by="agent",
        )


async def test_an_operator_lists_decides_and_pauses(
    make_store: Any, redis_url: str, namespace: str
) -> None:
    """approvals lists both waiting calls; approve and deny record the operator and the
    reason; a second decision exits 1 naming the first; the list then shows the approved
    call waiting for its resume; pause and unpause are kept on the run."""
    store: Store = make_store(shards=2)
    await waiting(store, "pay-1", "pay-2")
    listed = canon(redis_url, namespace, "approvals", RUN, "--json")
    assert listed.returncode == 0, listed.stderr
    document = json.loads(listed.stdout)
    assert [row["tool_call_id"] for row in document["waiting"]] == ["pay-1", "pay-2"]
    assert {row["stage"] for row in document["waiting"]} == {"AWAITING_APPROVAL"}

    approved = canon(
        redis_url,
        namespace,
        "approve",
        RUN,
        "pay-1",
        "--reason",
        "checked the invoice",
        operator="ana",
    )
    assert approved.returncode == 0, approved.stderr
    assert "pay-1: approved by ana" in approved.stdout
    denied = canon(redis_url, namespace, "deny", RUN, "pay-2", "--reason", "dup", operator="bo")
    assert denied.returncode == 0 and "pay-2: denied by bo" in denied.stdout
    again = canon(redis_url, namespace, "deny", RUN, "pay-1", "--reason", "late", operator="cy")
    assert again.returncode == 1
    assert "already approved by ana" in again.stderr
    record = await store.reader.get(RUN, "pay-1")
    assert record is not None and record.state.stage is Stage.APPROVED
    assert (record.state.decided_by, record.state.decision_reason) == ("ana", "checked the invoice")
    second = await store.reader.get(RUN, "pay-2")
    assert second is not None and second.state.error_code is ErrorCode.APPROVAL_DENIED

    text = canon(redis_url, namespace, "approvals", RUN)
    assert "pay-1" in text.stdout and "approved, for its resume" in text.stdout
    assert "pay-2" not in text.stdout

    paused = canon(redis_url, namespace, "pause", RUN, "--reason", "incident", operator="ana")
    assert paused.returncode == 0 and f"{RUN}: paused by ana" in paused.stdout
    info = await store.run_info(RUN)
    assert info is not None and info.paused
    assert "the run is paused" in canon(redis_url, namespace, "approvals", RUN).stdout
    unpaused = canon(redis_url, namespace, "unpause", RUN, "--reason", "ok", operator="ana")
    assert unpaused.returncode == 0
    info = await store.run_info(RUN)
    assert info is not None and not info.paused


async def test_bad_input_is_one_line_and_changes_nothing(
    make_store: Any, redis_url: str, namespace: str
) -> None:
    """No reason, an empty one, an unsafe run id, a call that is not governed, an unknown
    run: one line each, a usage or problem exit, nothing written."""
    store: Store = make_store(shards=2)
    await waiting(store, "pay-1")
    await store.writer.create(RUN, "plain", "search", b"{}")
    no_reason = canon(redis_url, namespace, "approve", RUN, "pay-1", operator="ana")
    assert no_reason.returncode == 2 and "--reason" in no_reason.stderr
    empty = canon(redis_url, namespace, "approve", RUN, "pay-1", "--reason", " ", operator="ana")
    assert empty.returncode == 2
    unsafe = canon(
        redis_url, namespace, "approve", "bad:run", "pay-1", "--reason", "x", operator="ana"
    )
    assert unsafe.returncode == 1 and len(unsafe.stderr.strip().splitlines()) == 1
    plain = canon(redis_url, namespace, "approve", RUN, "plain", "--reason", "x", operator="ana")
    assert plain.returncode == 1 and "nothing to decide" in plain.stderr
    unknown = canon(redis_url, namespace, "pause", "run-nope", "--reason", "x", operator="ana")
    assert unknown.returncode == 1 and "no run run-nope" in unknown.stderr
    for result in (no_reason, empty, unsafe, plain, unknown):
        assert "Traceback" not in result.stderr
    record = await store.reader.get(RUN, "pay-1")
    assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL


async def test_the_console_and_the_cli_list_the_calls_waiting_across_runs(
    make_store: Any, redis_url: str, namespace: str
) -> None:
    """/console/approvals and `canon approvals` without a run list the calls waiting for
    a decision across runs, oldest first, with the frozen request one click away; the
    runs page keeps the runs with waiting calls."""
    store: Store = make_store(shards=2)
    await waiting(store, "pay-1", "pay-2")
    await store.writer.create(RUN, "plain", "search", b"{}")
    listed = canon(redis_url, namespace, "approvals", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)["waiting"]
    assert [(row["run_id"], row["tool_call_id"]) for row in rows] == [
        (RUN, "pay-1"),
        (RUN, "pay-2"),
    ]
    async with serving(store) as base, httpx.AsyncClient(base_url=base, headers=BEARER) as client:
        page = await client.get("/console/approvals")
        assert page.status_code == 200
        assert page.text.count("frozen request") == 2
        assert f"/console/runs/{RUN}/invocations/{invocation_id(RUN, 'pay-1')}/payloads" in (
            page.text
        )
        runs = await client.get("/console/?status=awaiting_approval")
        assert f'href="/console/runs/{RUN}"' in runs.text
        assert (await client.get("/console/approvals?x=1")).status_code == 400


async def test_a_sweep_records_the_expiry_of_calls_left_waiting_past_it(
    make_store: Any, redis_url: str, namespace: str
) -> None:
    """Only the calls past their approval's expiry end APPROVAL_EXPIRED; a second sweep
    finds nothing more."""
    store: Store = make_store(shards=2)
    await waiting(store, "fresh")
    await store.writer.request_approval(
        RUN,
        "stale",
        "refund",
        b'{"amount":5}',
        approval_id=new_approval_id(),
        approval_expires_at_ms=now_ms() - 1,
        requested_by="agent",
    )
    swept = canon(redis_url, namespace, "sweep-approvals")
    assert swept.returncode == 0, swept.stderr
    assert "1 expired approval(s) recorded" in swept.stdout
    stale, fresh = [await store.get(RUN, call) for call in ("stale", "fresh")]
    assert stale is not None and stale.state.error_code is ErrorCode.APPROVAL_EXPIRED
    assert fresh is not None and fresh.state.stage is Stage.AWAITING_APPROVAL
    again = canon(redis_url, namespace, "sweep-approvals")
    assert again.returncode == 0 and "0 expired approval(s) recorded" in again.stdout


async def test_approve_with_an_edit_supersedes_the_call_and_approves_nothing(
    make_store: Any, redis_url: str, namespace: str
) -> None:
    """``canon approve --edit`` denies the call as superseded and records the edited
    request as a linked call that waits; a bad edit is one line, exit 1, and changes
    nothing."""
    store: Store = make_store(shards=2)
    await waiting(store, "pay-1")
    bad = canon(redis_url, namespace, "approve", RUN, "pay-1", "--reason", "x", "--edit", "[1]")
    assert bad.returncode == 1 and "JSON object" in bad.stderr, bad.stderr
    record = await store.get(RUN, "pay-1")
    assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL
    done = canon(
        redis_url,
        namespace,
        "approve",
        RUN,
        "pay-1",
        "--reason",
        "cap",
        "--edit",
        '{"amount": 4}',
        operator="ana",
    )
    assert done.returncode == 0, done.stderr
    assert "superseded by pay-1.edit1, which waits for its own approval" in done.stdout
    original, edited = [await store.get(RUN, call) for call in ("pay-1", "pay-1.edit1")]
    assert original is not None and original.state.error_code is ErrorCode.APPROVAL_DENIED
    assert original.state.decided_by == "ana" and original.state.superseded_by == "pay-1.edit1"
    assert edited is not None and edited.state.stage is Stage.AWAITING_APPROVAL
    assert edited.state.supersedes == "pay-1" and edited.request == b'{"amount":4}'


async def test_a_decision_is_recorded_as_the_operator_the_token_names(
    make_store: Any, redis_url: str, namespace: str
) -> None:
    """No credential, a token the operators file does not name, or --by: one line, exit
    2, nothing decided. With bo's token the decision is bo's, whatever else is typed; the
    agent's requester may not approve its own call (exit 1)."""
    store: Store = make_store(shards=2)
    await waiting(store, "pay-1")
    nobody = canon(redis_url, namespace, "approve", RUN, "pay-1", "--reason", "x", operator=None)
    assert nobody.returncode == 2 and "CANON_OPERATOR_TOKEN" in nobody.stderr
    typed = canon(redis_url, namespace, "approve", RUN, "pay-1", "--reason", "x", "--by", "eve")
    assert typed.returncode == 2 and "--by is not taken" in typed.stderr
    stranger = canon(
        redis_url,
        namespace,
        "approve",
        RUN,
        "pay-1",
        "--reason",
        "x",
        token="eve-token-" + "y" * 20,
    )
    assert stranger.returncode == 2 and "not in the operators file" in stranger.stderr
    for result in (nobody, typed, stranger):
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
        assert TOKENS["ana"] not in result.stderr and "eve-token" not in result.stderr
    record = await store.get(RUN, "pay-1")
    assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL
    await store.writer.request_approval(
        RUN,
        "mine",
        "refund",
        b'{"amount":5}',
        approval_id=new_approval_id(),
        approval_expires_at_ms=now_ms() + 600_000,
        requested_by="cy",
    )
    own = canon(redis_url, namespace, "approve", RUN, "mine", "--reason", "x", operator="cy")
    assert own.returncode == 1 and "cannot approve" in own.stderr
    done = canon(redis_url, namespace, "approve", RUN, "pay-1", "--reason", "ok", operator="bo")
    assert done.returncode == 0 and "approved by bo" in done.stdout
    record = await store.get(RUN, "pay-1")
    assert record is not None and record.state.decided_by == "bo"


def test_operators_add_writes_a_digest_never_a_token(tmp_path: Any) -> None:
    """`canon operators add` makes the token file (owner-only) and adds one digest line;
    the operators file it writes names the operator for the decisions."""
    run = subprocess.run(
        [sys.executable, "-m", "canon.cli", "operators", "add", "ana"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    token = (tmp_path / "ana.token").read_text().strip()
    listed = (tmp_path / "operators.txt").read_text()
    assert token not in listed and token not in run.stdout
    assert oct((tmp_path / "ana.token").stat().st_mode & 0o777) == "0o600"
    assert Operators.parse(listed).name_of(token) == "ana"
    again = subprocess.run(
        [sys.executable, "-m", "canon.cli", "operators", "add", "ana"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert again.returncode == 2 and "already names 'ana'" in again.stderr
