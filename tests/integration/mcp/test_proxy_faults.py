"""``canon mcp-proxy`` against hostile upstreams: bad lines, deaths, signals, bad requests.

The host here speaks raw JSON-RPC lines to a real proxy process (so it can send what no
SDK client sends, and signal the proxy), and the upstream is a small server written below,
a real child process of the proxy that misbehaves on demand.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from eventstore import Store
from machine.codes import ErrorCode, Status
from tests.support.log_scan import LOG_FORBIDDEN
from tests.support.mcp_raw_host import Host
from tests.support.waiting import wait_for

ROOT = Path(__file__).parents[3]
RUN = "run-faults"
PROTOCOL = "2025-06-18"

pytestmark = pytest.mark.timeout(90)

#: The hostile upstream: MODE PIDFILE. It writes its pid, then serves raw JSON-RPC lines:
#: tools ``echo`` (answers), ``bad`` (answers with a line that is not UTF-8), ``die``
#: (exits mid-call), ``hang`` (never answers) and ``repo/search`` (a name MCP forbids).
#: Modes: ``serve``; ``exit-now`` (exits before reading anything); ``silent`` (never
#: answers initialize); ``ignore-eof`` (keeps running when its stdin closes).
HOSTILE = r"""
import json, os, signal, sys
mode, pidfile = sys.argv[1], sys.argv[2]
with open(pidfile, "a") as out:
    out.write(f"{os.getpid()}\n")
if mode == "exit-now":
    sys.exit(3)
if mode == "ignore-eof":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
stdout = sys.stdout.buffer

def send(message):
    stdout.write(json.dumps(message).encode() + b"\n")
    stdout.flush()

TOOLS = [{"name": name, "inputSchema": {"type": "object"}}
         for name in ("echo", "bad", "die", "hang", "repo/search")]
for line in sys.stdin.buffer:
    message = json.loads(line)
    method, request_id = message.get("method"), message.get("id")
    with open(pidfile + ".methods", "a") as out:
        out.write(f"{os.getpid()} {method}\n")
    if method is None or "id" not in message:
        continue
    if method == "initialize":
        if mode == "silent":
            continue
        send({"jsonrpc": "2.0", "id": request_id, "result": {
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {"listChanged": True}},
            "serverInfo": {"name": "hostile", "version": "9.9"},
            "instructions": "use echo"}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": request_id, "result": {"tools": TOOLS}})
    elif method in ("logging/setLevel", "resources/subscribe"):
        send({"jsonrpc": "2.0", "id": request_id, "result": {}})
    elif method == "tools/call":
        name = message["params"]["name"]
        if name == "echo":
            text = json.dumps(message["params"].get("arguments"))
            send({"jsonrpc": "2.0", "id": request_id,
                  "result": {"content": [{"type": "text", "text": text}]}})
        elif name == "bad":
            stdout.write(b'{"jsonrpc":"2.0","id":' + json.dumps(request_id).encode()
                         + b',"result":{"content":[{"type":"text","text":"\xff\xfe"}]}}\n')
            stdout.flush()
        elif name == "die":
            os._exit(5)
    else:
        send({"jsonrpc": "2.0", "id": request_id,
              "error": {"code": -32601, "message": "Method not found"}})
if mode == "ignore-eof":
    while True:
        signal.pause()
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def pids_in(pidfile: Path) -> list[int]:
    return [int(line) for line in pidfile.read_text().split()] if pidfile.exists() else []


@pytest.fixture
def pidfile(tmp_path: Path) -> Path:
    return tmp_path / "upstream.pids"


@pytest.fixture
async def launch(
    redis_url: str, namespace: str, tmp_path: Path, pidfile: Path
) -> AsyncIterator[Any]:
    """Starts proxies in front of the hostile upstream; stops them and every upstream pid."""
    script = tmp_path / "hostile.py"
    script.write_text(HOSTILE)
    processes: list[asyncio.subprocess.Process] = []
    pumps: list[asyncio.Task[None]] = []

    @asynccontextmanager
    async def start(
        *options: str, mode: str = "serve", upstream: list[str] | None = None
    ) -> AsyncIterator[Host]:
        stderr = tmp_path / f"proxy-{len(processes)}.stderr"
        command = upstream if upstream is not None else [sys.executable, str(script), mode]
        if upstream is None:
            command.append(str(pidfile))
        with stderr.open("wb") as errors:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "canon.cli",
                "mcp-proxy",
                f"--redis-url={redis_url}",
                f"--namespace={namespace}",
                *options,
                "--",
                *command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=errors,
                cwd=ROOT,
                limit=1 << 24,
            )
        processes.append(process)
        host = Host(process, stderr)
        pumps.append(asyncio.create_task(host.pump()))
        yield host

    yield start
    for task in pumps:
        task.cancel()
    for process in processes:
        if process.returncode is None:
            process.kill()
        await process.wait()
    for pid in pids_in(pidfile):
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    await asyncio.to_thread(assert_clean_logs, tmp_path)


