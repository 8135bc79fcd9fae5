"""What every scripted projection shares: its name, its scripts and the settling of entries."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import ClassVar, Final, Self

from eventstore.store import Store
from eventstore.wire.keys import shard_of
from eventstore.writer import now_ms
from projections.feed import FeedEntry, Outcome, unsettled_entry
from projections.generations import group_name
from projections.scripts import (
    DeadLetterArgv,
    DeadLetterKeys,
    DeadLetterScript,
    ProjectionScripts,
    SettleArgv,
    SettleKeys,
    SettleScript,
    ShardKeys,
)

#: Most dead letters kept per shard; older ones are trimmed by length.
DEAD_LETTER_CAP: Final = 10_000


class BaseProjection(ABC):
    """A projection whose writes are the scripts in ``projections/scripts``.

    ``family`` names the projection (``receipts``); ``generation`` says which of its
    rebuilt outputs this instance writes (:mod:`projections.generations`).
    """

    family: ClassVar[str]

    def __init__(self, store: Store, *, generation: int = 1) -> None:
        self.store = store
        self.generation = generation
        self._name = group_name(self.family, generation)
        self.scripts = ProjectionScripts(store.client)

    @property
    def name(self) -> str:
        """The consumer group name: the family, with the generation when above 1."""
        return self._name

    def at_generation(self, generation: int) -> Self:
        """Return a fresh instance of this projection writing ``generation``."""
        return type(self)(self.store, generation=generation)

    @abstractmethod
    async def apply_batch(self, entries: Sequence[FeedEntry]) -> list[Outcome]:
        """Project and settle ``entries`` in one read and one script; each one's outcome.

        Per invocation only the entry of the highest version is projected, from the
        record as it is now (:func:`latest_per_invocation`); the others carry nothing
        newer and are settled as stale with it.
        """

    async def apply(self, entry: FeedEntry) -> Outcome:
        """Project one entry from the record as it is now; return how it was settled."""
        return (await self.apply_batch([entry]))[0]

    async def project_record(self, run_id: str, tool_call_id: str) -> Outcome:
        """Project the record as it is now, settling no feed entry (rebuilds)."""
        shard = shard_of(run_id, self.store.keys.shards)
        return (await self.apply_batch([unsettled_entry(shard, run_id, tool_call_id)]))[0]

    def position_key(self, shard: int) -> str:
        """This projection's position hash in ``shard``."""
        return self.store.keys.position(shard, self._name)

    def shard_keys(self, entries: Sequence[FeedEntry]) -> tuple[dict[int, int], list[ShardKeys]]:
        """Number the shards of a batch 1, 2, ... and list their position and feed keys.

        A batch script's items name their shard by that number.
        """
        numbers: dict[int, int] = {}
        shards: list[ShardKeys] = []
        for entry in entries:
            if entry.shard not in numbers:
                numbers[entry.shard] = len(numbers) + 1
                shards.append(
                    ShardKeys(self.position_key(entry.shard), self.store.keys.feed(entry.shard))
                )
        return numbers, shards

    async def settle(self, shard: int, entry_id: str, counter: str) -> Outcome:
        """Acknowledge an entry that yields no output, counting it under ``counter``.

        ``counter`` is ``stale`` for an entry the projection already went past, else the
        reason it has nothing to project (``expired``, ``gone``).
        """
        settled = await self.scripts.settle(
            SettleScript.arguments(
                SettleKeys(position=self.position_key(shard), feed=self.store.keys.feed(shard)),
                SettleArgv(group=self._name, entry_id=entry_id, counter=counter, now_ms=now_ms()),
            )
        )
        if not settled:
            return Outcome.DUPLICATE
        return Outcome.STALE if counter == Outcome.STALE.value else Outcome.EXPIRED

    async def dead_letter(
        self,
        shard: int,
        entry_id: str,
        fields: Mapping[bytes, bytes],
        *,
        reason: str,
        error: str,
        deliveries: int,
    ) -> bool:
        """Move an entry to the shard's dead letters and acknowledge it.

        Returns False when the entry had already been settled by another consumer.
        """
        keys = self.store.keys
        pairs: list[bytes] = []
        for name, value in fields.items():
            pairs += (b"f:" + name, value)
        return await self.scripts.dead_letter(
            DeadLetterScript.arguments(
                DeadLetterKeys(
                    dead_letters=keys.dead_letters(shard),
                    position=self.position_key(shard),
                    feed=keys.feed(shard),
                ),
                DeadLetterArgv(
                    group=self._name,
                    entry_id=entry_id,
                    reason=reason,
                    error_type=error,
                    deliveries=deliveries,
                    now_ms=now_ms(),
                    cap=DEAD_LETTER_CAP,
                ),
                group_args=pairs,
            )
        )


def latest_per_invocation(entries: Sequence[FeedEntry]) -> dict[tuple[str, str], FeedEntry]:
    """The entry of the highest version of each invocation (run id, tool call id) of a batch."""
    latest: dict[tuple[str, str], FeedEntry] = {}
    for entry in entries:
        invocation = (entry.run_id, entry.tool_call_id)
        if invocation not in latest or entry.version > latest[invocation].version:
            latest[invocation] = entry
    return latest


def settled_without_output(
    entries: Sequence[FeedEntry], produced: set[tuple[int, str]], expired: set[tuple[str, str]]
) -> list[tuple[FeedEntry, Outcome]]:
    """The entries of a batch that produce no output, with the counter each is settled under.

    ``produced`` names the entries (shard, entry id) whose output the batch writes;
    ``expired`` the invocations (run id, tool call id) whose record is gone. Entries
    without an id (a rebuild's) settle nothing.
    """
    return [
        (entry, Outcome.EXPIRED if (entry.run_id, entry.tool_call_id) in expired else Outcome.STALE)
        for entry in entries
        if entry.entry_id and (entry.shard, entry.entry_id) not in produced
    ]


def batch_outcomes(
    entries: Sequence[FeedEntry],
    produced: Mapping[tuple[int, str], Outcome],
    rest: Sequence[tuple[FeedEntry, Outcome]],
    rest_replies: Sequence[str],
) -> list[Outcome]:
    """The outcome of every entry of a batch, in order, from a batch script's replies.

    ``produced`` holds the outcomes of the entries that wrote output; ``rest`` and
    ``rest_replies`` the others, as :func:`settled_without_output` listed them and as the
    script answered them ("duplicate" when already settled).
    """
    outcomes = dict(produced)
    for (entry, counter), reply in zip(rest, rest_replies, strict=True):
        outcomes[(entry.shard, entry.entry_id)] = (
            Outcome.DUPLICATE if reply == "duplicate" else counter
        )
    for entry in entries:
        if not entry.entry_id:
            # A rebuild's record that is gone settles nothing and writes nothing.
            outcomes.setdefault((entry.shard, ""), Outcome.EXPIRED)
    return [outcomes[(entry.shard, entry.entry_id)] for entry in entries]
