"""``canon mcp-proxy`` in front of an unmodified MCP server, both real subprocesses.

The host is the SDK's own client (``stdio_client`` + ``ClientSession``, or its
streamable-HTTP client); the upstream is tests/support/mcp_upstream_server.py (the SDK's
MCPServer). A stray byte on the proxy's stdout would break the client's parsing, and the
proxy's stderr is checked for payloads and traces after every test.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult

from canon.integrations.mcp import INVOCATION_ID_KEY, RUN_ID_KEY, TOOL_CALL_ID_KEY, call_tool
from eventstore import Store
from machine.codes import ErrorCode, EvidenceStatus, Status
from machine.ids import invocation_id
from projections import ReceiptWorker
from projections.receipts.inspection import inspect_invocation
from projections.receipts.journal import JournalState
from tests.support.log_scan import LOG_FORBIDDEN, forbid_in_logs
from tests.support.mcp_client import text_of
from tests.support.ports import free_port
from tests.support.provider_ids import ACCEPTED
from tests.support.waiting import wait_for

ROOT = Path(__file__).parents[3]
UPSTREAM = [sys.executable, str(ROOT / "tests" / "support" / "mcp_upstream_server.py")]
RUN = "run-proxy"
#: What a payload in the host's arguments looks like; it must never reach a log.
MARKER = "PAYLOAD-MARKER-arg"
#: A secret in arguments the upstream quotes back in its error text; the host sees it
#: scrubbed, and no log holds it.
UPSTREAM_SECRET = "5e2b7c9d01fa"
forbid_in_logs(UPSTREAM_SECRET)

pytestmark = pytest.mark.timeout(90)


def proxy_argv(
    redis_url: str | None, namespace: str, *options: str, upstream: list[str]
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "canon.cli",
        "mcp-proxy",
        *([f"--redis-url={redis_url}"] if redis_url else []),
        f"--namespace={namespace}",
        *options,
        "--",
        *upstream,
    ]


def assert_clean(log: Path) -> None:
    text = log.read_text(errors="replace")
    leaked = [fragment for fragment in (*LOG_FORBIDDEN, "Traceback", MARKER) if fragment in text]
    assert not leaked, f"{log.name} holds {leaked}: {text[-2000:]}"


@pytest.fixture
def count_file(tmp_path: Path) -> Path:
    """Where the upstream writes one line per tool it really ran."""
    return tmp_path / "upstream-calls"


@pytest.fixture
def stderr_logs(tmp_path: Path) -> Iterator[list[Path]]:
    """The proxies' stderr files; after the test none may hold a payload or a trace."""
    logs: list[Path] = []
    yield logs
    for log in logs:
        assert_clean(log)


