"""The minimal floor's script (``canon/bench/scripts/minimal_write.lua``) and its wrapper.

The script does only the writes of one event (the record's fields, the event, the feed
entry, the first event's expiry), with the store's keys and bytes, so a mode that runs it
shows what the client and Redis cost when nothing else is done. The arguments of an
invocation's three calls are built by :meth:`canon.bench.workload.FloorArgs.minimal`.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from eventstore.errors import redis_errors
from eventstore.wire.lua import FIELD_VALUE, KeysAndArgs, Layout, LuaScript, ScriptFolder
from eventstore.wire.replies import reply_text

#: The benchmark's scripts folder.
FOLDER: Final = ScriptFolder("canon.bench")


class MinimalWriteKeys(NamedTuple):
    """``minimal_write.lua``'s KEYS, in order."""

    record: str
    stream: str
    feed: str


class MinimalWriteArgv(NamedTuple):
    """``minimal_write.lua``'s fixed ARGV, in order (the record's field/value pairs follow).

    ``expires_at_ms`` is ``""`` after the first event (the expiry is set once).
    """

    event: bytes
    expires_at_ms: int | str
    run_id: str
    tool_call_id: str
    version: int
    type_code: int
    status_code: int


class MinimalWriteScript(LuaScript[MinimalWriteKeys, MinimalWriteArgv]):
    """``minimal_write.lua``: write one event's record fields, stream entry and feed entry."""

    name = "minimal_write"
    layout = Layout.of(MinimalWriteKeys, MinimalWriteArgv, argv_groups=(FIELD_VALUE,))

    async def __call__(self, call: KeysAndArgs) -> str:
        """Run the script; return the feed entry id.

        Raises:
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            reply = await self._call(self.script, call[0], call[1])
        return reply_text(reply)


#: Every wrapper of this folder (the header test walks them).
WRAPPERS: Final = (MinimalWriteScript,)
