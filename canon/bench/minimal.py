"""The minimal floor's script (``canon/bench/scripts/minimal_write.lua``) and its wrapper.

The script does only the writes of one event (the record's fields, the event, the feed
entry, the first event's expiry), with the store's keys and bytes, so a mode that runs it
shows what the client and Redis cost when nothing else is done. The arguments of an
invocation's three calls are built by :meth:`canon.bench.workload.FloorArgs.minimal`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from redis.typing import EncodableT

from eventstore.errors import redis_errors
from eventstore.wire.lua import KeysAndArgs, Layout, LuaScript, ScriptFolder
from eventstore.wire.replies import reply_text

#: The benchmark's scripts folder.
FOLDER: Final = ScriptFolder("canon.bench")


class MinimalWriteScript(LuaScript):
    """``minimal_write.lua``: write one event's record fields, stream entry and feed entry."""

    name = "minimal_write"
    layout = Layout(
        keys=("record", "stream", "feed"),
        argv=(
            "event",
            "expires_at_ms",
            "run_id",
            "tool_call_id",
            "version",
            "type_code",
            "status_code",
        ),
        argv_groups=(("field", "value"),),
    )

    @staticmethod
    def arguments(
        *,
        record: str,
        stream: str,
        feed: str,
        event: bytes,
        expires_at_ms: int | None,
        run_id: str,
        tool_call_id: str,
        version: int,
        type_code: int,
        status_code: int,
        fields: Sequence[EncodableT],
    ) -> KeysAndArgs:
        """KEYS and ARGV of one call; ``expires_at_ms`` is None after the first event."""
        args: list[EncodableT] = [
            event,
            "" if expires_at_ms is None else expires_at_ms,
            run_id,
            tool_call_id,
            version,
            type_code,
            status_code,
            *fields,
        ]
        return [record, stream, feed], args

    async def __call__(self, call: KeysAndArgs) -> str:
        """Run the script with :meth:`arguments`' KEYS and ARGV; return the feed entry id.

        Raises:
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            reply = await self._call(self.script, call[0], call[1])
        return reply_text(reply)


#: Every wrapper of this folder (the header test walks them).
WRAPPERS: Final = (MinimalWriteScript,)
