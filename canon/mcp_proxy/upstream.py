"""The upstream MCP server of ``canon mcp-proxy``: a child on stdio, or a streamable-HTTP URL.

Both speak JSON-RPC messages as plain dicts, so the relay passes every message through
exactly as it came (:mod:`canon.mcp_proxy.relay`). The child:

* is started in its own process group, with the parent-death signal set on Linux, so it
  never outlives the proxy, even a proxy killed with SIGKILL; :meth:`ChildUpstream.stop`
  closes its stdin, then signals the whole group;
* is read line by line with a bound (a longer line is dropped, not buffered); a line
  that is not valid UTF-8 JSON is reported once to the relay and never wedges reading;
* inherits this process's environment without canon's own connection settings, and its
  standard error (where an MCP server writes its logs).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, NamedTuple, Protocol

from canon.mcp_proxy.messages import PROTOCOL_VERSION_KEY, encode, envelope_of
from canon.mcp_proxy.messages import salvage_id as leading_id
from eventstore.errors import CanonError
from eventstore.logs import get_logger

log = get_logger("canon.mcp_proxy")

#: Environment variables of canon's own connection, never handed to the upstream server.
PRIVATE_ENV_PREFIXES: Final = ("REDIS_", "CANON_")
#: Seconds a stopping child gets after its stdin closes, then after SIGTERM.
STOP_GRACE_S: Final = 2.0

Message = dict[str, Any]
#: Receives each message the upstream sends.
Deliver = Callable[[Message], Awaitable[None]]
#: Receives the id of a bad line's message when one could be read from it (else None),
#: and whether the line was over the size bound (else: not UTF-8 JSON).
BadLine = Callable[[Any, bool], Awaitable[None]]
#: Told once when the connection ends, with a short reason for the operator.
Ended = Callable[[str], Awaitable[None]]

_PR_SET_PDEATHSIG = 1
# Most tools whose header maps are kept.
_MAX_TOOLS = 10_000
# How much of an overlong line is kept (to read its JSON-RPC id).
_PREFIX_BYTES = 4096


class Upstream(Protocol):
    """An upstream connection as the relay drives it: a child, or a URL."""

    @property
    def running(self) -> bool:
        """Whether messages can be sent now."""

    @property
    def pid(self) -> int | None:
        """The child's process id (None for a URL)."""

    async def start(self, deliver: Deliver, bad_line: BadLine, ended: Ended) -> None:
        """Start (or restart) the connection and read it in the background."""

    async def send(self, message: Message) -> None:
        """Send one message; raise :class:`UpstreamGone` when it cannot."""

    async def stop(self) -> None:
        """Stop the connection (and its child)."""


class UpstreamError(CanonError):
    """Raised when the upstream server cannot be started or reached."""


class UpstreamGone(UpstreamError):
    """Raised when a message is sent to an upstream that is not running."""


def upstream_environment() -> dict[str, str]:
    """This process's environment without canon's connection settings (URLs, passwords)."""
    return {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(PRIVATE_ENV_PREFIXES)
    }


def _die_with_parent() -> None:  # pragma: no cover  (runs in the child, before exec)
    # Linux: the kernel sends SIGKILL to the child when the proxy dies, however it dies.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def decode_line(line: bytes) -> Message | None:
    """One JSON-RPC message of a line, or None when it is not UTF-8 JSON of an object."""
    try:
        message = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return message if isinstance(message, dict) else None


def salvage_id(line: bytes) -> Any:
    """The ``id`` of a bad line's message, when the line is JSON but for its encoding."""
    try:
        message = json.loads(line.decode("utf-8", errors="replace"))
    except ValueError:
        return None
    return message.get("id") if isinstance(message, dict) else None


class Overlong(NamedTuple):
    """A line longer than the bound, dropped unread but for its first bytes.

    Attributes:
        prefix: its first 4 KiB at most (enough to read a leading JSON-RPC id).

    """

    prefix: bytes


