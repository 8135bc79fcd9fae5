"""The host side of ``canon mcp-proxy`` on stdio: JSON-RPC lines, parsed by the relay's rules.

While :class:`HostStdio` is open, file descriptor 1 points at standard error and the
protocol writes to a private copy of the original standard output, so no library, log or
child process can put a stray byte into the protocol stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from canon.mcp_proxy.messages import (
    INVALID_REQUEST,
    FrameRefused,
    Message,
    decode_frame,
    encode,
    error_response,
    salvage_id,
)
from canon.mcp_proxy.upstream import Overlong, read_lines


class HostStdio:
    """The host's stdin and stdout as a stream of JSON-RPC messages."""

    def __init__(self, *, max_line_bytes: int, max_depth: int = 64) -> None:
        """Prepare to serve; longer or deeper lines are refused unparsed."""
        self.max_line_bytes = max_line_bytes
        self.max_depth = max_depth
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
        data = encode(message)
        async with self._lock:
            try:
                self._writer.write(data)
                await self._writer.drain()
            except (ConnectionError, OSError, RuntimeError):
                self._writer = None

    async def serve(self, handle: Callable[[Any], Awaitable[None]]) -> None:
        """Read the host's lines until end of file, handing each decoded message over.

        Each line is checked before it is parsed (:func:`~canon.mcp_proxy.messages.
        decode_frame`): over ``max_line_bytes``, -32600 naming ``--max-request-bytes``;
        nested deeper than ``max_depth``, -32600 naming ``--max-json-depth``; not UTF-8
        JSON, -32700; a batch (JSON array), -32600 (MCP has no batches). Each answer
        carries the request's id when it could be read.
        """
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=self.max_line_bytes + 1)
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(os.dup(0), "rb", buffering=0)
        )
        async for line in read_lines(reader, self.max_line_bytes):
            if isinstance(line, Overlong):
                said = f"message over {self.max_line_bytes} bytes: raise --max-request-bytes"
                await self.send(error_response(salvage_id(line.prefix), INVALID_REQUEST, said))
                continue
            try:
                message = decode_frame(
                    line, max_depth=self.max_depth, depth_flag="--max-json-depth"
                )
            except FrameRefused as refused:
                await self.send(error_response(refused.request_id, refused.code, refused.message))
                continue
            if isinstance(message, list):
                await self.send(
                    error_response(
                        None, INVALID_REQUEST, "Invalid Request: a batch (MCP has no batches)"
                    )
                )
                continue
            await handle(message)
