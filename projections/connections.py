"""The receipt server's HTTP connections: bounded in time and number, ``no-store`` always.

uvicorn's h11 protocol answers malformed requests itself (a plain-text 400 without
``Cache-Control``), keeps a connection that sends nothing, or half a header, for as long
as the client likes, and has no cap on connections. :class:`GuardedProtocol` is that
protocol with

- a **header bound**: from the moment a connection opens or a new request's first byte
  arrives, the request's header (and body) must be complete within ``header_timeout_s``,
  else the connection is closed; a request being answered is never cut;
- an **idle bound**: a kept-alive connection is closed ``idle_timeout_s`` after its last
  answer (uvicorn's keep-alive timeout);
- a **cap**: past ``max_connections`` open connections, a new one makes room by closing
  the connection that has waited longest without a request in progress; when every
  connection is answering a request, the new one gets a 503 and is closed;
- **no-store on its own answers**: the 400 for a request h11 cannot parse (duplicate or
  missing ``Host``, raw non-ASCII or control bytes in the target, bytes that are not HTTP)
  and the 503 above carry ``Cache-Control: no-store`` and a JSON body, like every answer
  of the API. A request that fails in an unexpected way is answered 400 too, never with
  a stack trace.

:class:`ServedApp` wraps the application the server runs, so that no answer leaves
without ``no-store`` and an application error becomes a 500 of our own (JSON, no trace),
never uvicorn's plain-text one with a logged traceback.

The bounds apply to the server as a whole (set on ``canon serve`` with
``--header-timeout-s``, ``--idle-timeout-s``, ``--max-connections``).
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any, Final

import h11
import msgspec
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from eventstore.logs import get_logger

log = get_logger("canon.http")

DEFAULT_HEADER_TIMEOUT_S: Final = 10.0
DEFAULT_IDLE_TIMEOUT_S: Final = 5.0
DEFAULT_MAX_CONNECTIONS: Final = 1024

_BAD_REQUEST: Final = msgspec.json.encode(
    {"error": "invalid_request", "message": "The request is not valid HTTP/1.1."}
)
_BUSY: Final = msgspec.json.encode({"error": "server_busy"})
#: Headers of every answer this module makes itself.
_HEADERS: Final = [
    (b"content-type", b"application/json"),
    (b"cache-control", b"no-store"),
    (b"connection", b"close"),
]
#: Written raw: no request was read, so h11 has no response to frame.
_BUSY_ANSWER: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    + b"".join(name + b": " + value + b"\r\n" for name, value in _HEADERS)
    + b"content-length: "
    + str(len(_BUSY)).encode()
    + b"\r\n\r\n"
    + _BUSY
)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How long a connection may wait and how many may be open (see the module doc).

    Attributes:
        header_timeout_s: seconds a request may take to arrive whole.
        idle_timeout_s: seconds a kept-alive connection may wait for its next request.
        max_connections: connections open at once.

    """

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    def __post_init__(self) -> None:
        if self.header_timeout_s <= 0 or self.idle_timeout_s <= 0 or self.max_connections < 1:
            raise ValueError("connection timeouts must be positive, max_connections at least 1")


class GuardedProtocol(H11Protocol):
    """uvicorn's h11 protocol with the bounds of :attr:`limits` (see the module doc).

    Use :func:`guarded_protocol` to get the class for given limits.
    """

    limits: ConnectionLimits = ConnectionLimits()
    #: Orders connections by when they started waiting (ties of one loop turn included).
    _ticks: itertools.count[int] = itertools.count()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The idle bound is uvicorn's keep-alive timer, set from our limits.
        self.timeout_keep_alive = self.limits.idle_timeout_s  # type: ignore[assignment]
        self._header_timer: asyncio.TimerHandle | None = None
        self._waiting_since: int | None = None

    @property
    def serving(self) -> bool:
        """Whether a request of this connection is being answered."""
        return self.cycle is not None and not self.cycle.response_complete

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Register the connection; make room under the cap; start the header bound."""
        super().connection_made(transport)
        self._waiting_since = next(self._ticks)
        if len(self.connections) > self.limits.max_connections and not self._make_room():
            self.connections.discard(self)
            transport.write(_BUSY_ANSWER)
            transport.close()
            return
        self._arm_header_timer()

    def _make_room(self) -> bool:
        """Close the connection waiting longest without a request; False if none is."""
        waiting = [
            connection
            for connection in self.connections
            if isinstance(connection, GuardedProtocol)
            and connection is not self
            and not connection.serving
            and connection._waiting_since is not None
        ]
        if not waiting:
            return False
        oldest = min(waiting, key=lambda connection: connection._waiting_since or 0)
        oldest.close_waiting()
        return True

    def close_waiting(self) -> None:
        """Close this connection, which has no request in progress."""
        self._cancel_header_timer()
        self._unset_keepalive_if_required()
        self.connections.discard(self)
        if not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        """Feed h11; the header bound runs until a request is being answered."""
        if not self.serving and self._header_timer is None:
            self._arm_header_timer()
        try:
            super().data_received(data)
        except Exception:
            # h11 and uvicorn refuse what they cannot parse with a 400 of their own; this
            # is for anything that escapes them: the same answer, never a trace.
            self.logger.warning("Invalid HTTP request received.")
            self._answer_bad_request()
            return
        if self.serving:
            self._cancel_header_timer()
            self._waiting_since = None

    def on_response_complete(self) -> None:
        """The answer is out: the idle bound (keep-alive) takes over from here."""
        self._cancel_header_timer()
        self._waiting_since = next(self._ticks)
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection and its timers."""
        self._cancel_header_timer()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """Answer a request h11 cannot parse: JSON, ``no-store``, then close."""
        self._answer_bad_request()

    def _answer_bad_request(self) -> None:
        self._cancel_header_timer()
        try:
            output = self.conn.send(h11.Response(status_code=400, headers=_HEADERS))
            output += self.conn.send(h11.Data(data=_BAD_REQUEST)) or b""
            output += self.conn.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError:
            output = None  # an answer had already begun: nothing more can be framed
        if output and not self.transport.is_closing():
            self.transport.write(output)
        self.transport.close()

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(
            self.limits.header_timeout_s, self._header_timed_out
        )

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if not self.serving and not self.transport.is_closing():
            self.close_waiting()


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedProtocol]:
    """Return the protocol class uvicorn should run (``Config(http=...)``) for ``limits``."""
    return type("GuardedProtocol", (GuardedProtocol,), {"limits": limits})


def _no_store(message: Message) -> Message:
    """``message`` with exactly one ``Cache-Control: no-store`` (a response start)."""
    headers = [
        (name, value)
        for name, value in message.get("headers", [])
        if name.lower() != b"cache-control"
    ]
    return {**message, "headers": [*headers, (b"cache-control", b"no-store")]}


class ServedApp:
    """The ASGI application as served: ``no-store`` on every answer, errors answered 500.

    An exception the application lets out is logged by type only and answered with a
    JSON 500 when no answer has begun; uvicorn never sees it (it would log a traceback
    and answer in plain text).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the application; see the class docstring."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_no_store(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message = _no_store(message)
            await send(message)

        try:
            await self.app(scope, receive, send_no_store)
        except Exception as exc:
            log.error("request_failed", error=type(exc).__name__)
            if started:
                return
            body = msgspec.json.encode({"error": "internal_error"})
            await send_no_store(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": body})