def assert_clean_logs(folder: Path) -> None:
    """No proxy's stderr holds a payload marker, a token or a trace."""
    for log in folder.glob("proxy-*.stderr"):
        text = log.read_text(errors="replace")
        assert not [f for f in (*LOG_FORBIDDEN, "Traceback") if f in text], text[-2000:]


def call(request_id: Any, tool: str, tool_call_id: str | None = None, **arguments: Any) -> Any:
    params: dict[str, Any] = {"name": tool, "arguments": arguments}
    if tool_call_id is not None:
        params["_meta"] = {"io.canon/tool_call_id": tool_call_id, "io.canon/run_id": RUN}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


async def test_a_bad_upstream_line_fails_its_call_once_and_the_proxy_goes_on(
    launch: Any, make_store: Any
) -> None:
    """Invalid UTF-8 from the upstream: one warning, a JSON-RPC error, a Failed record."""
    store: Store = make_store()
    async with launch() as host:
        await host.initialize()
        for request_id in (1, 2):
            await host.send(call(request_id, "bad", f"call_bad{request_id}"))
            answer = await host.answer(request_id)
            assert answer["error"]["code"] == -32603
            record = await store.get(RUN, f"call_bad{request_id}")
            assert record is not None and record.state.status is Status.ERROR
        await host.send(call(3, "echo", "call_echo", q="fine"))
        assert (await host.answer(3))["result"]["content"][0]["text"] == '{"q": "fine"}'
    assert host.log().count("upstream_bad_message") == 1


async def test_a_dead_upstream_is_restarted_and_calls_meanwhile_get_an_error(
    launch: Any, make_store: Any, pidfile: Path
) -> None:
    """The call the upstream died in fails (record closed); a later call reaches a new child."""
    store: Store = make_store()
    async with launch() as host:
        await host.initialize()
        await host.send(call(1, "die", "call_die"))
        answer = await host.answer(1)
        assert answer["error"]["code"] == -32001
        record = await store.get(RUN, "call_die")
        assert record is not None and record.state.status is Status.ERROR
        await wait_for(lambda: len(pids_in(pidfile)) == 2, timeout_s=30)

        async def echoed() -> bool:
            request_id = f"echo-{time.monotonic_ns()}"
            answer = await host.request(request_id, "tools/call", call(0, "echo")["params"])
            return "result" in answer

        await wait_for(echoed, timeout_s=30)
    [line] = [line for line in host.log().splitlines() if "upstream_ended" in line]
    assert "status 5" in line


async def test_sigterm_closes_in_flight_records_and_stops_the_child(
    launch: Any, make_store: Any, pidfile: Path
) -> None:
    """A call waiting on the upstream ends Failed (CALLER_CANCELLED); no child survives."""
    store: Store = make_store()
    async with launch(mode="ignore-eof") as host:
        await host.initialize()
        await host.send(call(1, "hang", "call_hang"))

        async def projecting() -> bool:
            record = await store.get(RUN, "call_hang")
            return record is not None

        await wait_for(projecting, timeout_s=30)
        host.process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(host.process.wait(), 30) == 0
    record = await store.get(RUN, "call_hang")
    assert record is not None and record.state.status is Status.ERROR
    assert record.state.error_code is ErrorCode.CALLER_CANCELLED
    [pid] = pids_in(pidfile)
    await wait_for(lambda: not alive(pid), timeout_s=30)


