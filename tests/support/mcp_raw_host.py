"""A raw JSON-RPC host on a ``canon mcp-proxy`` process's stdin and stdout.

It can send what no SDK client sends (bad JSON, odd ids, huge or deeply nested lines) and
collects every answer by its id, so a test asks for the answer of one request.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from tests.support.waiting import wait_for

ROOT = Path(__file__).parents[2]
#: The protocol version the raw host's ``initialize`` asks for.
LEGACY = "2025-06-18"


async def start_proxy(
    redis_url: str, namespace: str, stderr: Path, options: list[str], upstream: list[str]
) -> asyncio.subprocess.Process:
    """``canon mcp-proxy`` on pipes, its standard error in ``stderr``."""
    with stderr.open("wb") as errors:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "canon.cli",
            "mcp-proxy",
            f"--redis-url={redis_url}",
            f"--namespace={namespace}",
            *options,
            "--",
            *upstream,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=errors,
            cwd=ROOT,
            limit=1 << 26,
        )


class Host:
    """A raw JSON-RPC host on a proxy process's stdin and stdout."""

    def __init__(self, process: asyncio.subprocess.Process, stderr: Path) -> None:
        self.process = process
        self.stderr = stderr
        self.answers: dict[tuple[type, Any], dict[str, Any]] = {}
        self.others: list[dict[str, Any]] = []

    async def write(self, data: bytes) -> None:
        """Write raw bytes to the proxy's stdin."""
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        await self.process.stdin.drain()

    async def send(self, message: Any) -> None:
        """Write one message as one line."""
        await self.write(json.dumps(message).encode() + b"\n")

    async def pump(self) -> None:
        """Read the proxy's lines: answers by id, everything else in :attr:`others`."""
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            message = json.loads(line)
            request_id = message.get("id")
            if ("method" not in message and request_id is not None) or "error" in message:
                self.answers[(type(request_id), request_id)] = message
            else:
                self.others.append(message)

    async def answer(self, request_id: Any, timeout_s: float = 30) -> dict[str, Any]:
        """The answer to ``request_id`` (type and value), once it came."""
        key = (type(request_id), request_id)
        await wait_for(lambda: key in self.answers, timeout_s=timeout_s)
        return self.answers.pop(key)

    async def request(self, request_id: Any, method: str, params: Any = None) -> dict[str, Any]:
        """Send one request and wait for its answer."""
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)
        return await self.answer(request_id)

    async def initialize(self, protocol: str = LEGACY) -> dict[str, Any]:
        """The 2025-era handshake: ``initialize``, then ``notifications/initialized``."""
        params = {
            "protocolVersion": protocol,
            "capabilities": {"roots": {}},
            "clientInfo": {"name": "raw-host", "version": "1"},
        }
        answer = await self.request(0, "initialize", params)
        await self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return answer

    def log(self) -> str:
        """The proxy's standard error so far."""
        return self.stderr.read_text(errors="replace")
