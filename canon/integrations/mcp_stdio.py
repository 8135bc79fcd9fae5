"""The host side of ``canon mcp-proxy`` on stdio: JSON-RPC lines, parsed by the relay's rules.

While :class:`HostStdio` is open, file descriptor 1 points at standard error and the
protocol writes to a private copy of the original standard output, so no library, log or
child process can put a stray byte into the protocol stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from canon.integrations.mcp_relay import INVALID_REQUEST, PARSE_ERROR, error_response
from canon.integrations.mcp_upstream import Message, read_lines


class HostStdio:
    """The host's stdin and stdout as a stream of JSON-RPC messages."""

    def __init__(self, *, max_line_bytes: int) -> None:
        """Prepare to serve; lines longer than ``max_line_bytes`` are refused unread."""
        self.max_line_bytes = max_line_bytes
        self._out_fd = -1
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> HostStdio:
        """Take standard output for the protocol and open both pipes."""
        self._out_fd = os.dup(1)
        os.dup2(2, 1)
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(self._out_fd, "wb", buffering=0)
        )
        self._writer = asyncio.StreamWriter(transport, protocol, None, loop)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the protocol's output."""
        if self._writer is not None:
            with contextlib.suppress(OSError, RuntimeError):
                self._writer.close()
            self._writer = None

    async def send(self, message: Message, related: Any = None) -> None:
        """Write one message as one line (a vanished host is not an error).

        ``related`` (the host request a message belongs to) means nothing on stdio.
        """
        if self._writer is None:
            return
        data = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        async with self._lock:
            try:
                self._writer.write(data)
                await self._writer.drain()
            except (ConnectionError, OSError, RuntimeError):
                self._writer = None

    async def serve(self, handle: Callable[[Any], Awaitable[None]]) -> None:
        """Read the host's lines until end of file, handing each decoded message over.

        A line that is not JSON is answered -32700; an overlong one, -32600 naming the
        limit; a batch (JSON array), -32600: MCP has no batches.
        """
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=self.max_line_bytes + 1)
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(os.dup(0), "rb", buffering=0)
        )
        async for line in read_lines(reader, self.max_line_bytes):
            if line is None:
                await self.send(
                    error_response(
                        None,
                        INVALID_REQUEST,
                        f"message over {self.max_line_bytes} bytes: raise --max-request-bytes",
                    )
                )
                continue
            try:
                message = json.loads(line)
            except ValueError:
                await self.send(error_response(None, PARSE_ERROR, "Parse error"))
                continue
            if isinstance(message, list):
                await self.send(error_response(None, INVALID_REQUEST, "Invalid Request: batch"))
                continue
            await handle(message)