@pytest.fixture
def proxy(
    redis_url: str, namespace: str, tmp_path: Path, count_file: Path, stderr_logs: list[Path]
) -> Any:
    """Connects the SDK's stdio client to a fresh ``canon mcp-proxy`` process.

    ``stdio_client`` starts the process and, on leaving the block, closes its stdin and
    reaps it (terminating it if it lingers).
    """

    @asynccontextmanager
    async def connect(
        *options: str,
        upstream: list[str] | None = None,
        env: dict[str, str] | None = None,
        initialize: bool = True,
        embedded: bool = False,
        cwd: Path = ROOT,
    ) -> AsyncIterator[Any]:
        argv = proxy_argv(
            None if embedded else redis_url,
            namespace,
            *options,
            upstream=upstream if upstream is not None else [*UPSTREAM, str(count_file)],
        )
        log = tmp_path / f"proxy-{len(stderr_logs)}.stderr"
        stderr_logs.append(log)
        environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        if embedded:
            environment.pop("REDIS_URL", None)
        parameters = StdioServerParameters(
            command=argv[0], args=argv[1:], env=environment, cwd=str(cwd)
        )
        with log.open("w") as errlog:
            async with (
                stdio_client(parameters, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                if initialize:
                    await session.initialize()
                yield session
        # The proxy logs to stderr (so the leak check after the test reads real logs).
        assert "mcp_proxy_started" in log.read_text()

    return connect


def upstream_runs(count_file: Path) -> list[str]:
    return count_file.read_text().splitlines() if count_file.exists() else []


async def test_the_upstreams_tools_are_listed_as_the_upstream_lists_them(proxy: Any) -> None:
    """Names, descriptions, input and output schemas pass through unchanged."""
    direct = StdioServerParameters(command=UPSTREAM[0], args=UPSTREAM[1:])
    async with stdio_client(direct) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        upstream = (await session.list_tools()).tools
    async with proxy() as session:
        proxied = (await session.list_tools()).tools
    assert [tool.name for tool in proxied] == ["lookup", "fail", "ping"]
    assert [t.model_dump() for t in proxied] == [t.model_dump() for t in upstream]


async def test_a_call_is_recorded_with_the_hosts_ids_and_gets_a_receipt(
    proxy: Any, make_store: Any
) -> None:
    """A provider-shaped ``_meta`` id reaches the record exactly; raw, result and receipt.

    The host gets the upstream's result as the upstream sent it (``isError: false``
    included), with canon's ids in its ``_meta``."""
    store: Store = make_store()
    # The harness opened the run itself (it holds the receipt token); the proxy uses it.
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    call_id = ACCEPTED["anthropic"]
    async with proxy() as session:
        result = await call_tool(session, "lookup", {"q": MARKER}, tool_call_id=call_id, run_id=RUN)
    assert not result.is_error
    assert text_of(result) == f"answer to {MARKER}"
    assert result.structured_content == {"result": f"answer to {MARKER}"}
    assert result.meta == {
        RUN_ID_KEY: RUN,
        TOOL_CALL_ID_KEY: call_id,
        INVOCATION_ID_KEY: invocation_id(RUN, call_id),
    }

    record = await store.get(RUN, call_id)
    assert record is not None and record.state.status is Status.READY
    assert record.state.evidence_status is EvidenceStatus.EVIDENCE_FOUND
    assert json.loads(record.request) == {"q": MARKER}
    assert record.raw is not None and json.loads(record.raw) == {
        "content": [{"type": "text", "text": f"answer to {MARKER}"}],
        "structuredContent": {"result": f"answer to {MARKER}"},
        "isError": False,
    }
    # The recorded result is the upstream's exactly (stored once: it is the raw response).
    assert record.result == record.raw

    await ReceiptWorker(store, consumer="w").run(burst=True)
    receipt = await inspect_invocation(store, RUN, invocation_id(RUN, call_id))
    assert (receipt.tool_call_id, receipt.tool) == (call_id, "lookup")
    assert receipt.journal_state is JournalState.COMPLETED
    assert receipt.result is not None


async def test_an_upstream_error_is_an_iserror_result_with_the_safe_error_when_hidden(
    proxy: Any, make_store: Any, count_file: Path
) -> None:
    """``--hide-tool-errors``: the upstream's ``isError`` becomes EXECUTION_FAILED; its
    error text never shows."""
    store: Store = make_store()
    async with proxy(f"--run-id={RUN}", "--hide-tool-errors") as session:
        result = await call_tool(session, "fail", {"q": MARKER}, tool_call_id="call_fail")
    assert result.is_error
    assert json.loads(text_of(result)) == {
        "error_code": "EXECUTION_FAILED",
        "message": "The tool failed while executing.",
    }
    assert "PAYLOAD-MARKER" not in result.model_dump_json()
    record = await store.get(RUN, "call_fail")
    assert record is not None and record.state.status is Status.ERROR
    assert record.state.error_code is ErrorCode.EXECUTION_FAILED
    assert upstream_runs(count_file) == ["fail"]


async def test_by_default_the_host_gets_the_upstreams_own_error_text(
    proxy: Any, make_store: Any
) -> None:
    """The default: the host gets the upstream's ``isError`` text (scrubbed,
    bounded) as an ``isError`` result, recorded as the ERROR record's agent result; a
    crash the upstream itself hid stays hidden. Arguments that miss the schema give the
    upstream's validation message, the mistake a model can correct."""
    store: Store = make_store()
    wrong = {"city": f"session={UPSTREAM_SECRET}"}
    async with proxy(f"--run-id={RUN}") as session:
        invalid = await call_tool(session, "lookup", wrong, tool_call_id="call_bad_args")
        crashed = await call_tool(session, "fail", {"q": "x"}, tool_call_id="call_crash")

    assert invalid.is_error and crashed.is_error
    shown = text_of(invalid)
    assert shown.startswith("Error executing tool lookup: 1 validation error")
    assert "Field required" in shown and "session=[Filtered]" in shown
    assert UPSTREAM_SECRET not in invalid.model_dump_json()
    assert text_of(crashed) == "Error executing tool fail"
    for call_id, text in (("call_bad_args", shown), ("call_crash", text_of(crashed))):
        record = await store.get(RUN, call_id)
        assert record is not None and record.state.status is Status.ERROR
        assert record.state.error_code is ErrorCode.EXECUTION_FAILED
        assert record.result is not None and json.loads(record.result) == text
    receipt = await inspect_invocation(store, RUN, invocation_id(RUN, "call_bad_args"))
    assert receipt.result is not None and receipt.result["message"] == shown


async def test_with_hide_tool_errors_the_upstreams_text_stays_out(
    proxy: Any, make_store: Any
) -> None:
    """``--hide-tool-errors``: the same wrong arguments give the host canon's safe error
    JSON only, and the record keeps no agent result."""
    store: Store = make_store()
    wrong = {"city": f"session={UPSTREAM_SECRET}"}
    async with proxy(f"--run-id={RUN}", "--hide-tool-errors") as session:
        invalid = await call_tool(session, "lookup", wrong, tool_call_id="call_bad_args")

    assert invalid.is_error
    assert json.loads(text_of(invalid)) == {
        "error_code": "EXECUTION_FAILED",
        "message": "The tool failed while executing.",
    }
    record = await store.get(RUN, "call_bad_args")
    assert record is not None and record.result is None


async def test_forward_tool_errors_replays_the_text_and_keeps_a_size_errors_hint(
    proxy: Any, make_store: Any, count_file: Path
) -> None:
    """A re-sent failed call gets the same upstream text
    without the upstream running again, and a result over ``--max-result-bytes`` is still
    canon's safe error JSON whose ``limit`` names the flag, never a tool text."""
    store: Store = make_store()
    options = (f"--run-id={RUN}", "--max-result-bytes=256")
    async with proxy(*options) as session:
        first = await call_tool(session, "fail", {"q": "x"}, tool_call_id="call_crash")
        again = await call_tool(session, "fail", {"q": "x"}, tool_call_id="call_crash")
        big = await call_tool(session, "lookup", {"q": "x" * 1000}, tool_call_id="call_big")

    assert first.is_error and again.is_error
    assert text_of(first) == text_of(again) == "Error executing tool fail"
    assert len(first.content) == len(again.content) == 1
    assert big.is_error and len(big.content) == 1
    error = json.loads(text_of(big))
    assert error["error_code"] == "RESULT_TOO_LARGE"
    assert "--max-result-bytes" in error["limit"]
    assert upstream_runs(count_file) == ["fail", "lookup"]
    record = await store.get(RUN, "call_big")
    assert record is not None and record.state.status is Status.ERROR
    assert record.state.error_code is ErrorCode.RESULT_TOO_LARGE
    assert record.result is None


async def test_omitted_arguments_reach_the_upstream_as_an_empty_object(
    proxy: Any, make_store: Any
) -> None:
    """A ``tools/call`` without ``arguments`` is recorded and run with ``{}``."""
    store: Store = make_store()
    async with proxy(f"--run-id={RUN}") as session:
        result = await call_tool(session, "ping", tool_call_id="call_ping")
    assert text_of(result) == "pong"
    record = await store.get(RUN, "call_ping")
    assert record is not None and json.loads(record.request) == {}


async def test_two_connections_without_ids_make_two_records(
    proxy: Any, make_store: Any, count_file: Path
) -> None:
    """The fallback ids carry a per-connection id: request 1 of two proxies never collide."""
    store: Store = make_store()
    metas = []
    for _ in range(2):
        async with proxy(f"--run-id={RUN}") as session:
            metas.append((await session.call_tool("lookup", {"q": "same"})).meta)
    ids = [meta[TOOL_CALL_ID_KEY] for meta in metas if meta]
    assert len(ids) == 2 and ids[0] != ids[1]
    for call_id in ids:
        assert call_id.startswith("mcp-")
        record = await store.get(RUN, call_id)
        assert record is not None and record.state.status is Status.READY
    assert upstream_runs(count_file) == ["lookup", "lookup"]


async def test_each_connection_without_a_run_id_gets_its_own_run(
    proxy: Any, make_store: Any
) -> None:
    """No run id anywhere: the proxy opens ``mcp-<connection id>`` per connection."""
    store: Store = make_store()
    runs = []
    for _ in range(2):
        async with proxy() as session:
            result = await session.call_tool("ping")
        assert result.meta is not None and not result.is_error
        runs.append(result.meta[RUN_ID_KEY])
        assert await store.get(result.meta[RUN_ID_KEY], result.meta[TOOL_CALL_ID_KEY])
    assert len(set(runs)) == 2
    assert all(run.startswith("mcp-") for run in runs)


async def test_a_resent_call_is_replayed_and_the_upstream_runs_once(
    proxy: Any, count_file: Path
) -> None:
    """The same ``_meta`` id on a second connection gets the recorded answer."""
    answers = []
    for _ in range(2):
        async with proxy(f"--run-id={RUN}") as session:
            answers.append(await call_tool(session, "lookup", {"q": "x"}, tool_call_id="call_1"))
    assert [a.model_dump() for a in answers[1:]] == [answers[0].model_dump()]
    assert upstream_runs(count_file) == ["lookup"]


async def test_the_run_options_bound_each_run(proxy: Any, count_file: Path) -> None:
    """``--budget`` is the run's invocation budget: the second call is refused unrun."""
    async with proxy(f"--run-id={RUN}", "--budget=1") as session:
        first = await call_tool(session, "ping", tool_call_id="call_a")
        second = await call_tool(session, "ping", tool_call_id="call_b")
    assert not first.is_error
    assert second.is_error
    assert json.loads(text_of(second))["error_code"] == "RUN_BUDGET_EXHAUSTED"
    assert upstream_runs(count_file) == ["ping"]


async def test_parallel_calls_share_the_upstream_and_each_gets_its_answer(
    proxy: Any, make_store: Any, count_file: Path
) -> None:
    """Five calls in flight at once, one failing, one unknown: each answered as itself.

    The unknown tool never reaches the upstream: the proxy cannot record it, so it refuses
    it (UNKNOWN_TOOL, on the run's refusal log) and nothing is recorded as a call.
    """
    store: Store = make_store()
    calls = [("lookup", "a"), ("lookup", "b"), ("fail", "c"), ("lookup", "d"), ("nope", "e")]
    async with proxy(f"--run-id={RUN}") as session:
        results = await asyncio.gather(
            *(call_tool(session, tool, {"q": q}, tool_call_id=f"call_{q}") for tool, q in calls),
            return_exceptions=True,
        )
    for (tool, q), result in zip(calls, results, strict=True):
        if tool == "nope":
            assert isinstance(result, CallToolResult) and result.is_error
            assert json.loads(text_of(result))["error_code"] == "UNKNOWN_TOOL"
            continue
        assert isinstance(result, CallToolResult)
        assert result.meta is not None and result.meta[TOOL_CALL_ID_KEY] == f"call_{q}"
        if tool == "lookup":
            assert text_of(result) == f"answer to {q}"
        else:
            assert result.is_error and text_of(result) == "Error executing tool fail"
    assert sorted(upstream_runs(count_file)) == ["fail", "lookup", "lookup", "lookup"]
    assert await store.get(RUN, "call_e") is None


@pytest.fixture
def spawn(tmp_path: Path, stderr_logs: list[Path]) -> Iterator[Any]:
    """Starts processes with their output in a file; kills and reaps the survivors."""
    processes: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = tmp_path / f"spawned-{len(processes)}.log"
        stderr_logs.append(log)
        with log.open("wb") as out:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                cwd=ROOT,
                env={**os.environ, **(env or {})},
            )
        processes.append(process)
        return process

    yield start
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


async def answering(url: str) -> bool:
    try:
        async with httpx.AsyncClient() as client:
            await client.get(url, timeout=1.0)
    except httpx.TransportError:
        return False
    return True


async def test_the_streamable_http_proxy_records_every_session_apart(
    spawn: Any, redis_url: str, namespace: str, make_store: Any, count_file: Path
) -> None:
    """``--http``: two HTTP sessions' fallback ids differ (the Mcp-Session-Id); SIGTERM exits 0."""
    port = free_port()
    server = spawn(
        proxy_argv(
            redis_url,
            namespace,
            "--http",
            f"--port={port}",
            f"--run-id={RUN}",
            upstream=[*UPSTREAM, str(count_file)],
        )
    )
    url = f"http://127.0.0.1:{port}/mcp"
    await wait_for(lambda: answering(url), timeout_s=30)
    store: Store = make_store()
    metas = []
    for _ in range(2):
        async with streamable_http_client(url) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            assert [tool.name for tool in (await s.list_tools()).tools] == [
                "lookup",
                "fail",
                "ping",
            ]
            metas.append((await s.call_tool("lookup", {"q": "x"})).meta)
            failed = await call_tool(s, "fail", tool_call_id=f"call_f{len(metas)}")
            assert failed.is_error
    ids = [meta[TOOL_CALL_ID_KEY] for meta in metas if meta]
    assert len(set(ids)) == 2
    for call_id in ids:
        record = await store.get(RUN, call_id)
        assert record is not None and record.state.status is Status.READY
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=20) == 0


