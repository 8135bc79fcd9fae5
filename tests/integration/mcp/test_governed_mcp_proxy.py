"""Governed upstream tools through ``canon mcp-proxy``, every part a real process.

The host is the SDK's own client (``stdio_client`` + ``ClientSession``); the proxy is
``python -m canon.cli mcp-proxy``; the upstream is tests/support/mcp_governed_upstream.py
(the SDK's MCPServer, annotated tools, one that elicits), which writes a line per tool it
really runs. Operators decide with the real ``canon approve`` / ``canon deny`` or with
``store.decide``. A governed call answers pending at once and never reaches the upstream
until an operator approved it; the host's retry with the same ids then runs it once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from canon.integrations.mcp import (
    APPROVAL_ID_KEY,
    CONSOLE_URL_KEY,
    INVOCATION_ID_KEY,
    RUN_ID_KEY,
    TOOL_CALL_ID_KEY,
    call_tool,
)
from eventstore import Store
from eventstore.audit.waiting import pending_approvals
from machine.codes import SAFE_MESSAGES, ErrorCode, Stage, Status
from machine.ids import invocation_id
from tests.support.log_scan import LOG_FORBIDDEN
from tests.support.mcp_client import assert_pending, text_of
from tests.support.operators import credentials

ROOT = Path(__file__).parents[3]
UPSTREAM = [sys.executable, str(ROOT / "tests" / "support" / "mcp_governed_upstream.py")]
RUN = "run-governed-proxy"
EMAIL = {"to": "ops@example.com", "body": "quarterly numbers"}
CONSOLE = "http://127.0.0.1:8000"

pytestmark = pytest.mark.timeout(90)


def canon(
    redis_url: str, namespace: str, command: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """Run the real ``canon COMMAND`` on this test's store, as the operator ``ops``."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "canon.cli",
            command,
            f"--redis-url={redis_url}",
            f"--namespace={namespace}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env={**os.environ, **credentials("ops"), "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
    )


@pytest.fixture
def ran_file(tmp_path: Path) -> Path:
    """Where the upstream writes one line per tool it really ran."""
    return tmp_path / "upstream-ran"


def upstream_ran(ran_file: Path, tool: str | None = None) -> list[Any]:
    """The arguments of each call the upstream really ran (of ``tool``, or every tool's)."""
    lines = ran_file.read_text().splitlines() if ran_file.exists() else []
    runs = [line.split(" ", 1) for line in lines]
    return [json.loads(arguments) for name, arguments in runs if tool is None or name == tool]


@pytest.fixture
def stderr_logs(tmp_path: Path) -> Iterator[list[Path]]:
    """The proxies' stderr files; after the test none may hold a payload or a trace."""
    logs: list[Path] = []
    yield logs
    for log in logs:
        text = log.read_text(errors="replace")
        leaked = [fragment for fragment in (*LOG_FORBIDDEN, EMAIL["body"]) if fragment in text]
        assert not leaked, f"{log.name} holds {leaked}: {text[-2000:]}"


class Host:
    """The host's elicitation handler: answers every form "accept", approve: true."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def elicitation(self, context: Any, params: types.ElicitRequestParams) -> Any:
        self.asked.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": True})


@pytest.fixture
def proxy(
    redis_url: str, namespace: str, tmp_path: Path, ran_file: Path, stderr_logs: list[Path]
) -> Any:
    """Connects the SDK's stdio client to a fresh ``canon mcp-proxy`` with ``options``."""

    @asynccontextmanager
    async def connect(*options: str, host: Host | None = None) -> AsyncIterator[ClientSession]:
        log = tmp_path / f"proxy-{len(stderr_logs)}.stderr"
        stderr_logs.append(log)
        parameters = StdioServerParameters(
            command=sys.executable,
            args=[
                "-m",
                "canon.cli",
                "mcp-proxy",
                f"--redis-url={redis_url}",
                f"--namespace={namespace}",
                *options,
                "--",
                *UPSTREAM,
                str(ran_file),
            ],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            cwd=str(ROOT),
        )
        with log.open("w") as errlog:
            async with (
                stdio_client(parameters, errlog=errlog) as (read, write),
                ClientSession(
                    read,
                    write,
                    elicitation_callback=host.elicitation if host is not None else None,
                ) as session,
            ):
                await session.initialize()
                yield session

    return connect


@pytest.fixture
async def store(make_store: Any) -> Store:
    """The harness's store, with the run the host names in ``_meta`` opened."""
    store: Store = make_store()
    await store.open_run(RUN, deadline=timedelta(minutes=10))
    return store


async def send_email(session: ClientSession, call: str = "call-1", **changed: Any) -> Any:
    return await call_tool(
        session, "send_email", {**EMAIL, **changed}, tool_call_id=call, run_id=RUN
    )


