"""Reading a kept connection's replies without redis-py's per-reply layers.

The batcher keeps connections for its lanes and for lone calls (:mod:`eventstore.wire.batching`),
and every exchange on them is the same: write some EVALSHA commands, read one reply each.
Through redis-py's asyncio connection, each reply passes its timeout and protocol checks,
its error text, its parser and an ``asyncio.StreamReader``: a few per cent of the
client's CPU per invocation when one call is in flight (docs/performance.md). A :class:`Pipe`
takes the place of the connection's stream protocol on its transport while the batcher
holds the connection: bytes go to one hiredis reader as they arrive, and an exchange's
future is settled once its last reply is read. Connecting, authentication and the
connection's life stay redis-py's; the pipe is detached, and the stream protocol put back,
before the connection goes back to the pool.

On RESP3, Redis may send a push message (a key invalidation, a maintenance notice) at
any time; the pipe hands each one to the connection's own redis-py parser, as redis-py's
own reading does. A connection whose pushes cannot be told from replies (hiredis before
3.2), whose transport is not one of asyncio's own (uvloop's, for one) or whose transport
or parser is out of reach (a redis-py laid out otherwise) is read through redis-py as
before: :func:`pipe_for` answers None.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Final

import hiredis
from redis._parsers.base import BaseParser
from redis.asyncio.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse

from eventstore.logs import get_logger

log = get_logger("canon.pipe")
#: hiredis's type for RESP3 push messages (3.2 and later; before, they look like replies).
_PUSH: Any = getattr(hiredis, "PushNotification", None)


#: Reply types that need a second look: errors, push messages, and lists (whose first
#: item may be a connection error, which redis-py raises).
_SPECIAL: Final = (Exception, list)


class _Exchange:
    """Commands written together: their caller's future and the replies read so far."""

    __slots__ = ("expected", "failure", "future", "replies")

    def __init__(self, future: asyncio.Future[list[Any]], expected: int) -> None:
        self.future = future
        self.expected = expected
        self.replies: list[Any] = []
        self.failure: Exception | None = None  # a connection error among them