async def test_an_upstream_over_streamable_http_is_proxied_on_stdio(
    spawn: Any, proxy: Any, make_store: Any, count_file: Path
) -> None:
    """``--upstream-url`` reaches an MCP server over HTTP instead of starting one."""
    port = free_port()
    spawn([*UPSTREAM, str(count_file), str(port)])
    url = f"http://127.0.0.1:{port}/mcp"
    await wait_for(lambda: answering(url), timeout_s=30)
    store: Store = make_store()
    async with proxy(f"--run-id={RUN}", f"--upstream-url={url}", upstream=[]) as session:
        result = await call_tool(session, "lookup", {"q": "far"}, tool_call_id="call_far")
    assert text_of(result) == "answer to far"
    record = await store.get(RUN, "call_far")
    assert record is not None and record.state.status is Status.READY
    assert upstream_runs(count_file) == ["lookup"]


#: The upstream's bearer token; it must never appear in a log.
TOKEN = "PAYLOAD-MARKER-token-3f9a"


@pytest.fixture
async def guarded_upstream(spawn: Any, count_file: Path) -> str:
    """An upstream over streamable HTTP that answers 401 without ``Bearer`` :data:`TOKEN`."""
    port = free_port()
    spawn([*UPSTREAM, str(count_file), str(port)], env={"UPSTREAM_BEARER_TOKEN": TOKEN})
    url = f"http://127.0.0.1:{port}/mcp"
    await wait_for(lambda: answering(url), timeout_s=30)
    return url