async def test_a_governed_call_answers_pending_with_its_console_page_and_runs_nothing(
    proxy: Any, store: Store, ran_file: Path
) -> None:
    """Pending at once (approval id, console page); the upstream never sees the call."""
    async with proxy("--govern", "annotations", "--console-url", f"{CONSOLE}/") as session:
        first = await send_email(session)
        again = await send_email(session)
    approval_id = assert_pending(first, RUN, "call-1")
    assert assert_pending(again, RUN, "call-1") == approval_id
    assert first.meta is not None
    assert first.meta[CONSOLE_URL_KEY] == (
        f"{CONSOLE}/console/runs/{RUN}/invocations/{invocation_id(RUN, 'call-1')}"
    )
    assert upstream_ran(ran_file) == []
    record = await store.get(RUN, "call-1")
    assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL
    assert record.state.approval_id == approval_id
    assert json.loads(record.request) == EMAIL
    [waiting] = (await pending_approvals(store)).calls
    assert (waiting.run_id, waiting.call.tool_call_id) == (RUN, "call-1")


async def test_approved_with_canon_approve_the_retry_runs_the_upstream_once(
    proxy: Any, store: Store, ran_file: Path, redis_url: str, namespace: str
) -> None:
    """``canon approve``, then the same call again: the upstream runs it once, its answer
    comes back; every later retry gets the recorded answer. No console URL unless asked."""
    async with proxy("--govern", "annotations") as session:
        pending = await send_email(session)
        assert_pending(pending, RUN, "call-1")
        assert pending.meta is not None and CONSOLE_URL_KEY not in pending.meta

        approved = canon(redis_url, namespace, "approve", RUN, "call-1", "--reason", "ok")
        assert approved.returncode == 0, approved.stderr
        assert upstream_ran(ran_file) == []  # a decision alone runs nothing

        done = await send_email(session)
        replayed = await send_email(session)
        changed = await send_email(session, body="other numbers")
    assert not done.is_error and text_of(done) == f"sent to {EMAIL['to']}"
    assert done.meta is not None and APPROVAL_ID_KEY not in done.meta
    assert done.meta[INVOCATION_ID_KEY] == invocation_id(RUN, "call-1")
    assert not replayed.is_error and text_of(replayed) == text_of(done)
    # New arguments under the same id are another call, refused, never run.
    assert changed.is_error
    assert json.loads(text_of(changed))["error_code"] == ErrorCode.DUPLICATE_TOOL_CALL.value
    assert upstream_ran(ran_file) == [EMAIL]
    record = await store.get(RUN, "call-1")
    assert record is not None and record.state.status is Status.READY


async def test_a_pause_holds_an_approved_call_and_the_resume_after_it_runs_once(
    proxy: Any, store: Store, ran_file: Path
) -> None:
    """Approve, pause, resume: still waiting, nothing sent upstream; unpause, resume: once."""
    async with proxy("--govern", "annotations") as session:
        approval_id = assert_pending(await send_email(session), RUN, "call-1")
        await store.decide(RUN, "call-1", approve=True, by="ops", reason="ok")
        await store.pause_run(RUN, by="ops", reason="incident")
        held = await send_email(session)
        assert upstream_ran(ran_file) == []
        await store.unpause_run(RUN, by="ops", reason="resolved")
        done = await send_email(session)
        replayed = await send_email(session)
    assert not held.is_error
    assert held.meta is not None and held.meta[APPROVAL_ID_KEY] == approval_id
    assert "paused" in text_of(held) and "has not run" in text_of(held)
    assert not done.is_error and text_of(done) == f"sent to {EMAIL['to']}"
    assert text_of(replayed) == text_of(done)
    assert upstream_ran(ran_file) == [EMAIL]


async def test_a_denied_call_answers_iserror_with_the_denial(
    proxy: Any, store: Store, ran_file: Path, redis_url: str, namespace: str
) -> None:
    """``canon deny``: every retry is an isError result with APPROVAL_DENIED; nothing ran."""
    async with proxy("--govern", "annotations") as session:
        assert_pending(await send_email(session), RUN, "call-1")
        denied = canon(redis_url, namespace, "deny", RUN, "call-1", "--reason", "no")
        assert denied.returncode == 0, denied.stderr
        first = await send_email(session)
        again = await send_email(session)
    for result in (first, again):
        assert result.is_error
        assert json.loads(text_of(result)) == {
            "error_code": "APPROVAL_DENIED",
            "message": SAFE_MESSAGES[ErrorCode.APPROVAL_DENIED],
        }
        assert result.meta is not None
        assert result.meta[INVOCATION_ID_KEY] == invocation_id(RUN, "call-1")
    assert upstream_ran(ran_file) == []
    record = await store.get(RUN, "call-1")
    assert record is not None and record.state.status is Status.ERROR


