"""The projection scripts (``projections/scripts``), each wrapped in one typed class.

Every write script stores a projection's output, moves its per-shard position and
acknowledges the entry in one step. Scripts are loaded by the store's one loader
(:mod:`eventstore.wire.lua`); ``helpers.lua`` (pending check, settling) and ``batch_put.lua``
(the loop of the batch scripts) are included with ``-- @include``. A wrapper's
``layout`` is its script's KEYS and ARGV in order (checked against the header by a
test) and its ``arguments`` the only code that fills them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, NamedTuple

from redis.asyncio import Redis
from redis.typing import EncodableT

from eventstore.errors import RebuildLost, redis_errors
from eventstore.wire.batching import ScriptBatcher
from eventstore.wire.lua import KeysAndArgs, Layout, LuaScript, ScriptFolder
from eventstore.wire.replies import reply_text

#: The projections' scripts folder.
FOLDER: Final = ScriptFolder("projections")


class ShardKeys(NamedTuple):
    """The position hash and feed of one shard of a batch (shards are numbered from 1)."""

    position: str
    feed: str


class Unproduced(NamedTuple):
    """An entry a batch settles without output: its shard number, id and counter."""

    shard: int
    entry_id: str
    counter: str


class ReceiptPut(NamedTuple):
    """One receipt a batch stores: its keys, its entry (id "" for none) and its body."""

    receipt_key: str
    record: str
    shard: int
    entry_id: str
    version: int
    receipt: bytes


class ViewPut(NamedTuple):
    """One invocation's status a batch folds into its run's view (facts b"": unchanged)."""

    view: str
    run: str
    shard: int
    entry_id: str
    tool_call_id: str
    version: int
    status: str
    evidence_status: str
    updated_at_ms: int
    facts: bytes
    covered: int


class BatchReply(NamedTuple):
    """A batch script's answer.

    Attributes:
        written: per item, its outcome ("applied", "stale", "expired", "duplicate") and
            the version the output holds (0 when none).
        settled: per entry settled without output, "settled" or "duplicate".

    """

    written: list[tuple[str, int]]
    settled: list[str]


def _batch_reply(reply: Any, items: int) -> BatchReply:
    pairs = [(reply_text(reply[i]), int(reply[i + 1])) for i in range(0, len(reply), 2)]
    return BatchReply(pairs[:items], [outcome for outcome, _ in pairs[items:]])


def _batch_head(
    group: str, now_ms: int, shards: Sequence[ShardKeys], items: int
) -> tuple[list[str], list[EncodableT]]:
    keys = [key for shard in shards for key in shard]
    return keys, [group, now_ms, len(shards), items]


class ReceiptsPutScript(LuaScript):
    """``receipts_put.lua``: store receipts version-guarded and settle a batch of entries."""

    name = "receipts_put"
    layout = Layout(
        argv=("group", "now_ms", "shards", "items"),
        key_groups=(("position", "feed"), ("receipt", "record")),
        argv_groups=(("shard", "entry_id", "version", "receipt"), ("shard", "entry_id", "counter")),
    )

    @staticmethod
    def arguments(
        *,
        group: str,
        now_ms: int,
        shards: Sequence[ShardKeys],
        receipts: Sequence[ReceiptPut],
        unproduced: Sequence[Unproduced],
    ) -> KeysAndArgs:
        """KEYS and ARGV of one batch; an item names its shard by its number in ``shards``."""
        keys, args = _batch_head(group, now_ms, shards, len(receipts))
        for put in receipts:
            keys += (put.receipt_key, put.record)
            args += (put.shard, put.entry_id, put.version, put.receipt)
        for entry in unproduced:
            args += (entry.shard, entry.entry_id, entry.counter)
        return keys, args

    async def __call__(self, call: KeysAndArgs) -> BatchReply:
        """Run the batch; one outcome per receipt, then per unproduced entry.

        Raises:
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            reply = await self._call(self.script, call[0], call[1])
        return _batch_reply(reply, int(call[1][3]))


