"""canon inside someone else's process: quiet by default, standard when configured.

Each application runs as its own Python process (tests/support/logging_app.py and
tests/support/stdio_tool_server.py), so what it sees is what a real embedding sees: no
test-session logging setup, real standard output and standard error.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import sys
from typing import Any

import msgspec

ROOT = pathlib.Path(__file__).parents[3]
#: A server that draws both kinds of warning: no append-only file, costlier streams.
RISKY = {"appendonly": False, "extra_args": ["--stream-node-max-bytes", "8192"]}


async def run_child(module: str, *args: str, stdin: bytes = b"") -> tuple[str, str]:
    """Run ``python -m module args`` to its end (bounded); return its stdout and stderr."""
    path = os.environ.get("PYTHONPATH", "")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *args,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), path]))},
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(stdin), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, stderr.decode()[-2000:]
    return stdout.decode(), stderr.decode()


async def run_app(mode: str, url: str, namespace: str) -> tuple[dict[str, Any], str]:
    """Run the embedding application; return its one stdout report and its stderr."""
    stdout, stderr = await run_child("tests.support.logging_app", mode, url, namespace)
    [line] = stdout.splitlines()
    return msgspec.json.decode(line), stderr


async def test_an_application_that_configured_nothing_sees_warnings_only_on_stderr(
    start_server: Any, namespace: str
) -> None:
    """Nothing but the application's own line on stdout; on stderr only the two settings
    warnings, each once although the process opened the store three times."""
    server = start_server(**RISKY)
    report, stderr = await run_app("none", server.url, namespace)
    assert report == {"status": "ToolResult", "records": []}
    lines = stderr.splitlines()
    assert [line.split()[0] for line in lines] == [
        "durability_warning",
        "server_setting_warning",
    ], stderr
    assert "risks=['appendonly=no']" in lines[0]


async def test_a_stdlib_configured_application_gets_every_event_with_its_fields(
    start_server: Any, namespace: str
) -> None:
    """With logging.basicConfig at DEBUG, canon's events are records of canon.* loggers:
    the message names the event and its fields, and each field is a record attribute."""
    server = start_server(**RISKY)
    report, stderr = await run_app("stdlib", server.url, namespace)
    assert stderr == ""
    # The root logger at DEBUG also gets asyncio's and redis-py's own records.
    records = [record for record in report["records"] if record["logger"].startswith("canon")]
    assert {record["logger"] for record in records} == {"canon.durability", "canon.boundary"}
    events = [(record["level"], record["fields"]["event"]) for record in records]
    assert events == [
        ("WARNING", "durability_warning"),
        ("WARNING", "server_setting_warning"),
        ("DEBUG", "event_committed"),
        ("DEBUG", "event_committed"),
        ("DEBUG", "event_committed"),
        ("INFO", "invocation_finished"),
    ]
    # Each record names the library module that logged it, not the logging machinery.
    assert [record["file"] for record in records[:3]] == [
        "durability.py",
        "durability.py",
        "call_trace.py",  # the boundary's per-call log lines (logger canon.boundary)
    ]
    assert records[0]["fields"]["risks"] == ["appendonly=no"]
    assert [record["fields"]["version"] for record in records[2:]] == [1, 2, 3, 3]
    finished = records[-1]
    assert finished["fields"] == {
        "event": "invocation_finished",
        "run_id": "run-1",
        "tool_call_id": "call-1",
        "status": "READY",
        "version": 3,
        "error_code": None,
    }
    assert finished["message"].startswith("invocation_finished run_id=run-1 tool_call_id=call-1")


async def test_a_structlog_configured_application_gets_events_in_its_own_format(
    start_server: Any, namespace: str
) -> None:
    """An application that configured structlog (JSON lines on stderr) gets canon's events
    through its own chain, fields included; stdout stays its own."""
    server = start_server(**RISKY)
    report, stderr = await run_app("structlog", server.url, namespace)
    assert report == {"status": "ToolResult", "records": []}
    entries = [msgspec.json.decode(line) for line in stderr.splitlines()]
    names = [entry["event"] for entry in entries]
    assert names.count("durability_warning") == 1 and names.count("event_committed") == 3
    [finished] = [entry for entry in entries if entry["event"] == "invocation_finished"]
    assert finished["level"] == "info"
    assert (finished["run_id"], finished["status"], finished["version"]) == ("run-1", "READY", 3)


async def test_a_stdio_tool_server_writes_nothing_but_its_protocol(
    start_server: Any, namespace: str
) -> None:
    """An MCP-style stdio server that configured no logging: every stdout line is one of
    its own responses, in order; canon's warnings went to stderr."""
    server = start_server(**RISKY)
    requests = b"".join(
        msgspec.json.encode({"id": n, "tool_call_id": f"call-{n}", "arguments": {"q": f"q{n}"}})
        + b"\n"
        for n in range(5)
    )
    stdout, stderr = await run_child(
        "tests.support.stdio_tool_server", server.url, namespace, stdin=requests
    )
    responses = [msgspec.json.decode(line) for line in stdout.splitlines()]
    assert responses == [{"id": n, "status": "READY", "result": f"q{n}"} for n in range(5)]
    assert "durability_warning" in stderr


async def test_an_embedded_worker_logging_an_outage_writes_nothing_to_stdout() -> None:
    """A receipt worker inside an application that configured no logging loses its Redis:
    its outage warning reaches standard error (the stdlib's last resort), and standard
    output, the application's own, gets nothing."""
    stdout, stderr = await run_child("tests.support.outage_app")
    assert stdout == ""
    assert "worker_read_failed" in stderr
