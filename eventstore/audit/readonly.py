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
from eventstore.keyring import Keyring, KeyringError, UnknownKey
from eventstore.reader import StoredEvent, stored_events
from eventstore.sealing import (
    SEALED_FIELDS,
    KeyErased,
    RunSeal,
    SealBroken,
    has_sealed,
    is_sealed,
)
from eventstore.store import Store, namespace_keys
from eventstore.wire.keys import DEFAULT_SHARDS, Keys, registered_call_id, split_identity
from machine.ids import invocation_id


@asynccontextmanager
async def open_read_only(
    url: str,
    *,
    namespace: str,
    shards: int | None = None,
    cluster: bool = False,
    keys: Keyring | None = None,
) -> AsyncIterator[Store]:
    """Yield a store on ``url`` that is only read; its shard count comes from the namespace.

    ``shards`` is used only when the namespace metadata cannot be read (nothing written
    yet, or ``url`` is one primary of a cluster that does not hold it; None: the default
    count); the key layout is then the current one. With ``cluster``, ``url`` names any
    node of a Redis Cluster. With ``keys`` (a keyring), payloads encrypted at rest are
    read opened.

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
        store = Store.from_url(url, namespace=namespace, shards=shards, cluster=cluster, keys=keys)
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
            store = Store.from_url(
                url, namespace=namespace, shards=int(stored), cluster=cluster, keys=keys
            )
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
    #: Read from an archive (the PTTLs are then -2: Redis holds neither key).
    archived: bool = False
    #: Payload fields encrypted at rest that the keyring read them with could not open
    #: (altered, moved, or a wrong key): judged as not having their digest.
    unopened: tuple[str, ...] = ()
    #: How the run's payload digests are taken, for payloads opened with a keyring (its
    #: digests are keyed by the run's data key); None: SHA-256.
    digest_of: Any = None

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


async def opened_snapshot(store: Store, snapshot: Snapshot) -> Snapshot:
    """``snapshot`` with its encrypted payloads opened, when ``store`` has a keyring.

    A payload that does not open is left as stored and named in ``unopened``; a run whose
    data key is gone (erased, expired) or wrapped by a key the keyring lacks leaves its
    payloads as stored (checked by size). Without a keyring: ``snapshot`` itself.

    Raises:
        StoreUnavailable: Redis failed or timed out.

    """
    seals = store.seals
    if seals is None or not has_sealed(snapshot.fields):
        return snapshot
    try:
        seal = await seals.for_reading(snapshot.run_id)
    except (KeyErased, UnknownKey, KeyringError):
        return snapshot
    return opened_with(seal, snapshot)


def opened_with(seal: RunSeal, snapshot: Snapshot) -> Snapshot:
    """``snapshot`` with its encrypted payloads opened by its run's ``seal``.

    A payload that does not open is left as stored and named in ``unopened``; the
    snapshot's digests are then taken as ``seal``'s (keyed by the run's data key).
    """
    invocation = invocation_id(snapshot.run_id, snapshot.tool_call_id)
    fields = dict(snapshot.fields)
    unopened: list[str] = []
    for name, value in snapshot.fields.items():
        if is_sealed(value) and name.decode() in SEALED_FIELDS:
            try:
                fields[name] = seal.open(name, invocation, value)
            except SealBroken:
                unopened.append(name.decode())
    return msgspec.structs.replace(
        snapshot, fields=fields, unopened=tuple(unopened), digest_of=seal.digest
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
    return await opened_snapshot(store, snapshot_of(run_id, tool_call_id, replies))


async def run_tool_call_ids(store: Store, run_id: str) -> list[str]:
    """Return the tool call ids of a run: its registry's invocations, then its progress list.

    Raises:
        StoreUnavailable: Redis failed or timed out.

    """
    keys = store.keys
    async with redis_errors(), store.client.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.run(run_id))
        pipe.lrange(keys.progress(run_id), 0, -1)
        run_fields, progress = await pipe.execute()
    found: dict[str, None] = {}
    for name, value in cast(dict[bytes, bytes], run_fields).items():
        if name.startswith(b"inv:"):
            found[registered_call_id(value)] = None
    for entry in cast(list[bytes], progress):
        owner, call = split_identity(entry.decode("utf-8", "replace"))
        if owner == run_id:
            found[call] = None
    return [call for call in found if keys.accepts_tool_call_id(call)]