class ViewsPutScript(LuaScript):
    """``views_put.lua``: fold invocations' statuses into their runs' views, settling entries."""

    name = "views_put"
    layout = Layout(
        argv=("group", "now_ms", "shards", "items"),
        key_groups=(("position", "feed"), ("view", "run")),
        argv_groups=(
            (
                "shard",
                "entry_id",
                "tool_call_id",
                "version",
                "status",
                "evidence_status",
                "updated_at_ms",
                "facts",
                "covered",
            ),
            ("shard", "entry_id", "counter"),
        ),
    )

    @staticmethod
    def arguments(
        *,
        group: str,
        now_ms: int,
        shards: Sequence[ShardKeys],
        views: Sequence[ViewPut],
        unproduced: Sequence[Unproduced],
    ) -> KeysAndArgs:
        """KEYS and ARGV of one batch; an item names its shard by its number in ``shards``."""
        keys, args = _batch_head(group, now_ms, shards, len(views))
        for put in views:
            keys += (put.view, put.run)
            args += (put.shard, put.entry_id, put.tool_call_id, put.version, put.status)
            args += (put.evidence_status, put.updated_at_ms, put.facts, put.covered)
        for entry in unproduced:
            args += (entry.shard, entry.entry_id, entry.counter)
        return keys, args

    async def __call__(self, call: KeysAndArgs) -> BatchReply:
        """Run the batch; one outcome per view item, then per unproduced entry.

        Raises:
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            reply = await self._call(self.script, call[0], call[1])
        return _batch_reply(reply, int(call[1][3]))


class ReadSnapshotsScript(LuaScript):
    """``read_snapshots.lua``: read several invocations' records and streams in one step."""

    name = "read_snapshots"
    layout = Layout(key_groups=(("record", "stream"),), argv_groups=(("field",),))

    @staticmethod
    def arguments(*, invocations: Sequence[tuple[str, str]], fields: Sequence[str]) -> KeysAndArgs:
        """KEYS and ARGV of one read: (record, stream) of each invocation, the fields."""
        return [key for pair in invocations for key in pair], list(fields)

    async def __call__(self, call: KeysAndArgs) -> list[tuple[list[Any], list[Any]]]:
        """Per invocation, the record's values of the fields and the stream's entries.

        Raises:
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            reply = await self._call(self.script, call[0], call[1])
        return [(reply[i], reply[i + 1]) for i in range(0, len(reply), 2)]


class SettleScript(LuaScript):
    """``settle.lua``: acknowledge an entry that produces no output, counting why."""

    name = "settle"
    layout = Layout(keys=("position", "feed"), argv=("group", "entry_id", "counter", "now_ms"))

    @staticmethod
    def arguments(
        *, position: str, feed: str, group: str, entry_id: str, counter: str, now_ms: int
    ) -> KeysAndArgs:
        """KEYS and ARGV of one call."""
        return [position, feed], [group, entry_id, counter, now_ms]

    async def __call__(self, call: KeysAndArgs) -> bool:
        """Settle the entry; False when it was already settled (nothing changed).

        Raises:
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            reply = await self._call(self.script, call[0], call[1])
        return reply_text(reply[0]) == "settled"


class DeadLetterScript(LuaScript):
    """``dead_letter.lua``: move an entry that failed too often to the dead letters."""

    name = "dead_letter"
    layout = Layout(
        keys=("dead_letters", "position", "feed"),
        argv=("group", "entry_id", "reason", "error_type", "deliveries", "now_ms", "cap"),
        argv_groups=(("field", "value"),),
    )

    @staticmethod
    def arguments(
        *,
        dead_letters: str,
        position: str,
        feed: str,
        group: str,
        entry_id: str,
        reason: str,
        error_type: str,
        deliveries: int,
        now_ms: int,
        cap: int,
        fields: Sequence[EncodableT],
    ) -> KeysAndArgs:
        """KEYS and ARGV of one call; ``fields`` are the entry's pairs, names prefixed."""
        args: list[EncodableT] = [group, entry_id, reason, error_type, deliveries, now_ms, cap]
        return [dead_letters, position, feed], [*args, *fields]

    async def __call__(self, call: KeysAndArgs) -> bool:
        """Dead-letter the entry; False when it was already settled (nothing changed).

        Raises:
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            reply = await self._call(self.script, call[0], call[1])
        return reply_text(reply[0]) == "dead"


class SwitchGenerationScript(LuaScript):
    """``switch_generation.lua``: make a rebuilt generation the one readers use."""

    name = "switch_generation"
    layout = Layout(keys=("meta",), argv=("projection", "token", "generation"))

    @staticmethod
    def arguments(*, meta: str, projection: str, token: str, generation: int) -> KeysAndArgs:
        """KEYS and ARGV of one call."""
        return [meta], [projection, token, generation]

    async def __call__(self, call: KeysAndArgs) -> int:
        """Switch; return the generation readers used before.

        Raises:
            RebuildLost: the claim is no longer the caller's (nothing changed).
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            reply = await self._call(self.script, call[0], call[1])
        if reply_text(reply[0]) != "switched":
            raise RebuildLost("the rebuild's claim was taken over before the switch")
        return int(reply[1])


#: Every wrapper of this folder (the header test walks them).
WRAPPERS: Final = (
    ReceiptsPutScript,
    ViewsPutScript,
    ReadSnapshotsScript,
    SettleScript,
    DeadLetterScript,
    SwitchGenerationScript,
)


class ProjectionScripts:
    """The workers' projection scripts registered on one client.

    Calls go through a :class:`ScriptBatcher`: the shard loops of a worker that call in
    the same event-loop turn share a round trip, and hiredis packs the arguments in C.
    Every script here is safe to send again (reads, or writes that settle an entry only
    while it is pending), as the batcher requires. (``switch_generation`` is a rebuild's,
    sent alone: :class:`SwitchGenerationScript`.)
    """

    def __init__(self, client: Redis) -> None:
        call = ScriptBatcher(client).call
        self.receipts_put = ReceiptsPutScript(client, FOLDER, call)
        self.views_put = ViewsPutScript(client, FOLDER, call)
        self.read_snapshots = ReadSnapshotsScript(client, FOLDER, call)
        self.settle = SettleScript(client, FOLDER, call)
        self.dead_letter = DeadLetterScript(client, FOLDER, call)