async def test_the_child_dies_with_a_sigkilled_proxy(launch: Any, pidfile: Path) -> None:
    """SIGKILL gives the proxy no chance to clean up; the kernel stops the child anyway."""
    async with launch(mode="ignore-eof") as host:
        await host.initialize()
        [pid] = pids_in(pidfile)
        host.process.kill()
        await host.process.wait()
    await wait_for(lambda: not alive(pid), timeout_s=30)


@pytest.mark.parametrize(
    ("mode", "options", "said"),
    [
        ("missing", (), "cannot start the upstream"),
        ("exit-now", (), "exited with status 3 before answering initialize"),
        ("silent", ("--start-timeout-s=1",), "did not answer initialize within 1 s"),
    ],
)
async def test_an_upstream_that_cannot_start_is_one_line_and_exit_4(
    launch: Any, mode: str, options: tuple[str, ...], said: str
) -> None:
    """A missing command, an upstream that exits at once or never answers: exit 4, one line."""
    upstream = [str(ROOT / "no-such-mcp-server")] if mode == "missing" else None
    async with launch(*options, mode=mode, upstream=upstream) as host:
        with suppress(ConnectionError):
            await host.send(
                {
                    "jsonrpc": "2.0",
                    "id": 0,
                    "method": "initialize",
                    "params": {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {}},
                }
            )
        assert await asyncio.wait_for(host.process.wait(), 30) == 4
    [line] = host.log().splitlines()[-1:]
    assert line.startswith("canon: error:") and said in line, host.log()
    assert "Traceback" not in host.log()


async def test_json_rpc_ids_keep_their_type_and_bad_shapes_get_standard_errors(
    launch: Any, make_store: Any
) -> None:
    """502 and "502" are two calls; not JSON, not a request, bad params: -32700/-32600/-32602."""
    store: Store = make_store()
    async with launch(f"--run-id={RUN}") as host:
        await host.initialize()
        await host.send(call(502, "echo", None, n=1))
        await host.send(call("502", "echo", None, s="1"))
        number, text = await host.answer(502), await host.answer("502")
        assert number["id"] == 502 and text["id"] == "502"
        ids = {number["result"]["_meta"]["io.canon/tool_call_id"]}
        ids.add(text["result"]["_meta"]["io.canon/tool_call_id"])
        assert len(ids) == 2
        for tool_call_id in ids:
            assert await store.get(RUN, tool_call_id) is not None

        await host.write(b"{not json\n")
        assert (await host.answer(None))["error"]["code"] == -32700
        await host.send({"jsonrpc": "2.0", "id": 7})
        assert (await host.answer(7))["error"]["code"] == -32600
        await host.send({"jsonrpc": "2.0", "id": [1], "method": "ping"})
        assert (await host.answer(None))["error"]["code"] == -32600
        await host.send({"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": [1]})
        assert (await host.answer(8))["error"]["code"] == -32602
        await host.send({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {}})
        assert (await host.answer(9))["error"]["code"] == -32602
        answer = await host.request(10, "no/such/method", {})
        assert answer["error"]["code"] == -32601


