"""Where the audit tools read a run from: Redis, or an archive that kept it after the TTL.

:class:`AuditSource` is the small interface replay, export and the console read
through; :class:`RedisSource` is Redis itself (a read-only store). An archive offers the
same interface (``projections.archive.source``), so an archived run is judged exactly as
a live one: the same snapshots (record fields and events), the same checks, the same
output. This package never imports the archive: the interface points down, not up.
"""

from __future__ import annotations

from typing import Protocol, cast, runtime_checkable

from eventstore.audit.readonly import Snapshot, read_snapshot, run_tool_call_ids
from eventstore.erasure import TOMBSTONE_FIELDS, Erasure, erasure_of
from eventstore.errors import redis_errors
from eventstore.runs import Refusal, RunInfo
from eventstore.store import Store


@runtime_checkable
class AuditSource(Protocol):
    """What the audit tools read of a run, wherever it is kept."""

    @property
    def namespace(self) -> str:
        """The namespace read."""

    @property
    def archived(self) -> bool:
        """True for an archive (Redis no longer holds what it gives), False for Redis."""

    async def tool_call_ids(self, run_id: str) -> list[str]:
        """The run's calls, oldest first where known."""

    async def snapshot(self, run_id: str, tool_call_id: str) -> Snapshot:
        """One invocation's record and events (``exists`` False when neither is kept)."""

    async def run_info(self, run_id: str) -> RunInfo | None:
        """The run's registry entry, or None."""

    async def refusals(self, run_id: str, *, limit: int) -> list[Refusal]:
        """The run's latest refusals, newest first."""

    async def erasure(self, run_id: str) -> Erasure | None:
        """The run's erasure tombstone, or None when its payloads were never erased."""


class RedisSource:
    """Redis as an :class:`AuditSource` (reads only; never touches an expiry)."""

    archived = False

    def __init__(self, store: Store) -> None:
        self.store = store

    @property
    def namespace(self) -> str:
        """The store's namespace."""
        return self.store.keys.namespace

    async def tool_call_ids(self, run_id: str) -> list[str]:
        """The run registry's calls, then its progress list's."""
        return await run_tool_call_ids(self.store, run_id)

    async def snapshot(self, run_id: str, tool_call_id: str) -> Snapshot:
        """One invocation read atomically (:func:`.readonly.read_snapshot`)."""
        return await read_snapshot(self.store, run_id, tool_call_id)

    async def run_info(self, run_id: str) -> RunInfo | None:
        """The run's registry entry."""
        return await self.store.run_info(run_id)

    async def refusals(self, run_id: str, *, limit: int) -> list[Refusal]:
        """The run's refusal log, newest first."""
        return await self.store.refusals(run_id, limit=limit)

    async def erasure(self, run_id: str) -> Erasure | None:
        """The tombstone on the run hash, if any."""
        async with redis_errors():
            values = cast(
                list[bytes | None],
                await self.store.client.hmget(self.store.keys.run(run_id), TOMBSTONE_FIELDS),
            )
        fields = {
            name: value.decode("utf-8", "replace")
            for name, value in zip(TOMBSTONE_FIELDS, values, strict=True)
            if value is not None
        }
        return erasure_of(run_id, fields)


def source_of(reader: Store | AuditSource) -> AuditSource:
    """``reader`` as an :class:`AuditSource` (a store is read through Redis)."""
    if isinstance(reader, Store):
        return RedisSource(reader)
    return reader