async def read_lines(
    reader: asyncio.StreamReader, max_line_bytes: int
) -> AsyncIterator[bytes | Overlong]:
    """Yield each line of ``reader`` (without its newline); an overlong one as :class:`Overlong`."""
    while True:
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as partial:
            if partial.partial.strip():
                yield partial.partial
            return
        except asyncio.LimitOverrunError as overrun:
            # Drop the line in pieces: a bound is a bound, not a reason to buffer more.
            prefix = (await reader.readexactly(overrun.consumed))[:_PREFIX_BYTES]
            while True:
                try:
                    await reader.readuntil(b"\n")
                    break
                except asyncio.LimitOverrunError as more:
                    await reader.readexactly(more.consumed)
                except asyncio.IncompleteReadError:
                    return
            yield Overlong(prefix)
            continue
        if len(line) - 1 > max_line_bytes:
            yield Overlong(line[:_PREFIX_BYTES])
        elif line.strip():
            yield line[:-1]


async def spawn_child(command: Sequence[str], max_line_bytes: int) -> asyncio.subprocess.Process:
    """Start ``command`` as an upstream child: its own process group, dying with the proxy.

    Raises:
        UpstreamError: the command is missing or cannot be run.

    """
    try:
        return await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=None,
            env=upstream_environment(),
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            limit=max_line_bytes + 1,
        )
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UpstreamError(f"cannot start the upstream {command[0]!r}: {reason}") from None


class SpareChild:
    """One upstream child started ahead, so that the next session need not wait for it.

    ``canon mcp-proxy --http`` starts a child per 2025-era session; an MCP server may
    take a second or more to start (an interpreter, its SDK). :meth:`take` hands over the
    child started ahead (or starts one) and starts the next one in the background. The
    spare is one more idle process while nothing is served; :meth:`close` stops it, and it
    dies with the proxy as every child does.
    """

    def __init__(self, command: Sequence[str], *, max_line_bytes: int) -> None:
        """Prepare to keep one child of ``command`` ready; nothing starts yet."""
        self.command = list(command)
        self.max_line_bytes = max_line_bytes
        self._next: asyncio.Task[asyncio.subprocess.Process] | None = None
        self._closed = False

    async def take(self) -> asyncio.subprocess.Process:
        """A started child (the spare when it is alive), the next spare on its way.

        Raises:
            UpstreamError: the command cannot be run.

        """
        ready, self._next = self._next, None
        process: asyncio.subprocess.Process | None = None
        if ready is not None:
            with contextlib.suppress(UpstreamError):
                process = await ready
        if process is None or process.returncode is not None:
            process = await spawn_child(self.command, self.max_line_bytes)
        if not self._closed:
            self._next = asyncio.create_task(spawn_child(self.command, self.max_line_bytes))
        return process

    async def close(self) -> None:
        """Stop the spare child (and its group)."""
        self._closed = True
        ready, self._next = self._next, None
        if ready is None:
            return
        ready.cancel()
        with contextlib.suppress(asyncio.CancelledError, UpstreamError):
            process = await ready
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


