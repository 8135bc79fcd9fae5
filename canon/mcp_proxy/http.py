"""The host side of ``canon mcp-proxy --http``: streamable HTTP at both protocol eras.

:class:`RelayHttpApp` is an ASGI app on ``/mcp`` that routes each request by its era, as
the SDK's own session manager does (by the ``MCP-Protocol-Version`` header):

* **2026-07-28** (a header naming a version without the ``initialize`` handshake): each
  POST is one self-contained request carrying its ``_meta`` envelope. It is checked the
  way the SDK's own server checks it (DNS rebinding, method, ``Accept``, body size,
  JSON, the envelope and its routing headers, answered with the SDK's status per error
  code) before anything starts; then it goes to the era's one
  :class:`~canon.mcp_proxy.relay.Relay`, whose upstream starts with the first valid
  request and stops after ``idle_timeout_s`` without one. The answer is JSON, or an SSE
  stream when the upstream sends the request's notifications (progress, logs,
  ``subscriptions/listen``) before it; a host that closes the stream cancels the request.
  Hosts' JSON-RPC ids are replaced by the proxy's own on the way in and restored on the
  way out, so two hosts' ``1`` never meet.
* **2025-11-25 and earlier**: sessions. An ``initialize`` POST without ``Mcp-Session-Id``
  opens one, with the SDK's ``StreamableHTTPServerTransport`` and a relay (and upstream:
  a child per session for a command, a connection per session for a URL) of its own, so
  sessions never see each other's messages. A POST that is not an ``initialize`` (or
  fails the checks) opens nothing and starts no upstream. A session without a request for
  ``idle_timeout_s`` ends, and its upstream with it. What the upstream sends while a host
  request runs goes on that request's stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Final
from uuid import uuid4

import anyio

from canon.integrations._shared import require
from canon.mcp_proxy.messages import (
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    UPSTREAM_UNAVAILABLE,
    FrameRefused,
    Message,
    decode_frame,
    envelope_of,
    error_response,
)
from canon.mcp_proxy.relay import Relay, Send
from canon.mcp_proxy.upstream import UpstreamError
from eventstore.logs import get_logger

require("mcp", "mcp")

from mcp.server.streamable_http import (  # noqa: E402
    StreamableHTTPServerTransport,
    check_accept_headers,
)
from mcp.server.transport_security import (  # noqa: E402
    RequestBodyLimitMiddleware,
    TransportSecurityMiddleware,
    TransportSecuritySettings,
)
from mcp.shared.inbound import (  # noqa: E402
    ERROR_CODE_HTTP_STATUS,
    MCP_PARAM_HEADER_PREFIX,
    MCP_PROTOCOL_VERSION_HEADER,
    InboundLadderRejection,
    classify_inbound_request,
    find_duplicated_routing_header,
    unsupported_protocol_version_rejection,
    validate_mcp_param_headers,
)
from mcp.shared.message import ServerMessageMetadata, SessionMessage  # noqa: E402
from mcp_types import HEADER_MISMATCH  # noqa: E402
from mcp_types.jsonrpc import jsonrpc_message_adapter  # noqa: E402
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import Response  # noqa: E402

log = get_logger("canon.mcp_proxy")

#: The path the proxy serves MCP on.
MCP_PATH: Final = "/mcp"
#: Seconds a session (or the 2026-07-28 era's upstream) lives without a request.
DEFAULT_IDLE_TIMEOUT_S: Final = 30 * 60.0
_SESSION_HEADER = b"mcp-session-id"
_VERSION_HEADER = MCP_PROTOCOL_VERSION_HEADER.encode("ascii")
# Seconds between keepalive comments on a 2026-07-28 SSE answer.
_PING_S = 15.0
_SSE_HEADERS: Final = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"connection", b"keep-alive"),
    (b"x-accel-buffering", b"no"),
]

MakeRelay = Callable[[Send], Relay]


class RelayHttpApp:
    """Serve MCP over streamable HTTP at every protocol era, relaying to upstreams.

    Args:
        make_relay: builds a relay around the function that writes to its host.
        host: the bound address: on a loopback one, requests must name a loopback Host
            (and Origin, when they send one), as the SDK's own servers require.
        idle_timeout_s: seconds a session (or the 2026-07-28 era's upstream) lives
            without a request in flight.
        max_body_bytes: the largest request body read (413 past it).
        max_depth: the deepest nesting of a request body (-32600 past it).

    """

    def __init__(
        self,
        make_relay: MakeRelay,
        *,
        host: str = "127.0.0.1",
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        max_body_bytes: int = 4 * 1024 * 1024,
        max_depth: int = 68,
    ) -> None:
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
        self._idle_timeout_s = idle_timeout_s
        self._max_depth = max_depth
        self._sessions: dict[str, StreamableHTTPServerTransport] = {}
        self._group: anyio.abc.TaskGroup | None = None
        self._modern = _ModernEra(make_relay, idle_timeout_s, max_depth)
        self._asgi = RequestBodyLimitMiddleware(self._route, max_body_bytes)

    @property
    def sessions(self) -> int:
        """How many 2025-era sessions are open."""
        return len(self._sessions)

    @property
    def modern_upstream_running(self) -> bool:
        """Whether the 2026-07-28 era's relay (and its upstream) is running."""
        return self._modern.relay is not None

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """Serve inside this block; leaving it ends every session and every upstream."""
        async with anyio.create_task_group() as group:
            self._group = group
            try:
                yield
            finally:
                for transport in list(self._sessions.values()):
                    with anyio.CancelScope(shield=True):
                        await transport.terminate()
                with anyio.CancelScope(shield=True):
                    await self._modern.stop()
                group.cancel_scope.cancel()
                self._group = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """The ASGI entry point."""
        if scope["type"] != "http":
            return
        if scope["path"].rstrip("/") != MCP_PATH:
            await _plain(send, 404)
            return
        await self._asgi(scope, receive, send)

    async def _route(self, scope: Any, receive: Any, send: Any) -> None:
        headers = scope["headers"]
        version = next((v.decode("latin-1") for k, v in headers if k == _VERSION_HEADER), None)
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            await self._modern.handle(self._security, scope, receive, send)
            return
        session_id = dict(headers).get(_SESSION_HEADER, b"").decode("latin-1")
        transport = self._sessions.get(session_id) if session_id else None
        if transport is not None:
            await transport.handle_request(scope, receive, send)
        elif session_id:
            await _json_error(send, scope, receive, "Session not found", 404)
        elif scope["method"] == "POST":
            await self._open(scope, receive, send)
        else:
            await _plain(send, 405 if scope["method"] not in ("GET", "DELETE") else 400)

    async def _open(self, scope: Any, receive: Any, send: Any) -> None:
        """Open a session for an ``initialize`` POST; anything else opens nothing."""
        assert self._group is not None, "serve inside RelayHttpApp.run()"
        request = Request(scope, receive)
        refused = await TransportSecurityMiddleware(self._security).validate_request(
            request, is_post=True
        )
        if refused is not None:
            await refused(scope, receive, send)
            return
        body = await request.body()
        try:
            message = decode_frame(body, max_depth=self._max_depth, depth_flag="--max-json-depth")
        except FrameRefused as frame:
            await _write_error(
                scope, receive, send, error_response(None, frame.code, frame.message)
            )
            return
        if not (isinstance(message, dict) and message.get("method") == "initialize"):
            # Only an initialize opens a session: nothing starts for anything else.
            await _json_error(send, scope, receive, "Bad Request: Missing session ID", 400)
            return
        session_id = uuid4().hex
        transport = StreamableHTTPServerTransport(
            mcp_session_id=session_id,
            security_settings=self._security,
            idle_timeout=self._idle_timeout_s,
        )
        self._sessions[session_id] = transport
        status: list[int] = []

        async def watch(message: Any) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await self._group.start(self._session, session_id, transport)
            await transport.handle_request(scope, _replaying(body, receive), watch)
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
            idle = transport.idle_scope or anyio.CancelScope()
            try:
                with idle:
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
                            await to_host(
                                error_response(message["id"], UPSTREAM_UNAVAILABLE, reason)
                            )
                if idle.cancelled_caught:
                    log.info("mcp_session_idle_closed")
            except (anyio.ClosedResourceError, anyio.EndOfStream):
                pass  # the session ended (DELETE)
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


class _ModernEra:
    """The 2026-07-28 era: self-contained POSTs, one relay shared by all of them."""

    def __init__(self, make_relay: MakeRelay, idle_timeout_s: float, max_depth: int) -> None:
        self._make_relay = make_relay
        self._idle_timeout_s = idle_timeout_s
        self._max_depth = max_depth
        self.relay: Relay | None = None
        self._starting = asyncio.Lock()
        self._ids = itertools.count(1)
        # the proxy's id of a request -> where its messages go.
        self._streams: dict[str, asyncio.Queue[Message]] = {}
        self._idle: asyncio.TimerHandle | None = None
        self._stopping: asyncio.Task[None] | None = None

    async def handle(
        self, security: TransportSecuritySettings | None, scope: Any, receive: Any, send: Any
    ) -> None:
        """Check one 2026-07-28 POST as the SDK does, then relay it and write its answer."""
        request = Request(scope, receive)
        refused = await TransportSecurityMiddleware(security).validate_request(
            request, is_post=request.method == "POST"
        )
        if refused is not None:
            await refused(scope, receive, send)
            return
        if request.method != "POST":
            await Response(status_code=405, headers={"Allow": "POST"})(scope, receive, send)
            return
        has_json, has_sse = check_accept_headers(request)
        if not (has_json and has_sse):
            await Response(status_code=406)(scope, receive, send)
            return
        body = await request.body()
        try:
            decoded = decode_frame(body, max_depth=self._max_depth, depth_flag="--max-json-depth")
        except FrameRefused as frame:
            answer = error_response(frame.request_id, frame.code, frame.message)
            await _write_error(scope, receive, send, answer)
            return
        if isinstance(decoded, dict) and "id" not in decoded:
            # A notification: accepted and dropped (the era has none the proxy acts on).
            requested = request.headers.get(MCP_PROTOCOL_VERSION_HEADER, "")
            unsupported = unsupported_protocol_version_rejection(requested)
            if unsupported is not None:
                await _write_rejection(scope, receive, send, unsupported, None)
                return
            await Response(status_code=202)(scope, receive, send)
            return
        host_id = decoded.get("id") if isinstance(decoded, dict) else None
        if not (
            isinstance(decoded, dict)
            and decoded.get("jsonrpc") == "2.0"
            and isinstance(decoded.get("method"), str)
            and (isinstance(host_id, str) or (isinstance(host_id, int) and host_id is not True))
            and not isinstance(host_id, bool)
        ):
            body_error = "Body must be a single JSON-RPC request or notification object"
            await _write_error(
                scope, receive, send, error_response(None, INVALID_REQUEST, body_error)
            )
            return
        duplicated = find_duplicated_routing_header(request.headers.items())
        if duplicated is not None:
            rejection = InboundLadderRejection(
                code=HEADER_MISMATCH, message=f"{duplicated} header appears more than once"
            )
            await _write_rejection(scope, receive, send, rejection, host_id)
            return
        verdict = classify_inbound_request(decoded, headers=dict(request.headers))
        if isinstance(verdict, InboundLadderRejection):
            await _write_rejection(scope, receive, send, verdict, host_id)
            return
        if decoded["method"] == "initialize":
            # The 2026-07-28 HTTP wire has no handshake: answered as the SDK's own server
            # answers it, and no upstream starts for it.
            missing = error_response(host_id, METHOD_NOT_FOUND, "Method not found")
            await _write_error(scope, receive, send, missing)
            return
        relay = await self._started()
        if relay is None:
            reason = "the upstream MCP server could not be started"
            answer = error_response(host_id, UPSTREAM_UNAVAILABLE, reason)
            await _write_error(scope, receive, send, answer)
            return
        mismatch = await _param_headers_mismatch(relay, decoded, request)
        if mismatch is not None:
            await _write_rejection(scope, receive, send, mismatch, host_id)
            return
        await self._exchange(relay, decoded, host_id, scope, receive, send)

    async def _exchange(
        self, relay: Relay, decoded: Message, host_id: Any, scope: Any, receive: Any, send: Any
    ) -> None:
        own_id = f"h{next(self._ids)}"
        stream: asyncio.Queue[Message] = asyncio.Queue()
        self._streams[own_id] = stream
        self._busy()
        watching = asyncio.create_task(_disconnected(receive))
        committed = False
        try:
            await relay.from_host({**decoded, "id": own_id})
            while True:
                getting = asyncio.create_task(stream.get())
                done, _ = await asyncio.wait(
                    (getting, watching), timeout=_PING_S, return_when=asyncio.FIRST_COMPLETED
                )
                if watching in done:
                    getting.cancel()
                    cancel = {"requestId": own_id, "reason": "the host closed the stream"}
                    await relay.from_host(
                        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel}
                    )
                    return
                if getting not in done:
                    getting.cancel()
                    if not committed:
                        await send(
                            {"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS}
                        )
                        committed = True
                    await send(
                        {"type": "http.response.body", "body": b": ping\r\n\r\n", "more_body": True}
                    )
                    continue
                message = getting.result()
                final = "method" not in message and message.get("id") == own_id
                if final:
                    message = {**message, "id": host_id}
                if final and not committed:
                    await _write_error(scope, receive, send, message)
                    return
                if not committed:
                    await send(
                        {"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS}
                    )
                    committed = True
                await send(
                    {
                        "type": "http.response.body",
                        "body": _sse_event(message),
                        "more_body": not final,
                    }
                )
                if final:
                    return
        finally:
            watching.cancel()
            self._streams.pop(own_id, None)
            self._busy()

    async def _to_host(self, message: Message, related: Any = None) -> None:
        if "method" not in message:
            target = message.get("id")
        elif "id" in message:
            # 2026-07-28 has no server-to-client requests: an upstream that sends one gets
            # no answer from a host that cannot be asked.
            return
        else:
            target = related
        stream = self._streams.get(target) if isinstance(target, str) else None
        if stream is not None:
            stream.put_nowait(message)

    async def _started(self) -> Relay | None:
        async with self._starting:
            if self._stopping is not None:
                await self._stopping
            if self.relay is None:
                relay = self._make_relay(self._to_host)
                try:
                    await relay.start()
                except UpstreamError as exc:
                    log.warning("upstream_start_failed", reason=str(exc))
                    return None
                self.relay = relay
            return self.relay

    def _busy(self) -> None:
        """Restart the idle timer when nothing is in flight (else hold it)."""
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if not self._streams and self.relay is not None:
            loop = asyncio.get_running_loop()
            self._idle = loop.call_later(self._idle_timeout_s, self._on_idle)

    def _on_idle(self) -> None:
        self._idle = None
        if not self._streams and self.relay is not None and self._stopping is None:
            log.info("mcp_idle_upstream_stopped", era="2026-07-28")
            self._stopping = asyncio.create_task(self._stop_idle())

    async def _stop_idle(self) -> None:
        relay, self.relay = self.relay, None
        try:
            if relay is not None:
                await relay.stop()
        finally:
            self._stopping = None

    async def stop(self) -> None:
        """Stop the era's relay and upstream."""
        if self._idle is not None:
            self._idle.cancel()
        relay, self.relay = self.relay, None
        if relay is not None:
            await relay.stop()


async def _param_headers_mismatch(
    relay: Relay, decoded: Message, request: Request
) -> InboundLadderRejection | None:
    """A ``tools/call``'s ``Mcp-Param-*`` headers checked against its arguments.

    By the tool's listed schema, as the SDK's own server checks them: the upstream gets
    headers the proxy derives from the arguments, so a host's wrong ones would pass unseen.
    """
    params = decoded.get("params")
    if decoded.get("method") != "tools/call" or not isinstance(params, dict):
        return None
    name, arguments = params.get("name"), params.get("arguments") or {}
    if not isinstance(name, str) or not isinstance(arguments, dict):
        return None
    prefix = MCP_PARAM_HEADER_PREFIX.lower()
    if not arguments and not any(header.startswith(prefix) for header in request.headers):
        return None
    if name not in relay.calls.schemas:
        await relay.calls.refresh(relay.envelope or envelope_of(params))
    schema = relay.calls.schemas.get(name)
    if schema is None:
        return None
    return validate_mcp_param_headers(schema, arguments, request.headers)


async def _disconnected(receive: Any) -> None:
    while (await receive()).get("type") != "http.disconnect":
        pass


def _replaying(body: bytes, receive: Any) -> Any:
    """A ``receive`` that gives ``body`` again, then the real one's messages."""
    given = False

    async def again() -> Any:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


def _sse_event(message: Message) -> bytes:
    data = json.dumps(message, separators=(",", ":"))
    return f"event: message\r\ndata: {data}\r\n\r\n".encode()


async def _write_error(scope: Any, receive: Any, send: Any, message: Message) -> None:
    """A JSON-RPC answer as JSON, with the SDK's HTTP status for its error code."""
    error = message.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    status = ERROR_CODE_HTTP_STATUS.get(code, 200) if isinstance(code, int) else 200
    try:
        body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        body = json.dumps(message, separators=(",", ":")).encode()
    await Response(body, status_code=status, media_type="application/json")(scope, receive, send)


async def _write_rejection(
    scope: Any, receive: Any, send: Any, rejection: InboundLadderRejection, request_id: Any
) -> None:
    error: dict[str, Any] = {"code": rejection.code, "message": rejection.message}
    if rejection.data is not None:
        error["data"] = rejection.data
    await _write_error(scope, receive, send, {"jsonrpc": "2.0", "id": request_id, "error": error})


async def _json_error(send: Any, scope: Any, receive: Any, message: str, status: int) -> None:
    answer = error_response(None, INVALID_REQUEST, message)
    body = json.dumps(answer, separators=(",", ":")).encode()
    await Response(body, status_code=status, media_type="application/json")(scope, receive, send)


async def _plain(send: Any, status: int) -> None:
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": b""})


__all__ = ["DEFAULT_IDLE_TIMEOUT_S", "MCP_PATH", "PARSE_ERROR", "RelayHttpApp"]
