"""``canon mcp-proxy`` fails closed and no message stops it: hostile hosts and upstreams.

A raw JSON-RPC host (tests/support/mcp_raw_host.py) speaks to a real proxy process whose
upstream is tests/support/mcp_hostile_upstream.py, which records every ``tools/call`` it
runs, so a test sees what reached it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from eventstore import Store
from machine.codes import ErrorCode, Status
from tests.support.log_scan import LOG_FORBIDDEN
from tests.support.mcp_raw_host import ROOT, Host, start_proxy
from tests.support.waiting import wait_for

RUN = "run-hostile"
MODERN = "2026-07-28"
HOSTILE = [sys.executable, str(ROOT / "tests" / "support" / "mcp_hostile_upstream.py")]
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
    "io.modelcontextprotocol/clientInfo": {"name": "raw-host", "version": "1"},
}

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def launch(redis_url: str, namespace: str, tmp_path: Path) -> AsyncIterator[Any]:
    """Starts proxies in front of the hostile upstream; kills each by its pid at the end."""
    processes: list[asyncio.subprocess.Process] = []
    pumps: list[asyncio.Task[None]] = []

    @asynccontextmanager
    async def start(*options: str, lists: str = "ok") -> AsyncIterator[tuple[Host, Path]]:
        ran = tmp_path / f"ran-{len(processes)}.txt"
        ran.touch()
        stderr = tmp_path / f"proxy-{len(processes)}.stderr"
        process = await start_proxy(
            redis_url, namespace, stderr, list(options), [*HOSTILE, lists, str(ran)]
        )
        processes.append(process)
        host = Host(process, stderr)
        pumps.append(asyncio.create_task(host.pump()))
        yield host, ran

    yield start
    for task in pumps:
        task.cancel()
    for process in processes:
        if process.returncode is None:
            process.kill()
        await process.wait()
    await asyncio.to_thread(assert_clean_logs, tmp_path)


def assert_clean_logs(folder: Path) -> None:
    """No proxy's stderr holds a payload marker, a token or a trace."""
    for log in folder.glob("proxy-*.stderr"):
        text = log.read_text(errors="replace")
        assert not [f for f in (*LOG_FORBIDDEN, "Traceback") if f in text], text[-2000:]


NO_ID = object()


def call(
    request_id: Any, tool: str, call_id: Any = NO_ID, modern: bool = False, **args: Any
) -> Any:
    params: dict[str, Any] = {"name": tool, "arguments": args}
    meta: dict[str, Any] = dict(ENVELOPE) if modern else {}
    if call_id is not NO_ID:
        meta.update({"io.canon/tool_call_id": call_id, "io.canon/run_id": RUN})
    if meta:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def payload(answer: dict[str, Any]) -> dict[str, Any]:
    """The safe error JSON of an ``isError`` result."""
    assert answer["result"]["isError"] is True, answer
    return dict(json.loads(answer["result"]["content"][0]["text"]))


async def test_a_modern_host_calling_before_listing_gets_its_destructive_tool_governed(
    launch: Any, make_store: Any
) -> None:
    """2026-07-28: the proxy's own tools/list carries the host's _meta; destroy waits, unrun."""
    store: Store = make_store()
    async with launch(f"--run-id={RUN}", "--govern=annotations", lists="needs-meta") as (
        host,
        ran,
    ):
        await host.send(call(1, "destroy", "c-destroy", modern=True, everything=True))
        answer = await host.answer(1)
        result = answer["result"]
        assert result["isError"] is False and result["resultType"] == "complete"
        assert "io.canon/approval_id" in result["_meta"]
        await host.send(call(2, "read", "c-read", modern=True))
        assert (await host.answer(2))["result"]["resultType"] == "complete"
    assert ran.read_text().splitlines() == ["read {}"]
    record = await store.get(RUN, "c-destroy")
    assert record is not None and record.state.status is Status.PROJECTING


@pytest.mark.parametrize("lists", ["fail", "hides-destroy"])
async def test_a_tool_the_proxy_cannot_record_never_reaches_the_upstream(
    launch: Any, make_store: Any, lists: str
) -> None:
    """A failing tools/list, or a tool it does not list: an MCP error result, a refusal."""
    store: Store = make_store()
    async with launch(f"--run-id={RUN}", "--govern=annotations", lists=lists) as (host, ran):
        await host.initialize()
        await host.send(call(1, "destroy", "c-destroy", everything=True))
        refused = payload(await host.answer(1))
        assert refused["error_code"] == "UNKNOWN_TOOL"
        said = "could not be read" if lists == "fail" else "does not list"
        assert said in refused["reason"] and "nothing was sent upstream" in refused["reason"]
    assert ran.read_text() == ""
    assert await store.get(RUN, "c-destroy") is None
    refusals = await store.refusals(RUN, limit=10)
    assert [(entry.tool, entry.code) for entry in refusals] == [("destroy", "UNKNOWN_TOOL")]