class ChildUpstream:
    """An MCP server started as a child process, speaking JSON-RPC lines on stdio."""

    def __init__(
        self, command: Sequence[str], *, max_line_bytes: int, spare: SpareChild | None = None
    ) -> None:
        """Prepare to run ``command``; nothing starts before :meth:`start`.

        ``spare``: where a started child is taken from (``--http``), instead of starting one.
        """
        if not command:
            raise UpstreamError("the upstream command is empty")
        self.command = list(command)
        self.max_line_bytes = max_line_bytes
        self._spare = spare
        self._process: asyncio.subprocess.Process | None = None
        self._reading: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()

    @property
    def pid(self) -> int | None:
        """The running child's process id, or None."""
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        """Whether the child runs and its stdin is open."""
        return self._process is not None and self._process.returncode is None

    async def start(self, deliver: Deliver, bad_line: BadLine, ended: Ended) -> None:
        """Start the child (or take the spare one) and read its messages in the background.

        Raises:
            UpstreamError: the command is missing or cannot be run.

        """
        if self._spare is not None:
            self._process = await self._spare.take()
        else:
            self._process = await spawn_child(self.command, self.max_line_bytes)
        self._reading = asyncio.create_task(self._read(self._process, deliver, bad_line, ended))

    async def _read(
        self, process: asyncio.subprocess.Process, deliver: Deliver, bad_line: BadLine, ended: Ended
    ) -> None:
        assert process.stdout is not None
        async for line in read_lines(process.stdout, self.max_line_bytes):
            if isinstance(line, Overlong):
                await bad_line(leading_id(line.prefix), True)
                continue
            message = decode_line(line)
            if message is None:
                await bad_line(salvage_id(line), False)
            else:
                await deliver(message)
        status = await process.wait()
        await ended(f"the upstream exited with status {status}")

    async def send(self, message: Message) -> None:
        """Write one message to the child.

        Raises:
            UpstreamGone: the child is not running (or its stdin is closed).

        """
        process = self._process
        if process is None or process.returncode is not None or process.stdin is None:
            raise UpstreamGone("the upstream is not running")
        data = encode(message)
        async with self._write_lock:
            try:
                process.stdin.write(data)
                await process.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                raise UpstreamGone("the upstream is not running") from None

    async def stop(self) -> None:
        """Stop the child and its process group: stdin closed, then SIGTERM, then SIGKILL."""
        process = self._process
        if process is None:
            return
        if process.stdin is not None:
            with contextlib.suppress(OSError, RuntimeError):
                process.stdin.close()
        for signum in (None, signal.SIGTERM, signal.SIGKILL):
            if signum is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signum)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(process.wait(), STOP_GRACE_S)
                break
        # The group may hold grandchildren that outlived the child itself.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reading
        self._process = None


class HttpUpstream:
    """An MCP server reached over streamable HTTP, with fixed request headers.

    The connection lives in one task of its own, from opening to closing: the SDK's
    transport holds a task group, which must be left from the task (and cancel scope)
    that entered it, whoever asks it to stop.
    """

    def __init__(self, url: str, *, headers: Mapping[str, str] | None = None) -> None:
        """Prepare to reach ``url``; nothing is sent before :meth:`start`."""
        self.url = url
        self.headers = dict(headers or {})
        self._write: Any = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._said_refused = False
        self._header_maps: dict[str, dict[tuple[str, ...], str]] = {}

    async def _refused(self, response: Any) -> None:
        # The transport turns an HTTP 401 into a bare JSON-RPC error: say why, once.
        if response.status_code in (401, 403) and not self._said_refused:
            self._said_refused = True
            log.warning("upstream_refused", reason=http_failure(response))
        elif response.status_code < 400:
            self._said_refused = False

    @property
    def pid(self) -> int | None:
        """None: no child process."""
        return None

    @property
    def running(self) -> bool:
        """Whether the connection is open."""
        return self._write is not None

    async def start(self, deliver: Deliver, bad_line: BadLine, ended: Ended) -> None:
        """Open the transport and read its messages in the background.

        Raises:
            UpstreamError: the transport could not be opened.

        """
        self._stop = asyncio.Event()
        opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._connection(opened, deliver, bad_line, ended))
        await opened

    async def _connection(
        self, opened: asyncio.Future[None], deliver: Deliver, bad_line: BadLine, ended: Ended
    ) -> None:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        reason = "the upstream connection closed"
        try:
            client = create_mcp_http_client(headers=self.headers)
            client.event_hooks["response"].append(self._refused)
            async with (
                client,
                streamable_http_client(self.url, http_client=client) as (read_stream, write),
            ):
                self._write = write
                opened.set_result(None)
                reading = asyncio.create_task(self._read(read_stream, deliver, bad_line))
                stopping = asyncio.create_task(self._stop.wait())
                await asyncio.wait((reading, stopping), return_when=asyncio.FIRST_COMPLETED)
                stopping.cancel()
                if reading.done() and not reading.cancelled():
                    reason = reading.result()
                reading.cancel()
        except (OSError, httpx2.HTTPError) as exc:
            reason = f"cannot reach the upstream: {type(exc).__name__}"
        except Exception as exc:  # the transport's own failure ends the connection
            reason = http_failure(exc)
        finally:
            self._write = None
            if not opened.done():
                opened.set_exception(UpstreamError(reason))
        # A connection that never opened is start()'s error, not an ending.
        if opened.exception() is None and not self._stop.is_set():
            await ended(reason)

    async def _read(self, read_stream: Any, deliver: Deliver, bad_line: BadLine) -> str:
        async for item in read_stream:
            if isinstance(item, Exception):
                await bad_line(None, False)
                continue
            await deliver(item.message.model_dump(mode="json", by_alias=True, exclude_unset=True))
        return "the upstream connection closed"

    def learn_tools(self, tools: list[Message]) -> None:
        """Keep the listed tools' ``x-mcp-header`` maps (for ``Mcp-Param-*`` headers)."""
        from mcp.shared.inbound import x_mcp_header_map

        for tool in tools:
            if len(self._header_maps) >= _MAX_TOOLS and tool["name"] not in self._header_maps:
                continue
            try:
                self._header_maps[tool["name"]] = x_mcp_header_map(tool.get("inputSchema"))
            except Exception:  # a schema the SDK cannot read sets no headers
                self._header_maps.pop(tool["name"], None)

    async def send(self, message: Message) -> None:
        """Send one message (a 2026-07-28 request with its routing headers).

        Raises:
            UpstreamGone: the connection is closed.

        """
        from mcp.shared.message import ClientMessageMetadata, SessionMessage
        from mcp_types.jsonrpc import jsonrpc_message_adapter

        if self._write is None:
            raise UpstreamGone("the upstream is not connected")
        headers = routing_headers(message, self._header_maps)
        metadata = ClientMessageMetadata(headers=headers) if headers else None
        try:
            parsed = jsonrpc_message_adapter.validate_python(message)
            await self._write.send(SessionMessage(parsed, metadata=metadata))
        except Exception:
            raise UpstreamGone("the upstream is not connected") from None

    async def stop(self) -> None:
        """Close the connection (in the task that opened it)."""
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(self._task), STOP_GRACE_S * 2)
            if not self._task.done():
                self._task.cancel()
        self._task = None
        self._write = None


