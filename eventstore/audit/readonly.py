"""Opening a store for audit without writing a byte, and reading one invocation consistently.

``Store.__aenter__`` records the namespace's shard count (a write), so the audit tools open
the store here instead: the shard count and the key layout are read from the namespace
metadata (no layout there: the legacy layout, see :mod:`eventstore.wire.keys`), and every
command issued by this package is a read (HGETALL, HGET, XRANGE, PTTL, SCAN, LRANGE,
XLEN, XINFO, INFO, CONFIG GET). No read here can set, extend or refresh an expiry.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import msgspec
import redis.exceptions
from redis.asyncio.client import Pipeline

from eventstore.errors import InvalidArgument, redis_errors
from eventstore.reader import StoredEvent, stored_events
from eventstore.store import Store, namespace_keys
from eventstore.wire.keys import DEFAULT_SHARDS, Keys


@asynccontextmanager
async def open_read_only(
    url: str, *, namespace: str, shards: int | None = None, cluster: bool = False
) -> AsyncIterator[Store]:
    """Yield a store on ``url`` that is only read; its shard count comes from the namespace.

    ``shards`` is used only when the namespace metadata cannot be read (nothing written
    yet, or ``url`` is one primary of a cluster that does not hold it; None: the default
    count); the key layout is then the current one. With ``cluster``, ``url`` names any
    node of a Redis Cluster.

    Raises:
        InvalidArgument: the namespace or shard count is not acceptable, or the URL is
            invalid (the message never repeats the URL).
        NamespaceMismatch: the namespace records a key layout this version does not know.
        StoreUnavailable: Redis cannot be reached.

    """
    shards = DEFAULT_SHARDS if shards is None else shards
    try:
        Keys(namespace, shards)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    try:
        store = Store.from_url(url, namespace=namespace, shards=shards, cluster=cluster)
    except ValueError:
        raise InvalidArgument("invalid Redis URL") from None
    try:
        async with redis_errors():
            try:
                stored, layout = cast(
                    list[bytes | None],
                    await store.client.hmget(store.keys.meta(), ["shards", "layout"]),
                )
            except redis.exceptions.MovedError:
                # One primary of a cluster, addressed directly: the metadata lives elsewhere,
                # so the caller's shard count stands.
                stored = layout = None
        if stored is not None and int(stored) != shards:
            await store.aclose()
            store = Store.from_url(url, namespace=namespace, shards=int(stored), cluster=cluster)
        if stored is not None:
            store.use_keys(namespace_keys(store.keys, layout))
        yield store
    finally:
        await store.aclose()


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """One invocation's record and stream as read together, with both remaining TTLs.

    Attributes:
        run_id: the run, taken from the key.
        tool_call_id: the tool call id, taken from the key.
        fields: the record hash (empty when the record is absent).
        events: the stream's events in order (empty when the stream is absent).
        record_pttl_ms: PTTL of the record (-2 absent, -1 no expiry).
        stream_pttl_ms: PTTL of the stream (-2 absent, -1 no expiry).

    """

    run_id: str
    tool_call_id: str
    fields: dict[bytes, bytes]
    events: list[StoredEvent]
    record_pttl_ms: int
    stream_pttl_ms: int

    @property
    def exists(self) -> bool:
        """Whether the record or the stream is present."""
        return bool(self.fields) or bool(self.events)


def queue_snapshot(pipe: Pipeline, keys: Keys, run_id: str, tool_call_id: str) -> None:
    """Queue the four reads of one snapshot on ``pipe`` (read with :func:`snapshot_of`)."""
    record, stream = keys.record(run_id, tool_call_id), keys.stream(run_id, tool_call_id)
    pipe.hgetall(record)
    pipe.xrange(stream)
    pipe.pttl(record)
    pipe.pttl(stream)


def snapshot_of(run_id: str, tool_call_id: str, replies: list[Any]) -> Snapshot:
    """Build a snapshot from the four replies queued by :func:`queue_snapshot`."""
    fields, entries, record_pttl, stream_pttl = replies
    return Snapshot(
        run_id=run_id,
        tool_call_id=tool_call_id,
        fields=cast(dict[bytes, bytes], fields),
        events=stored_events(cast(list[tuple[bytes, dict[bytes, bytes]]], entries)),
        record_pttl_ms=int(record_pttl),
        stream_pttl_ms=int(stream_pttl),
    )


async def read_snapshot(store: Store, run_id: str, tool_call_id: str) -> Snapshot:
    """Read one invocation atomically (MULTI/EXEC on its shard), so a live write cannot split it.

    On a Redis Cluster the four reads are pipelined to the one node of their slot, without
    MULTI; a write landing between them can then show as a passing mismatch.

    Raises:
        StoreUnavailable: Redis failed or timed out.

    """
    atomic = store.cluster is None
    async with redis_errors(), store.client.pipeline(transaction=atomic) as pipe:
        queue_snapshot(pipe, store.keys, run_id, tool_call_id)
        replies = await pipe.execute()
    return snapshot_of(run_id, tool_call_id, replies)