async def test_a_desktop_run_lasts_one_retention_and_bad_tool_names_are_skipped(
    launch: Any, make_store: Any
) -> None:
    """No --run-id: one run for the process, taking calls for one retention (--ttl-s, its
    entry expiring with its last record, never years later); ``repo/search`` skipped."""
    store: Store = make_store()
    async with launch() as host:
        initialized = await host.initialize()
        assert initialized["result"]["serverInfo"] == {"name": "hostile", "version": "9.9"}
        assert initialized["result"]["instructions"] == "use echo"
        assert initialized["result"]["capabilities"]["tools"] == {"listChanged": True}
        assert initialized["result"]["_meta"]["io.canon/proxy"]["name"] == "canon-mcp-proxy"
        for request_id in (1, 2):
            listed = await host.request(request_id, "tools/list")
            names = [tool["name"] for tool in listed["result"]["tools"]]
            assert names == ["echo", "bad", "die", "hang"]
        first = await host.request(3, "tools/call", {"name": "echo", "arguments": {}})
        second = await host.request(4, "tools/call", {"name": "echo", "arguments": {}})
        run_id = first["result"]["_meta"]["io.canon/run_id"]
        assert second["result"]["_meta"]["io.canon/run_id"] == run_id
        info = await store.run_info(run_id)
        assert info is not None
        day_ms = 86_400_000
        assert time.time() * 1000 < info.deadline_ms <= time.time() * 1000 + day_ms
        assert info.expires_at_ms == info.deadline_ms + day_ms
    [warning] = [line for line in host.log().splitlines() if "mcp_tool_skipped" in line]
    assert "repo/search" in warning


async def test_a_call_over_the_tool_timeout_fails_and_the_proxy_goes_on(
    launch: Any, make_store: Any
) -> None:
    """``--tool-timeout-s``: a hung upstream call ends Failed; the next call is answered."""
    store: Store = make_store()
    async with launch("--tool-timeout-s=0.5") as host:
        await host.initialize()
        await host.send(call(1, "hang", "call_slow"))
        answer = await host.answer(1)
        assert answer["result"]["isError"] is True
        assert (
            json.loads(answer["result"]["content"][0]["text"])["error_code"] == "EXECUTION_FAILED"
        )
        record = await store.get(RUN, "call_slow")
        assert record is not None and record.state.status is Status.ERROR
        await host.send(call(2, "echo", "call_after"))
        assert "result" in await host.answer(2)


async def test_a_host_cancellation_closes_the_record_and_reaches_the_upstream(
    launch: Any, make_store: Any
) -> None:
    """``notifications/cancelled`` for a running call: CALLER_CANCELLED, no answer sent."""
    store: Store = make_store()
    async with launch() as host:
        await host.initialize()
        await host.send(call(1, "hang", "call_cancelled"))

        async def created() -> bool:
            return await store.get(RUN, "call_cancelled") is not None

        await wait_for(created, timeout_s=30)
        await host.send(
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}
        )

        async def closed() -> bool:
            record = await store.get(RUN, "call_cancelled")
            return record is not None and record.state.status is Status.ERROR

        await wait_for(closed, timeout_s=30)
        record = await store.get(RUN, "call_cancelled")
        assert record is not None and record.state.error_code is ErrorCode.CALLER_CANCELLED
        # The proxy still answers, and never answered the cancelled request.
        assert "result" in await host.request(2, "tools/call", call(0, "echo")["params"])
        assert (int, 1) not in host.answers


async def test_a_restarted_upstream_gets_the_hosts_session_state_again(
    launch: Any, pidfile: Path
) -> None:
    """Re-initialized with the host's initialize, then its log level and subscriptions."""
    methods = Path(f"{pidfile}.methods")
    async with launch() as host:
        await host.initialize()
        assert "result" in await host.request(1, "logging/setLevel", {"level": "debug"})
        assert "result" in await host.request(2, "resources/subscribe", {"uri": "test://a"})
        await host.send(call(3, "die", "call_die"))
        await host.answer(3)
        await wait_for(lambda: len(pids_in(pidfile)) == 2, timeout_s=30)
        first, second = pids_in(pidfile)

        def restored() -> bool:
            seen = [line.split(" ", 1) for line in methods.read_text().splitlines()]
            return [method for pid, method in seen if int(pid) == second] == [
                "initialize",
                "notifications/initialized",
                "logging/setLevel",
                "resources/subscribe",
            ]

        await wait_for(restored, timeout_s=30)
        assert first != second
