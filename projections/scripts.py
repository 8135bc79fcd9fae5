"""Loads the projection scripts beside this module and wraps each in one typed function.

Every script writes a projection's output, its per-shard position and the entry's ack in
one step. The shared helpers in ``helpers.lua`` are pasted at ``-- @position-helpers``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any, Final, cast

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from eventstore.batching import ScriptBatcher
from eventstore.errors import redis_errors

_MARKER: Final = "-- @position-helpers"


@cache
def script_source(name: str) -> str:
    """Return the source of ``scripts/<name>.lua`` with the shared helpers in place."""
    folder = resources.files("projections").joinpath("scripts")
    text = folder.joinpath(f"{name}.lua").read_text("utf-8")
    if _MARKER in text:
        text = text.replace(_MARKER, folder.joinpath("helpers.lua").read_text("utf-8"), 1)
    return text


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class ProjectionScripts:
    """The projection scripts registered on one client.

    Calls go through a :class:`ScriptBatcher`: the shard loops of a worker that call in
    the same event-loop turn share a round trip, and hiredis packs the arguments in C.
    Every script here is safe to send again (reads, or writes that settle an entry only
    while it is pending), as the batcher requires.
    """

    def __init__(self, client: Redis) -> None:
        self._batcher = ScriptBatcher(client)
        self._receipts_put: AsyncScript = client.register_script(script_source("receipts_put"))
        self._read_snapshots: AsyncScript = client.register_script(script_source("read_snapshots"))
        self._views_put: AsyncScript = client.register_script(script_source("views_put"))
        self._settle: AsyncScript = client.register_script(script_source("settle"))
        self._dead_letter: AsyncScript = client.register_script(script_source("dead_letter"))

    async def _call(
        self, script: AsyncScript, keys: Sequence[str], args: Sequence[str | int | bytes]
    ) -> tuple[str, str]:
        async with redis_errors():
            reply = await self._batcher.call(script, keys, args)
        return _text(reply[0]), _text(reply[1])

    async def _call_batch(
        self, script: AsyncScript, keys: Sequence[str], args: Sequence[str | int | bytes]
    ) -> list[tuple[str, str]]:
        async with redis_errors():
            reply = await self._batcher.call(script, keys, args)
        return [(_text(reply[i]), _text(reply[i + 1])) for i in range(0, len(reply), 2)]

    async def receipts_put(
        self, keys: Sequence[str], args: Sequence[str | int | bytes]
    ) -> list[tuple[str, str]]:
        """Run ``receipts_put.lua`` (a batch); one (outcome, version) pair per entry."""
        return await self._call_batch(self._receipts_put, keys, args)

    async def views_put(
        self, keys: Sequence[str], args: Sequence[str | int | bytes]
    ) -> list[tuple[str, str]]:
        """Run ``views_put.lua`` (a batch); one (outcome, version) pair per entry."""
        return await self._call_batch(self._views_put, keys, args)

    async def read_snapshots(self, keys: Sequence[str], fields: Sequence[str]) -> list[Any]:
        """Run ``read_snapshots.lua``; keys are record, stream pairs (see its header)."""
        async with redis_errors():
            return cast(list[Any], await self._batcher.call(self._read_snapshots, keys, fields))

    async def settle(
        self, keys: Sequence[str], *, group: str, entry_id: str, counter: str, now: int
    ) -> tuple[str, str]:
        """Run ``settle.lua``; keys are position, feed."""
        return await self._call(self._settle, keys, [group, entry_id, counter, now])

    async def dead_letter(
        self, keys: Sequence[str], args: Sequence[str | int | bytes]
    ) -> tuple[str, str]:
        """Run ``dead_letter.lua``; keys are dead letters, position, feed."""
        return await self._call(self._dead_letter, keys, args)