@pytest.mark.parametrize(
    "options",
    [
        ("--bearer-token-env=UPSTREAM_SECRET",),
        ("--header=Authorization:env:UPSTREAM_AUTH",),
        ("--header=Authorization:file:{token_file}",),
    ],
)
async def test_an_upstream_url_gets_its_credentials_from_the_environment_or_a_file(
    proxy: Any, guarded_upstream: str, options: tuple[str, ...], tmp_path: Path
) -> None:
    """``--bearer-token-env``, ``--header NAME:env:VAR`` or ``NAME:file:PATH``; never logged."""
    env = {"UPSTREAM_SECRET": TOKEN, "UPSTREAM_AUTH": f"Bearer {TOKEN}"}
    token_file = tmp_path / "token"
    token_file.write_text(f"Bearer {TOKEN}\n")
    options = tuple(option.format(token_file=token_file) for option in options)
    async with proxy(
        f"--run-id={RUN}", f"--upstream-url={guarded_upstream}", *options, upstream=[], env=env
    ) as session:
        result = await call_tool(session, "lookup", {"q": "far"}, tool_call_id="call_auth")
    assert text_of(result) == "answer to far"


async def test_an_upstream_401_is_one_line_and_the_proxy_stays_up(
    proxy: Any, guarded_upstream: str, stderr_logs: list[Path]
) -> None:
    """No credentials: the host's initialize fails with a JSON-RPC error; one stderr line."""
    async with proxy(
        f"--upstream-url={guarded_upstream}", upstream=[], initialize=False
    ) as session:
        with pytest.raises(MCPError):
            await session.initialize()
        # The proxy still answers what it answers itself.
        with pytest.raises(MCPError) as refused:
            await session.send_ping()
        assert refused.value.error.code != 0
    # One line by event name: a bare "401" could match a timestamp's digits as well.
    events = [json.loads(line) for line in stderr_logs[-1].read_text().splitlines()]
    [refused_line] = [event for event in events if event["event"] == "upstream_refused"]
    assert "HTTP 401" in refused_line["reason"]
    assert "--bearer-token-env" in refused_line["reason"]