def http_failure(exc: Any) -> str:
    """One line for the operator about an HTTP failure or response (never a header value)."""
    status = getattr(getattr(exc, "response", exc), "status_code", None)
    if status == 401:
        return "the upstream refused the request (HTTP 401): pass --header or --bearer-token-env"
    if status == 403:
        return "the upstream refused the request (HTTP 403)"
    if status is not None:
        return f"the upstream answered HTTP {status}"
    return f"the upstream connection failed ({type(exc).__name__})"


def routing_headers(
    message: Message, header_maps: Mapping[str, Mapping[tuple[str, ...], str]]
) -> dict[str, str]:
    """The HTTP headers of a 2026-07-28 request, from its body and its tool's schema.

    MCP-Protocol-Version, Mcp-Method, Mcp-Name and a ``tools/call``'s Mcp-Param-* (from
    its tool's ``x-mcp-header`` map).
    A message without the 2026-07-28 ``_meta`` envelope (an earlier protocol's) gets none:
    its session's transport sets what that protocol needs.
    """
    from mcp.shared.inbound import (
        MCP_METHOD_HEADER,
        MCP_NAME_HEADER,
        MCP_PROTOCOL_VERSION_HEADER,
        NAME_BEARING_METHODS,
        encode_header_value,
        mcp_param_headers,
    )

    method, params = message.get("method"), message.get("params")
    if not isinstance(method, str) or "id" not in message:
        return {}
    envelope = envelope_of(params)
    if envelope is None or not isinstance(params, dict):
        return {}
    headers = {
        MCP_PROTOCOL_VERSION_HEADER: envelope[PROTOCOL_VERSION_KEY],
        MCP_METHOD_HEADER: method,
    }
    name_key = NAME_BEARING_METHODS.get(method)
    name = params.get(name_key) if name_key is not None else None
    if isinstance(name, str):
        headers[MCP_NAME_HEADER] = encode_header_value(name)
    arguments = params.get("arguments")
    header_map = header_maps.get(name) if method == "tools/call" and isinstance(name, str) else None
    if header_map and isinstance(arguments, dict):
        headers.update(mcp_param_headers(header_map, arguments))
    return headers
