"""Consistent, read-only reads of what a receipt is built from.

The record's receipt fields and its event stream are read in one MULTI/EXEC on the
run's shard, so a write landing between two reads can never make an intact journal look
like it disagrees with its record. Only HMGET, XRANGE and HGET are issued: no read here
touches a payload other than the bounded result, and none changes an expiry.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from eventstore.errors import redis_errors
from eventstore.reader import StoredEvent, stored_events
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.events import EVENT_TYPES
from machine.fold import InvocationState
from machine.results import SAME_AS_RAW
from projections.receipts.builder import Receipt, build_receipt
from projections.receipts.journal import view_of_fields

#: Record fields a receipt may read: the lifecycle state, ids, expiry, the bounded result
#: and the event-id fields (a valid stream has at most one event of each type).
RECEIPT_FIELDS: Final = (
    *InvocationState.__struct_fields__,
    "invocation_id",
    "expires_at_ms",
    "result",
    *(f"e{position}" for position in range(1, len(EVENT_TYPES) + 1)),
)


class ReceiptSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """The receipt fields of one record and its events, read together.

    Attributes:
        fields: the record fields present ({} when the record is absent or expired).
        events: the stream's events in order ([] when the stream is absent).
        observed_at_ms: when the read was made.

    """

    fields: dict[str, bytes]
    events: list[StoredEvent]
    observed_at_ms: int

    @property
    def exists(self) -> bool:
        """Whether the record or its stream is present."""
        return bool(self.fields) or bool(self.events)

    @property
    def version(self) -> int:
        """The record's version, else the number of events (0 when neither is known)."""
        try:
            return int(self.fields["version"])
        except (KeyError, ValueError):
            return len(self.events)


async def read_receipt_snapshot(store: Store, run_id: str, tool_call_id: str) -> ReceiptSnapshot:
    """Read one invocation's receipt fields and stream atomically.

    Raises:
        StoreUnavailable: Redis failed or timed out.

    """
    keys = store.keys
    async with redis_errors(), store.client.pipeline(transaction=True) as pipe:
        pipe.hmget(keys.record(run_id, tool_call_id), list(RECEIPT_FIELDS))
        pipe.xrange(keys.stream(run_id, tool_call_id))
        values, entries = await pipe.execute()
    snapshot = receipt_snapshot_of(values, entries, now_ms())
    return await with_shared_result(store, run_id, tool_call_id, snapshot)


async def with_shared_result(
    store: Store, run_id: str, tool_call_id: str, snapshot: ReceiptSnapshot
) -> ReceiptSnapshot:
    """``snapshot``, its result read from ``raw`` when it was stored once there.

    One more read, only for such a record (a large result equal to its raw response,
    :data:`~machine.results.SAME_AS_RAW`); the raw response is written before the result
    and never changes, so the two reads agree. A record gone meanwhile keeps the marker,
    which no digest matches: its receipt says the record and journal disagree.

    Raises:
        StoreUnavailable: Redis failed or timed out.

    """
    if snapshot.fields.get("result") != SAME_AS_RAW:
        return snapshot
    async with redis_errors():
        raw = await store.client.hget(store.keys.record(run_id, tool_call_id), "raw")
    if raw is None:
        return snapshot
    return msgspec.structs.replace(snapshot, fields={**snapshot.fields, "result": raw})


def receipt_snapshot_of(
    values: list[bytes | None], entries: list[Any], observed_at_ms: int
) -> ReceiptSnapshot:
    """Build a snapshot from the HMGET values of :data:`RECEIPT_FIELDS` and XRANGE entries.

    ``entries`` may be as redis-py parses XRANGE (id, field dict) or as a script returns
    it (id, flat field list).
    """
    fields = {
        name: value for name, value in zip(RECEIPT_FIELDS, values, strict=True) if value is not None
    }
    pairs = [
        (
            entry_id,
            body if isinstance(body, dict) else dict(zip(body[::2], body[1::2], strict=True)),
        )
        for entry_id, body in entries
    ]
    return ReceiptSnapshot(
        fields=fields, events=stored_events(pairs), observed_at_ms=observed_at_ms
    )


def receipt_of(store: Store, snapshot: ReceiptSnapshot) -> Receipt:
    """Build the receipt of a snapshot with the store's limits.

    Raises:
        ValueError: the snapshot names no invocation (check :attr:`ReceiptSnapshot.exists`).

    """
    return build_receipt(
        view_of_fields(snapshot.fields),
        snapshot.events,
        observed_at_ms=snapshot.observed_at_ms,
        result_limit_bytes=store.settings.limits.result_bytes,
    )