async def test_a_transient_list_failure_refuses_once_then_governs(
    launch: Any, make_store: Any
) -> None:
    """One failed tools/list refuses the call; the next call reads the list and waits."""
    async with launch(f"--run-id={RUN}", "--govern=annotations", lists="fail-first") as (
        host,
        ran,
    ):
        await host.initialize()
        await host.send(call(1, "destroy", "c1"))
        assert payload(await host.answer(1))["error_code"] == "UNKNOWN_TOOL"
        await host.send(call(2, "destroy", "c2"))
        assert (await host.answer(2))["result"]["isError"] is False
    assert ran.read_text() == ""


async def test_deep_huge_and_odd_frames_are_each_answered_and_the_proxy_goes_on(
    launch: Any,
) -> None:
    """5,000 levels, an 8 MB line, odd ids, a batch, bad JSON: each answered, none stops it."""
    limits = ("--max-request-bytes=1048576", "--max-raw-bytes=1048576")
    async with launch(f"--run-id={RUN}", *limits) as (host, _ran):
        await host.initialize()
        deep = "[" * 5000 + "]" * 5000
        await host.write(
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo",'
            b'"arguments":{"a":' + deep.encode() + b"}}}\n"
        )
        answer = await host.answer(1)
        assert (
            answer["error"]["code"] == -32600 and "--max-json-depth" in answer["error"]["message"]
        )
        huge = json.dumps(call(2, "echo", "c-huge", blob="x" * 8_000_000)).encode()
        await host.write(huge + b"\n")
        answer = await host.answer(2)
        assert answer["error"]["code"] == -32600
        assert "--max-request-bytes" in answer["error"]["message"]
        for odd in ({"a": 1}, None, 1.5, True):
            await host.send({"jsonrpc": "2.0", "id": odd, "method": "ping"})
            assert (await host.answer(None))["error"]["code"] == -32600
        await host.send([{"jsonrpc": "2.0", "id": 3, "method": "ping"}])
        assert (await host.answer(None))["error"]["code"] == -32600
        await host.write(b'{"jsonrpc":"2.0","id":4,"method":"ping",\xff}\n')
        assert (await host.answer(4))["error"]["code"] == -32700
        await host.send(
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99}}
        )
        await host.send(call(5, "echo", "c-after", n=1))
        assert (await host.answer(5))["result"]["content"][0]["text"] == '{"n": 1}'
        await host.send(
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5}}
        )
        await host.send(call(6, "echo", "c-after-2"))
        assert "result" in await host.answer(6)
    assert host.process.returncode is None


#: ``_meta`` call ids canon refuses: a control character, a newline, 600 bytes, empty, an
#: int, null, an object, a space, a lone surrogate.
BAD_CALL_IDS = ["\u0007", "a\nb", "x" * 600, "", 7, None, {"a": 1}, " ", "\ud800"]


async def test_every_unacceptable_call_id_is_answered_invalid_tool_call_id(launch: Any) -> None:
    """Each bad ``_meta`` call id gets an isError answer with INVALID_TOOL_CALL_ID, unrun."""
    async with launch(f"--run-id={RUN}") as (host, ran):
        await host.initialize()
        for request_id, call_id in enumerate(BAD_CALL_IDS, start=1):
            await host.send(call(request_id, "echo", call_id))
            answer = await host.answer(request_id)
            assert payload(answer)["error_code"] == "INVALID_TOOL_CALL_ID", call_id
        await host.send(call(100, "echo", "c-fine"))
        assert "result" in await host.answer(100)
    assert ran.read_text().splitlines() == ["echo {}"]