class Pipe(asyncio.Protocol):
    """The protocol of one kept connection's transport: writes commands, matches replies.

    Replies come back in the order their commands were written, so each exchange waits
    in a queue for as many replies as it sent. An error reply takes its command's place
    as the exception redis-py would raise for it; a reply that is a connection error
    (``LOADING``, for one) fails its whole exchange, as redis-py raises it.
    """

    def __init__(
        self, transport: asyncio.Transport, decode: tuple[str, str] | None, parser: Any
    ) -> None:
        self._transport = transport
        self._parser = parser  # redis-py's, for push messages
        self._pushes: set[asyncio.Task[Any]] = set()
        self._stream_protocol = transport.get_protocol()
        options: dict[str, Any] = {
            "protocolError": InvalidResponse,
            "replyError": BaseParser.parse_error,
        }
        if decode is not None:
            options["encoding"], options["errors"] = decode
        self._reader = hiredis.Reader(**options)
        self._exchanges: deque[_Exchange] = deque()  # in flight, in the order sent
        self._loop = asyncio.get_running_loop()
        self._lost: Exception | None = None
        transport.set_protocol(self)

    def send(self, packed: list[bytes]) -> asyncio.Future[list[Any]]:
        """Write ``packed``; the future is settled with one reply per command, in order.

        Raises:
            redis.exceptions.ConnectionError: the connection is closed or closing.

        """
        if self._lost is not None or self._transport.is_closing():
            raise RedisConnectionError("Connection closed by server.")
        future: asyncio.Future[list[Any]] = self._loop.create_future()
        self._exchanges.append(_Exchange(future, len(packed)))
        self._transport.writelines(packed)
        return future

    def flushed(self) -> bool:
        """Whether everything written so far has left the process (the kernel holds it).

        Redis runs a command the kernel has handed over even if this process dies next.
        """
        return self._transport.get_write_buffer_size() == 0

    def detach(self) -> bool:
        """Give the transport back to its stream protocol; False if replies are still due.

        A connection with replies still due cannot go back to redis-py's reading: its
        next reader would take them for its own. Its owner drops it instead.
        """
        if self._exchanges or self._lost is not None or self._transport.is_closing():
            return False
        self._transport.set_protocol(self._stream_protocol)
        return True

    def data_received(self, data: bytes) -> None:
        """Feed the reader; settle every exchange whose last reply has come."""
        reader, exchanges = self._reader, self._exchanges
        reader.feed(data)
        while True:
            try:
                reply = reader.gets()
            except InvalidResponse as exc:  # the stream is corrupt: nothing after is trusted
                self._drop(exc)
                return
            if reply is False:
                return
            if isinstance(reply, _SPECIAL):  # an error, a push message or a list
                if _PUSH is not None and isinstance(reply, _PUSH):
                    self._push(reply)
                    continue
                if isinstance(reply, list) and reply:
                    failure = reply[0] if isinstance(reply[0], RedisConnectionError) else None
                else:
                    failure = reply if isinstance(reply, RedisConnectionError) else None
            else:
                failure = None
            if not exchanges:
                # A reply nobody asked for: the connection is out of step for good.
                self._drop(InvalidResponse("Redis sent a reply no command was waiting for"))
                return
            exchange = exchanges[0]
            replies = exchange.replies
            replies.append(reply)
            if failure is not None and exchange.failure is None:
                exchange.failure = failure
            if len(replies) < exchange.expected:
                continue
            exchanges.popleft()
            future = exchange.future
            if future.done():  # its caller left (cancelled): the connection is dropped
                continue
            if exchange.failure is None:
                future.set_result(replies)
            else:
                future.set_exception(exchange.failure)

    def _push(self, message: Any) -> None:
        """Hand a push message to redis-py's parser, as its own reading would."""
        task = asyncio.get_running_loop().create_task(self._parser.handle_push_response(message))
        self._pushes.add(task)
        task.add_done_callback(self._pushed)

    def _pushed(self, task: asyncio.Task[Any]) -> None:
        """Forget a handled push message; a handler's failure is logged by its type only."""
        self._pushes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("push_message_failed", error=type(task.exception()).__name__)

    def connection_lost(self, exc: Exception | None) -> None:
        """Fail every exchange still waiting; let the stream protocol see the close too.

        redis-py's ``disconnect`` waits for its stream protocol to learn of the close.
        That protocol keeps the error in a close future, which it marks retrieved only
        when it is itself collected; but the error's traceback reaches, through its
        frames, the objects that wrote the failed command, and so the protocol and its
        future, and a garbage collection of that cycle may finalize the future first,
        which then reports an exception never retrieved. The pipe, which learned of the
        loss for it, marks it retrieved at once (whoever awaits the close still gets it).
        """
        self._fail(RedisConnectionError("Connection closed by server."))
        self._stream_protocol.connection_lost(exc)
        closed = getattr(self._stream_protocol, "_closed", None)
        if isinstance(closed, asyncio.Future) and closed.done() and not closed.cancelled():
            closed.exception()

    def _drop(self, error: Exception) -> None:
        self._fail(error)
        self._transport.close()

    def _fail(self, error: Exception) -> None:
        self._lost = error
        while self._exchanges:
            future = self._exchanges.popleft().future
            if not future.done():
                future.set_exception(error)


def pipe_for(connection: Connection) -> Pipe | None:
    """The pipe of a connected ``connection``, attached now if it has none yet.

    None: the connection is not one a pipe can take over (see the module doc), or is not
    connected; it is read through redis-py.
    """
    transport = _transport(connection)
    if transport is None:
        return None
    protocol = transport.get_protocol()
    if type(protocol) is Pipe:
        return protocol
    parser = getattr(connection, "_parser", None)
    resp3 = str(getattr(connection, "protocol", 2)) != "2"
    if (
        transport.is_closing()
        or _closed_by_server(connection)
        or (resp3 and (_PUSH is None or not hasattr(parser, "handle_push_response")))
    ):
        return None
    encoder = connection.encoder
    decode = (encoder.encoding, encoder.encoding_errors) if encoder.decode_responses else None
    return Pipe(transport, decode, parser)


def _closed_by_server(connection: Connection) -> bool:
    """Whether the server closed ``connection`` while it sat idle in the pool.

    Its stream protocol then keeps the transport open (half-closed, to let the client
    still write) but stops reading it: a pipe put on that transport would wait for
    replies that never come, until the timeout. redis-py's own reading sees the end of
    the stream at once and reconnects, so the connection is left to it.
    """
    reader = getattr(connection, "_reader", None)
    if not isinstance(reader, asyncio.StreamReader):
        return False
    return reader.at_eof() or reader.exception() is not None


def _transport(connection: Connection) -> asyncio.Transport | None:
    """The transport of a connected ``connection`` (None: not connected, or out of reach)."""
    writer = getattr(connection, "_writer", None)
    transport = getattr(writer, "transport", None)
    return transport if isinstance(transport, asyncio.Transport) else None


def release_pipe(connection: Connection) -> bool:
    """Detach ``connection``'s pipe, if it has one; False if it must be dropped instead."""
    transport = _transport(connection)
    protocol = None if transport is None else transport.get_protocol()
    return protocol.detach() if isinstance(protocol, Pipe) else True