async def test_the_embedded_store_lives_in_the_users_data_folder(
    proxy: Any, tmp_path: Path, stderr_logs: list[Path]
) -> None:
    """No Redis configured, started from anywhere: the data folder is absolute, under XDG."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    xdg = tmp_path / "xdg"
    async with proxy(embedded=True, cwd=elsewhere, env={"XDG_DATA_HOME": str(xdg)}) as session:
        result = await session.call_tool("ping")
        assert not result.is_error
    assert (xdg / "canon" / "data").is_dir()
    assert not (elsewhere / ".canon").exists()
    [line] = [
        line
        for line in stderr_logs[-1].read_text().splitlines()
        if "embedded_redis_started" in line
    ]
    assert str(xdg / "canon" / "data") in line


async def test_over_http_an_upstream_that_cannot_start_fails_its_session_only(
    spawn: Any, redis_url: str, namespace: str
) -> None:
    """``--http`` with a missing command: each initialize gets a JSON-RPC error, one line each."""
    port = free_port()
    spawn(proxy_argv(redis_url, namespace, "--http", f"--port={port}", upstream=["/no/such/mcp"]))
    url = f"http://127.0.0.1:{port}/mcp"
    await wait_for(lambda: answering(url), timeout_s=30)
    refused: list[BaseException] = []
    for _ in range(2):
        try:
            async with (
                streamable_http_client(url) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
        except* MCPError as errors:
            refused.append(errors)
    assert len(refused) == 2
    assert repr(refused).count("the upstream MCP server could not be started") == 2


def test_without_an_upstream_the_proxy_exits_2_with_one_line(redis_url: str) -> None:
    """No command and no URL: a usage error on one stderr line, nothing on stdout."""
    done = subprocess.run(
        [sys.executable, "-m", "canon.cli", "mcp-proxy", f"--redis-url={redis_url}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("canon: error:")