@pytest.mark.parametrize(
    ("options", "size"),
    [
        (["--max-raw-bytes=1048576"], 2_000_000),
        (["--max-raw-bytes=100000", "--max-request-bytes=100000"], 400_000),
    ],
    ids=["over-raw-limit", "over-line-bound"],
)
async def test_an_upstream_answer_over_a_limit_is_answered_and_recorded(
    launch: Any, make_store: Any, options: list[str], size: int
) -> None:
    """Over --max-raw-bytes (or the line bound it sets): an answer naming it, a Failed record."""
    store: Store = make_store()
    async with launch(f"--run-id={RUN}", *options) as (host, _ran):
        await host.initialize()
        await host.send(call(1, "big", "c-big", size=size))
        refused = payload(await host.answer(1))
        assert "--max-raw-bytes" in json.dumps(refused)
        await host.send(call(2, "echo", "c-next"))
        assert "result" in await host.answer(2)
    record = await store.get(RUN, "c-big")
    assert record is not None and record.state.status is Status.ERROR
    assert record.state.error_code.value == refused["error_code"]


async def test_a_hung_call_ends_at_the_tool_timeout_with_a_stable_code(
    launch: Any, make_store: Any
) -> None:
    """``--tool-timeout-s``: EXECUTION_FAILED naming the flag, the record closed."""
    store: Store = make_store()
    async with launch(f"--run-id={RUN}", "--tool-timeout-s=0.5") as (host, _ran):
        await host.initialize()
        await host.send(call(1, "hang", "c-hang"))
        refused = payload(await host.answer(1))
        assert refused["error_code"] == "EXECUTION_FAILED"
        assert "--tool-timeout-s" in refused["reason"]
    record = await store.get(RUN, "c-hang")
    assert record is not None and record.state.error_code is ErrorCode.EXECUTION_FAILED


async def test_the_upstreams_own_error_text_reaches_the_host_unless_hidden(launch: Any) -> None:
    """By default an isError result's text reaches the host; --hide-tool-errors hides it."""
    async with launch(f"--run-id={RUN}") as (host, _ran):
        await host.initialize()
        await host.send(call(1, "oops", "c-oops"))
        result = (await host.answer(1))["result"]
        assert result["isError"] is True
        assert result["content"][0]["text"] == "Invalid timezone: Mars/Olympus"
    async with launch(f"--run-id={RUN}", "--hide-tool-errors") as (host, _ran):
        await host.initialize()
        await host.send(call(1, "oops", "c-oops-hidden"))
        assert payload(await host.answer(1))["error_code"] == "EXECUTION_FAILED"


async def test_an_input_required_call_stays_open_and_is_recorded_when_it_completes(
    launch: Any, make_store: Any
) -> None:
    """InputRequiredResult reaches the host; its answer continues the same call upstream."""
    store: Store = make_store()
    async with launch(f"--run-id={RUN}") as (host, ran):
        await host.send(call(1, "ask", "c-ask", modern=True))
        first = (await host.answer(1))["result"]
        assert first["resultType"] == "input_required"
        assert first["inputRequests"]["city"]["method"] == "elicitation/create"
        state = first["requestState"]
        assert state != "round-1"
        record = await store.get(RUN, "c-ask")
        assert record is not None and record.state.status is Status.PROJECTING
        follow = call(2, "ask", "c-ask", modern=True)
        follow["params"]["requestState"] = state
        follow["params"]["inputResponses"] = {
            "city": {"action": "accept", "content": {"city": "Oslo"}}
        }
        await host.send(follow)
        final = (await host.answer(2))["result"]
        assert final["content"][0]["text"] == "weather in Oslo (state round-1)"
        assert final["resultType"] == "complete"
    record = await store.get(RUN, "c-ask")
    assert record is not None and record.state.status is Status.READY
    assert len(ran.read_text().splitlines()) == 2


async def test_a_reissued_call_attaches_to_the_first_and_the_tool_runs_once(
    launch: Any, make_store: Any
) -> None:
    """The same ``io.canon/tool_call_id`` sent again mid-call (a broken stream's re-issue):
    both requests get the one answer; the upstream ran the tool once."""
    store: Store = make_store()
    async with launch(f"--run-id={RUN}") as (host, ran):
        await host.send(call(1, "gate", "c-gate", modern=True))
        await wait_for(lambda: ran.read_text().startswith("gate"), timeout_s=30)
        await host.send(call(2, "gate", "c-gate", modern=True))
        await asyncio.to_thread(Path(f"{ran}.open").touch)
        first, second = await host.answer(1), await host.answer(2)
        later = await host.request(
            3, "tools/call", call(0, "gate", "c-gate", modern=True)["params"]
        )
    for answer in (first, second, later):
        assert answer["result"]["content"][0]["text"] == "opened"
    assert ran.read_text().splitlines() == ["gate {}"]
    record = await store.get(RUN, "c-gate")
    assert record is not None and record.state.status is Status.READY


