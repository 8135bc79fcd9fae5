"""The host side of ``canon mcp-proxy --http``: streamable HTTP, one relay per session.

:class:`RelayHttpApp` is an ASGI app on ``/mcp``. Each session (an ``initialize`` POST
without ``Mcp-Session-Id``) gets the SDK's own ``StreamableHTTPServerTransport`` and a
:class:`~canon.integrations.mcp_relay.Relay` of its own, with its own upstream (a child
per session for a command, a connection per session for a URL), so sessions never see
each other's notifications, requests or ids. What the upstream sends while a host request
runs (its progress, logs, sampling and elicitation requests) goes on that request's
stream, as a server speaking HTTP itself would send it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Final
from uuid import uuid4

import anyio
import structlog

from canon.integrations._shared import require
from canon.integrations.mcp_relay import UPSTREAM_UNAVAILABLE, Relay, Send, error_response
from canon.integrations.mcp_upstream import Message, UpstreamError

require("mcp", "mcp")

from mcp.server.streamable_http import StreamableHTTPServerTransport  # noqa: E402
from mcp.server.transport_security import TransportSecuritySettings  # noqa: E402
from mcp.shared.message import ServerMessageMetadata, SessionMessage  # noqa: E402
from mcp_types.jsonrpc import jsonrpc_message_adapter  # noqa: E402

log = structlog.get_logger("canon.mcp_proxy")

#: The path the proxy serves MCP on.
MCP_PATH: Final = "/mcp"
_SESSION_HEADER = b"mcp-session-id"

MakeRelay = Callable[[Send], Relay]


class RelayHttpApp:
    """Serve MCP over streamable HTTP, relaying each session to an upstream of its own."""

    def __init__(self, make_relay: MakeRelay, *, host: str = "127.0.0.1") -> None:
        """``make_relay`` builds a session's relay around the function that writes to it.

        Bound to a loopback ``host``, requests must name a loopback Host (and Origin, when
        they send one), as the SDK's own servers require: DNS rebinding protection.
        """
        self._make_relay = make_relay
        self._security = (
            TransportSecuritySettings(
                enable_dns_rebinding_protection=True,
                allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
                allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
            )
            if host in ("127.0.0.1", "localhost", "::1")
            else None
        )
        self._sessions: dict[str, StreamableHTTPServerTransport] = {}
        self._group: anyio.abc.TaskGroup | None = None

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """Serve sessions inside this block; leaving it ends every session and its upstream."""
        async with anyio.create_task_group() as group:
            self._group = group
            try:
                yield
            finally:
                for transport in list(self._sessions.values()):
                    with anyio.CancelScope(shield=True):
                        await transport.terminate()
                group.cancel_scope.cancel()
                self._group = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """The ASGI entry point."""
        if scope["type"] != "http":
            return
        if scope["path"].rstrip("/") != MCP_PATH:
            await _plain(send, 404)
            return
        session_id = dict(scope["headers"]).get(_SESSION_HEADER, b"").decode("latin-1")
        transport = self._sessions.get(session_id) if session_id else None
        if transport is not None:
            await transport.handle_request(scope, receive, send)
        elif session_id:
            await _plain(send, 404)
        elif scope["method"] == "POST":
            await self._open(scope, receive, send)
        else:
            await _plain(send, 405 if scope["method"] not in ("GET", "DELETE") else 400)

    async def _open(self, scope: Any, receive: Any, send: Any) -> None:
        assert self._group is not None, "serve inside RelayHttpApp.run()"
        session_id = uuid4().hex
        transport = StreamableHTTPServerTransport(
            mcp_session_id=session_id, security_settings=self._security
        )
        self._sessions[session_id] = transport
        status: list[int] = []

        async def watch(message: Any) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await self._group.start(self._session, session_id, transport)
            await transport.handle_request(scope, receive, watch)
        finally:
            # A first request that failed opened nothing: forget the session at once.
            if not status or status[0] >= 400:
                await self._discard(session_id, transport)

    async def _session(
        self,
        session_id: str,
        transport: StreamableHTTPServerTransport,
        *,
        task_status: Any = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            await self._serve_session(session_id, transport, task_status)
        except Exception as exc:  # one session's failure must not end the others
            log.warning("mcp_session_failed", error_type=type(exc).__name__)

    async def _serve_session(
        self, session_id: str, transport: StreamableHTTPServerTransport, task_status: Any
    ) -> None:
        async with transport.connect() as (read_stream, write_stream):
            task_status.started()

            async def to_host(message: Message, related: Any = None) -> None:
                metadata = (
                    ServerMessageMetadata(related_request_id=related)
                    if related is not None
                    else None
                )
                parsed = jsonrpc_message_adapter.validate_python(message)
                with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                    await write_stream.send(SessionMessage(parsed, metadata=metadata))

            relay = self._make_relay(to_host)
            started = True
            try:
                await relay.start()
            except UpstreamError as exc:
                log.warning("upstream_start_failed", reason=str(exc))
                started = False
            try:
                async for item in read_stream:
                    if isinstance(item, Exception):
                        continue
                    message = item.message.model_dump(
                        mode="json", by_alias=True, exclude_unset=True
                    )
                    if started:
                        await relay.from_host(message)
                    elif "id" in message and "method" in message:
                        reason = "the upstream MCP server could not be started"
                        await to_host(error_response(message["id"], UPSTREAM_UNAVAILABLE, reason))
            except (anyio.ClosedResourceError, anyio.EndOfStream):
                pass  # the session ended (DELETE, or the transport's idle timeout)
            except Exception as exc:  # one session's failure must not end the others
                log.warning("mcp_session_failed", error_type=type(exc).__name__)
            finally:
                with anyio.CancelScope(shield=True):
                    await relay.stop()
                    await self._discard(session_id, transport)

    async def _discard(self, session_id: str, transport: StreamableHTTPServerTransport) -> None:
        self._sessions.pop(session_id, None)
        if not transport.is_terminated:
            with anyio.CancelScope(shield=True):
                await transport.terminate()


async def _plain(send: Any, status: int) -> None:
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": b""})
