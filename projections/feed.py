"""What a projection consumes: shard feed entries, and the contract a projection fulfils.

A feed entry is the small notification ``create.lua``/``append.lua`` add for every
committed event: ``r`` run id, ``c`` tool call id, ``v`` version, ``t`` event type and
``s`` public status, the last two as their permanent codes (:data:`TYPE_CODES`,
:data:`STATUS_CODES`); entries written before the codes spell them out, and still parse.
It never carries a payload; projections read what they need from the record itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Final, Protocol, runtime_checkable

import msgspec

from eventstore.errors import CanonError
from machine.codes import Status
from machine.compact import STATUS_CODES, TYPE_CODES
from machine.ids import is_run_id, is_tool_call_id

#: Event type of each ``t`` value a writer produces: its code, or (older entries) its name.
_EVENT_TYPE_OF: Final[dict[bytes, str]] = {
    **{str(code).encode(): kind for kind, code in TYPE_CODES.items()},
    **{kind.encode(): kind for kind in TYPE_CODES},
}
#: Status of each ``s`` value a writer produces: its code, or (older entries) its name.
_STATUS_OF: Final[dict[bytes, Status]] = {
    **{str(code).encode(): status for status, code in STATUS_CODES.items()},
    **{status.value.encode(): status for status in Status},
}


class MalformedEntry(CanonError, ValueError):
    """Raised when a feed entry lacks a field or holds a value no writer produces."""


class Outcome(StrEnum):
    """How a projection settled one delivered entry (each is acknowledged)."""

    APPLIED = "applied"
    STALE = "stale"
    EXPIRED = "expired"
    DUPLICATE = "duplicate"


class FeedEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One parsed shard feed entry.

    Attributes:
        shard: the shard whose feed holds the entry.
        entry_id: the feed stream entry id.
        run_id: the run of the invocation.
        tool_call_id: the framework's tool call id.
        version: the version the committed event gave the invocation.
        event_type: the event's permanent tag.
        status: the public status after the event.

    """

    shard: int
    entry_id: str
    run_id: str
    tool_call_id: str
    version: int
    event_type: str
    status: Status

    @classmethod
    def parse(cls, shard: int, entry_id: str, fields: Mapping[bytes, bytes]) -> FeedEntry:
        """Parse the raw fields of a feed entry.

        Raises:
            MalformedEntry: a field is missing or invalid.

        """
        try:
            entry = cls(
                shard=shard,
                entry_id=entry_id,
                run_id=fields[b"r"].decode(),
                tool_call_id=fields[b"c"].decode(),
                version=int(fields[b"v"]),
                event_type=_EVENT_TYPE_OF[fields[b"t"]],
                status=_STATUS_OF[fields[b"s"]],
            )
        except (KeyError, ValueError, UnicodeDecodeError):
            raise MalformedEntry("feed entry has missing or invalid fields") from None
        if not (is_run_id(entry.run_id) and is_tool_call_id(entry.tool_call_id)):
            raise MalformedEntry("feed entry names an unsafe id")
        if entry.version < 1:
            raise MalformedEntry("feed entry has an invalid version")
        return entry


def unsettled_entry(shard: int, run_id: str, tool_call_id: str) -> FeedEntry:
    """An entry without id, for projecting a record as it is now (a rebuild).

    The projection scripts write the output of such an entry and settle nothing.
    """
    return FeedEntry(
        shard=shard,
        entry_id="",
        run_id=run_id,
        tool_call_id=tool_call_id,
        version=0,
        event_type="",
        status=Status.PROJECTING,
    )


class FeedProjection(Protocol):
    """A consumer of the shard feeds (one Redis consumer group, named after it).

    ``apply`` must write its output, move its per-shard position and acknowledge the
    entry in one atomic step, and must be idempotent: applying an entry again, or an
    older one after a newer one, never regresses the output. It may raise; the entry
    then stays pending and is delivered again.
    """

    @property
    def name(self) -> str:
        """The projection's name, also its consumer group name."""

    async def apply(self, entry: FeedEntry) -> Outcome:
        """Project one entry; return how it was settled."""

    async def settle(self, shard: int, entry_id: str, counter: str) -> Outcome:
        """Acknowledge an entry that yields no output (its stream entry is gone)."""

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
        """Move an entry to the dead letters and acknowledge it; False if already settled."""

    async def applied_version(self, run_id: str, tool_call_id: str) -> int:
        """Return the version of the invocation this projection reflects (0 for none)."""


@runtime_checkable
class BatchProjection(Protocol):
    """A projection that can also settle a whole batch of entries at once.

    A batch may hold entries of several shards of one server; on a cluster, of one shard
    (one script's keys must share a slot).
    """

    async def apply_batch(self, entries: Sequence[FeedEntry]) -> list[Outcome]:
        """Project and settle ``entries``; return each one's outcome, in order.

        Raises on any failure, leaving it to the caller to settle the entries one by one
        (so that one bad entry fails alone).
        """