async def test_a_second_proxy_on_the_same_data_folder_says_so_in_one_line(
    tmp_path: Path,
) -> None:
    """Two embedded-Redis proxies on one data folder: the second exits with one line."""
    data = tmp_path / "data"
    ran = tmp_path / "ran.txt"
    command = [
        sys.executable,
        "-m",
        "canon.cli",
        "mcp-proxy",
        f"--data-dir={data}",
        "--",
        *HOSTILE,
        "ok",
        str(ran),
    ]
    first = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        cwd=ROOT,
    )
    try:
        lock = data / "canon.lock"
        await wait_for(lambda: lock.exists() and lock.read_text().strip() != "", timeout_s=60)
        await wait_for(lambda: Path(f"{ran}.pids").exists(), timeout_s=60)
        second = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=ROOT,
        )
        out, err = await asyncio.wait_for(second.communicate(), 60)
        assert second.returncode == 2 and out == b""
        [line] = err.decode().splitlines()
        assert line.startswith("canon: error: the data folder")
        assert f"pid {first.pid}" in line and "--data-dir" in line
    finally:
        # Its host going away ends the proxy, which stops its embedded Redis and child.
        assert first.stdin is not None
        first.stdin.close()
        try:
            await asyncio.wait_for(first.wait(), 60)
        finally:
            if first.returncode is None:
                first.kill()
                await first.wait()


async def test_a_large_read_is_stored_once_at_most_1_3_times_its_size(
    launch: Any, make_store: Any, redis: Any
) -> None:
    """A 300 KB result: the host gets it whole; Redis holds the record in at most 1.3x."""
    store: Store = make_store()
    size = 300_000
    async with launch(f"--run-id={RUN}") as (host, _ran):
        await host.initialize()
        await host.send(call(1, "big", "c-read", size=size))
        result = (await host.answer(1))["result"]
        assert result["content"][0]["text"] == "x" * size
    key = store.keys.record(RUN, "c-read")
    used = await redis.memory_usage(key, samples=0)
    assert used is not None and used <= 1.3 * size, used
    record = await store.get(RUN, "c-read")
    assert record is not None and record.state.status is Status.READY
    assert record.result == record.raw


async def test_the_proxys_own_run_lasts_one_retention_then_rolls_over(
    launch: Any, make_store: Any
) -> None:
    """``--ttl-s=2``: the run takes calls for 2 s and its entry expires with its last
    record; a call after its deadline is recorded in the proxy's next run."""
    store: Store = make_store()
    async with launch("--ttl-s=2") as (host, _ran):
        await host.initialize()
        first = await host.request(1, "tools/call", {"name": "echo", "arguments": {}})
        run_id = first["result"]["_meta"]["io.canon/run_id"]
        info = await store.run_info(run_id)
        assert info is not None and info.expires_at_ms == info.deadline_ms + 2000
        await wait_for(lambda: time.time() * 1000 > info.deadline_ms + 50, timeout_s=10)
        second = await host.request(2, "tools/call", {"name": "echo", "arguments": {"n": 2}})
    meta = second["result"]["_meta"]
    assert meta["io.canon/run_id"] == f"{run_id}-2"
    record = await store.get(meta["io.canon/run_id"], meta["io.canon/tool_call_id"])
    assert record is not None and record.state.status is Status.READY


async def test_the_tasks_extension_passes_through(launch: Any, make_store: Any) -> None:
    """A tool that answers with a task (``resultType: "task"``): the host gets it as sent,
    the record keeps it, and ``tasks/get`` reaches the upstream and comes back."""
    store: Store = make_store()
    async with launch(f"--run-id={RUN}") as (host, _ran):
        await host.send(call(1, "job", "c-job", modern=True))
        created = (await host.answer(1))["result"]
        assert (created["resultType"], created["taskId"], created["status"]) == (
            "task",
            "task-1",
            "working",
        )
        polled = await host.request(2, "tasks/get", {"taskId": "task-1", "_meta": dict(ENVELOPE)})
        assert polled["result"]["status"] == "completed"
        assert polled["result"]["result"]["content"][0]["text"] == "job done"
    record = await store.get(RUN, "c-job")
    assert record is not None and record.state.status is Status.READY
    assert json.loads(record.raw or b"{}")["taskId"] == "task-1"
