"""The projection scripts (``projections/scripts``), each wrapped in one typed class.

Every write script stores a projection's output, moves its per-shard position and
acknowledges the entry in one step. Scripts are loaded by the store's one loader
(:mod:`eventstore.wire.lua`); ``helpers.lua`` (pending check, settling) and ``batch_put.lua``
(the loop of the batch scripts) are included with ``-- @include``. A script's
KEYS and ARGV are declared once, in order, by ``NamedTuple`` classes (one per repeated
group too): the wrapper's ``layout`` is derived from them (and checked against the
header by a test), and so is the packing of a call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Generic, NamedTuple, TypeVar

from redis.asyncio import Redis

from eventstore.errors import RebuildLost, redis_errors
from eventstore.wire.batching import ScriptBatcher
from eventstore.wire.lua import (
    FIELD_VALUE,
    NOTHING,
    KeysAndArgs,
    Layout,
    LuaScript,
    Nothing,
    ScriptFolder,
    flat,
)
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


class BatchArgv(NamedTuple):
    """A batch script's fixed ARGV: its group, the time, and how many shards and items."""

    group: str
    now_ms: int
    shards: int
    items: int


class ReceiptKeys(NamedTuple):
    """The keys of one receipt a batch stores: the receipt and its invocation's record."""

    receipt: str
    record: str


class ReceiptArgs(NamedTuple):
    """One receipt a batch stores: its entry (id "" for none), version and body."""

    shard: int
    entry_id: str
    version: int
    receipt: bytes


class ReceiptPut(NamedTuple):
    """One receipt a batch stores: its keys and its arguments."""

    keys: ReceiptKeys
    args: ReceiptArgs


class ViewKeys(NamedTuple):
    """The keys of one view item: the run's view and the run's registry hash."""

    view: str
    run: str


class ViewArgs(NamedTuple):
    """One invocation's status a batch folds into its run's view (facts b"": unchanged)."""

    shard: int
    entry_id: str
    tool_call_id: str
    version: int
    status: str
    evidence_status: str
    updated_at_ms: int
    facts: bytes
    covered: int


class ViewPut(NamedTuple):
    """One view item a batch folds in: its keys and its arguments."""

    keys: ViewKeys
    args: ViewArgs


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


#: Where a batch's item count is in its ARGV (the reply is split there).
_ITEMS: Final = BatchArgv._fields.index("items")


#: One item of a batch: a receipt or a view item, each with its keys and its arguments.
PutT = TypeVar("PutT", ReceiptPut, ViewPut)


class _BatchScript(LuaScript[Nothing, BatchArgv], Generic[PutT]):
    """A batch script: stores items version-guarded and settles the batch's entries."""

    @staticmethod
    def batch(
        group: str,
        now_ms: int,
        shards: Sequence[ShardKeys],
        puts: Sequence[PutT],
        unproduced: Sequence[Unproduced],
    ) -> KeysAndArgs:
        """KEYS and ARGV of one batch; an item names its shard by its number in ``shards``."""
        return LuaScript.arguments(
            NOTHING,
            BatchArgv(group, now_ms, len(shards), len(puts)),
            group_keys=[*flat(shards), *flat(put.keys for put in puts)],
            group_args=[*flat(put.args for put in puts), *flat(unproduced)],
        )

    async def __call__(self, call: KeysAndArgs) -> BatchReply:
        """Run the batch; one outcome per item, then per entry settled without output.

        Raises:
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            reply = await self._call(self.script, call[0], call[1])
        return _batch_reply(reply, int(call[1][_ITEMS]))


class ReceiptsPutScript(_BatchScript[ReceiptPut]):
    """``receipts_put.lua``: store receipts version-guarded and settle a batch of entries."""

    name = "receipts_put"
    layout = Layout.of(
        argv=BatchArgv,
        key_groups=(ShardKeys, ReceiptKeys),
        argv_groups=(ReceiptArgs, Unproduced),
    )


class ViewsPutScript(_BatchScript[ViewPut]):
    """``views_put.lua``: fold invocations' statuses into their runs' views, settling entries."""

    name = "views_put"
    layout = Layout.of(
        argv=BatchArgv,
        key_groups=(ShardKeys, ViewKeys),
        argv_groups=(ViewArgs, Unproduced),
    )


class SnapshotKeys(NamedTuple):
    """The keys of one invocation a snapshot read covers: its record and its stream."""

    record: str
    stream: str


class ReadSnapshotsScript(LuaScript[Nothing, Nothing]):
    """``read_snapshots.lua``: read several invocations' records and streams in one step."""

    name = "read_snapshots"
    layout = Layout.of(key_groups=(SnapshotKeys,), argv_groups=(("field",),))

    @classmethod
    def reading(cls, invocations: Sequence[SnapshotKeys], fields: Sequence[str]) -> KeysAndArgs:
        """KEYS and ARGV of one read: the invocations' keys, then the fields to read."""
        return cls.arguments(NOTHING, NOTHING, group_keys=flat(invocations), group_args=fields)

    async def __call__(self, call: KeysAndArgs) -> list[tuple[list[Any], list[Any]]]:
        """Per invocation, the record's values of the fields and the stream's entries.

        Raises:
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            reply = await self._call(self.script, call[0], call[1])
        return [(reply[i], reply[i + 1]) for i in range(0, len(reply), 2)]


class SettleKeys(NamedTuple):
    """``settle.lua``'s KEYS, in order."""

    position: str
    feed: str


class SettleArgv(NamedTuple):
    """``settle.lua``'s ARGV, in order."""

    group: str
    entry_id: str
    counter: str
    now_ms: int


class SettleScript(LuaScript[SettleKeys, SettleArgv]):
    """``settle.lua``: acknowledge an entry that produces no output, counting why."""

    name = "settle"
    layout = Layout.of(SettleKeys, SettleArgv)

    async def __call__(self, call: KeysAndArgs) -> bool:
        """Settle the entry; False when it was already settled (nothing changed).

        Raises:
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            reply = await self._call(self.script, call[0], call[1])
        return reply_text(reply[0]) == "settled"


class DeadLetterKeys(NamedTuple):
    """``dead_letter.lua``'s KEYS, in order."""

    dead_letters: str
    position: str
    feed: str


class DeadLetterArgv(NamedTuple):
    """``dead_letter.lua``'s fixed ARGV, in order (the entry's pairs follow, names prefixed)."""

    group: str
    entry_id: str
    reason: str
    error_type: str
    deliveries: int
    now_ms: int
    cap: int


class DeadLetterScript(LuaScript[DeadLetterKeys, DeadLetterArgv]):
    """``dead_letter.lua``: move an entry that failed too often to the dead letters."""

    name = "dead_letter"
    layout = Layout.of(DeadLetterKeys, DeadLetterArgv, argv_groups=(FIELD_VALUE,))

    async def __call__(self, call: KeysAndArgs) -> bool:
        """Dead-letter the entry; False when it was already settled (nothing changed).

        Raises:
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            reply = await self._call(self.script, call[0], call[1])
        return reply_text(reply[0]) == "dead"


class SwitchGenerationKeys(NamedTuple):
    """``switch_generation.lua``'s KEYS."""

    meta: str


class SwitchGenerationArgv(NamedTuple):
    """``switch_generation.lua``'s ARGV, in order."""

    projection: str
    token: str
    generation: int


class SwitchGenerationScript(LuaScript[SwitchGenerationKeys, SwitchGenerationArgv]):
    """``switch_generation.lua``: make a rebuilt generation the one readers use."""

    name = "switch_generation"
    layout = Layout.of(SwitchGenerationKeys, SwitchGenerationArgv)

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
