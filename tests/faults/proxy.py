"""A loopback TCP proxy in front of Redis that can lose one reply, deterministically.

Armed with a predicate, the proxy forwards the next client command that matches it, holds
back Redis's reply to that command, records the Redis-side address of that connection and
signals ``reply_held``. The test then kills that connection with ``CLIENT KILL ID`` (found
through ``CLIENT LIST`` by address); when Redis closes it, the proxy closes the client side
without forwarding the held reply. The command has run, its reply is lost: exactly the case
a client-side retry must survive.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

Predicate = Callable[[bytes], bool]


@dataclass
class Victim:
    """The connection whose reply is held: its Redis-side address and the held bytes."""

    upstream_port: int
    held: bytes = b""


@dataclass
class CuttingProxy:
    """Forwards loopback connections to ``127.0.0.1:upstream_port``; see the module doc.

    Attributes:
        forwarded: every client chunk that matched the predicate of the last
            :meth:`arm`, in order (the lost command and its re-sends).

    """

    upstream_port: int
    forwarded: list[bytes] = field(default_factory=list)
    reply_held: asyncio.Event = field(default_factory=asyncio.Event)
    victim: Victim | None = None
    _predicate: Predicate | None = None
    _watch: Predicate | None = None
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def start(self) -> int:
        """Listen on a free loopback port and return it."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def arm(self, predicate: Predicate) -> None:
        """Lose the reply of the next command for which ``predicate(chunk)`` is true."""
        self.reply_held.clear()
        self.forwarded = []
        self.victim = None
        self._predicate = predicate
        self._watch = predicate

    async def close(self) -> None:
        """Stop listening and close every proxied connection."""
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(
        self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter
    ) -> None:
        upstream_reader, upstream = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers += [client, upstream]
        state: dict[str, Victim | None] = {"victim": None}
        up = asyncio.create_task(self._requests(client_reader, upstream, state))
        down = asyncio.create_task(self._replies(upstream_reader, client, state))
        for task in (up, down):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _requests(
        self,
        reader: asyncio.StreamReader,
        upstream: asyncio.StreamWriter,
        state: dict[str, Victim | None],
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                if self._watch is not None and self._watch(chunk):
                    self.forwarded.append(chunk)
                if self._predicate is not None and self._predicate(chunk):
                    self._predicate = None
                    port = int(upstream.get_extra_info("sockname")[1])
                    state["victim"] = self.victim = Victim(upstream_port=port)
                upstream.write(chunk)
                await upstream.drain()
        upstream.close()

    async def _replies(
        self,
        reader: asyncio.StreamReader,
        client: asyncio.StreamWriter,
        state: dict[str, Victim | None],
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                victim = state["victim"]
                if victim is not None:
                    # Hold every byte from now on; Redis closing the link ends the loop.
                    victim.held += chunk
                    self.reply_held.set()
                    continue
                client.write(chunk)
                await client.drain()
        client.close()
