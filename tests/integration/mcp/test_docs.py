"""The MCP section of docs/integrations.md runs as written, against real subprocesses."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp_types import TextContent

from canon.integrations.mcp import call_tool
from eventstore import Store
from machine.codes import Status

ROOT = Path(__file__).parents[3]
DOC = ROOT / "docs" / "integrations.md"
UPSTREAM = f"{sys.executable} {ROOT / 'tests' / 'support' / 'mcp_upstream_server.py'}"


def mcp_blocks() -> list[str]:
    """The section's Python blocks, in order."""
    section = re.search(r"^## MCP\n(.*?)(?=^## |\Z)", DOC.read_text(), re.S | re.M)
    assert section is not None
    return re.findall(r"```python\n(.*?)```", section.group(1), re.S)


def test_the_section_has_the_proxy_loop_and_the_server() -> None:
    """Two blocks: the host's loop through the proxy, and serving ToolSpecs."""
    proxy_loop, server = mcp_blocks()
    assert "canon.integrations.mcp import call_tool" in proxy_loop
    assert "serve_tools(" in server


async def test_the_proxy_loop_runs_as_written(start_server: Any, tmp_path: Path) -> None:
    """The host's loop lists the upstream's tools and its call is recorded under its ids."""
    proxy_loop, _ = mcp_blocks()
    redis = start_server()
    environment = {
        **os.environ,
        "REDIS_URL": redis.url,
        "MCP_SERVER": UPSTREAM,
        # `canon` is the command the editable install put beside this interpreter.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", proxy_loop],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        env=environment,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["['lookup', 'fail', 'ping'] False answer to refunds"]
    async with Store.from_url(redis.url) as store:
        record = await store.get("run-42", "toolu_01A09q90qw90lq917835lq9")
    assert record is not None and record.state.status is Status.READY


async def test_the_served_tools_answer_an_mcp_client(start_server: Any, tmp_path: Path) -> None:
    """The server block is an MCP server on stdio: it lists the schema and answers bounded."""
    _, server_block = mcp_blocks()
    redis = start_server()
    script = tmp_path / "server.py"
    script.write_text(server_block)
    parameters = StdioServerParameters(
        command=sys.executable,
        args=[str(script)],
        env={**os.environ, "REDIS_URL": redis.url},
        cwd=str(tmp_path),
    )
    with (tmp_path / "server.stderr").open("w") as errlog:
        async with (
            stdio_client(parameters, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            [tool] = (await session.list_tools()).tools
            result = await call_tool(
                session,
                "search_docs",
                {"q": "refunds"},
                tool_call_id="call_9pw1qnYScqvGrCH58HWCvFH6",
            )
    assert tool.name == "search_docs" and tool.input_schema["required"] == ["q"]
    [block] = result.content
    assert isinstance(block, TextContent) and not result.is_error
    assert json.loads(block.text) == {"titles": ["Refund policy"]}
    async with Store.from_url(redis.url) as store:
        record = await store.get("run-7", "call_9pw1qnYScqvGrCH58HWCvFH6")
    assert record is not None and record.state.status is Status.READY
    assert "Refunds within 30 days" not in (tmp_path / "server.stderr").read_text()


def desktop_config() -> dict[str, Any]:
    """The Claude Desktop config of the proxy's section, as a user copies it."""
    section = DOC.read_text().split("**Desktop hosts.**", 1)[1]
    block = re.search(r"```json\n(.*?)```", section, re.S)
    assert block is not None
    return dict(json.loads(block.group(1)))


async def test_the_desktop_config_starts_a_recording_proxy(tmp_path: Path) -> None:
    """The config's command and arguments as written (only the canon path and the upstream
    after ``--`` swapped for this machine's): an MCP server on stdio that records a call in
    the embedded Redis under the user data folder."""
    [(name, server)] = desktop_config()["mcpServers"].items()
    args = list(server["args"])
    assert Path(server["command"]).name == "canon" and args[:2] == ["mcp-proxy", "--"]
    canon = str(Path(sys.executable).parent / "canon")
    upstream = UPSTREAM.split()
    parameters = StdioServerParameters(
        command=canon,
        args=[*args[: args.index("--") + 1], *upstream],
        env={
            **{k: v for k, v in os.environ.items() if k != "REDIS_URL"},
            "XDG_DATA_HOME": str(tmp_path),
        },
        cwd="/",
    )
    with (tmp_path / "proxy.stderr").open("w") as errlog:
        async with (
            stdio_client(parameters, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            result = await session.call_tool("lookup", {"q": "notes"})
    assert name == "files" and not result.is_error
    [block] = result.content
    assert isinstance(block, TextContent) and block.text == "answer to notes"
    assert result.meta is not None and "io.canon/invocation_id" in result.meta
    assert (tmp_path / "canon" / "data" / "canon.lock").exists()