async def test_under_govern_annotations_read_only_tools_run_at_once(
    proxy: Any, store: Store, ran_file: Path
) -> None:
    """readOnlyHint: true runs at once; readOnlyHint: false and no annotations wait."""
    async with proxy("--govern", "annotations") as session:
        inbox = await call_tool(session, "read_inbox", {}, tool_call_id="r1", run_id=RUN)
        archive = await call_tool(session, "archive", {"q": "old"}, tool_call_id="a1", run_id=RUN)
        email = await send_email(session, "e1")
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
    assert not inbox.is_error and text_of(inbox) == "3 messages"
    assert inbox.meta is not None and APPROVAL_ID_KEY not in inbox.meta
    assert_pending(archive, RUN, "a1")
    assert_pending(email, RUN, "e1")
    assert upstream_ran(ran_file) == [{}]
    # The listing is the upstream's, annotations and all, but a governed tool shows no
    # output schema: its pending answer has no structured content to match one.
    inbox_hints = listed["read_inbox"].annotations
    assert inbox_hints is not None and inbox_hints.read_only_hint is True
    assert listed["archive"].annotations is None
    assert listed["read_inbox"].output_schema is not None
    assert listed["send_email"].output_schema is None
    assert listed["archive"].output_schema is None


async def test_govern_by_name_governs_the_named_tools_only(
    proxy: Any, store: Store, ran_file: Path
) -> None:
    """``--govern archive``: archive waits; send_email (not read-only) runs at once; a
    named tool the upstream does not list is governed too, never forwarded."""
    async with proxy("--govern", "archive", "--govern", "wipe_all") as session:
        archive = await call_tool(session, "archive", {"q": "old"}, tool_call_id="a1", run_id=RUN)
        email = await send_email(session, "e1")
        wipe = await call_tool(session, "wipe_all", {}, tool_call_id="w1", run_id=RUN)
    assert_pending(archive, RUN, "a1")
    assert not email.is_error and text_of(email) == f"sent to {EMAIL['to']}"
    assert_pending(wipe, RUN, "w1")
    assert upstream_ran(ran_file) == [EMAIL]


async def test_by_default_nothing_is_governed_every_call_is_recorded_and_runs(
    proxy: Any, store: Store, ran_file: Path
) -> None:
    """Without ``--govern`` the proxy records and runs every call, as before."""
    async with proxy() as session:
        email = await send_email(session)
        archive = await call_tool(session, "archive", {"q": "old"}, tool_call_id="a1", run_id=RUN)
    assert [r.is_error for r in (email, archive)] == [False, False]
    assert upstream_ran(ran_file, "send_email") == [EMAIL]
    record = await store.get(RUN, "call-1")
    assert record is not None and record.state.status is Status.READY
    assert record.state.approval_id is None


async def test_an_elicitation_answered_accept_never_approves_a_pending_call(
    proxy: Any, store: Store, ran_file: Path
) -> None:
    """The upstream asks the host "approve?" while a call waits; the host's "accept" goes
    to the upstream as its answer, and the call stays pending, undispatched."""
    host = Host()
    async with proxy("--govern", "annotations", host=host) as session:
        approval_id = assert_pending(await send_email(session), RUN, "call-1")
        asked = await call_tool(
            session,
            "confirm",
            {"question": f"Approve call-1 (approval {approval_id})?"},
            tool_call_id="q1",
            run_id=RUN,
        )
        retried = await send_email(session)
    assert host.asked == [f"Approve call-1 (approval {approval_id})?"]
    assert not asked.is_error and text_of(asked) == "accept: True"
    assert assert_pending(retried, RUN, "call-1") == approval_id
    assert upstream_ran(ran_file, "send_email") == []
    record = await store.get(RUN, "call-1")
    assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL


async def test_a_host_without_ids_resumes_with_the_ids_the_pending_result_names(
    proxy: Any, make_store: Any, ran_file: Path
) -> None:
    """No ``_meta`` ids: the pending result names the fallback ones; a retry with them
    after the approval runs the call once."""
    store: Store = make_store()
    async with proxy("--govern", "send_email") as session:
        pending = await session.call_tool("send_email", EMAIL)
        assert pending.meta is not None
        run_id, call = pending.meta[RUN_ID_KEY], pending.meta[TOOL_CALL_ID_KEY]
        assert not pending.is_error and APPROVAL_ID_KEY in pending.meta
        decision = await store.decide(run_id, call, approve=True, by="ops", reason="fine")
        assert decision.made_now
        done = await call_tool(session, "send_email", EMAIL, tool_call_id=call, run_id=run_id)
    assert not done.is_error and text_of(done) == f"sent to {EMAIL['to']}"
    assert upstream_ran(ran_file) == [EMAIL]


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        (["--govern", "none", "--govern", "send_email"], "--govern none"),
        (["--govern", "send email"], "not 'annotations', 'none' or a tool name"),
        (["--console-url", "ftp://console"], "--console-url"),
    ],
)
def test_bad_govern_or_console_flags_are_one_line_and_exit_2(
    options: list[str], complaint: str, redis_url: str, namespace: str, ran_file: Path
) -> None:
    """A contradictory ``--govern``, a bad tool name or console URL: exit 2, no upstream."""
    done = canon(redis_url, namespace, "mcp-proxy", *options, "--", *UPSTREAM, str(ran_file))
    assert done.returncode == 2
    assert complaint in done.stderr
    assert "Traceback" not in done.stderr
    assert not ran_file.exists()
