"""The archive as an audit source: replay, export, verify and the console read it as Redis.

:class:`ArchiveSource` answers what :class:`eventstore.audit.source.AuditSource` asks:
a run's calls, each invocation's record fields and events as Redis held them (a
snapshot marked ``archived``, with no TTL left), the run's registry entry, its refusals
and its erasure. So an archived run gets the same verdicts and the same output as a
live one.

Given a keyring, payloads encrypted at rest are opened as the Redis readers open them,
with the run's wrapped data key the archive keeps beside it: a payload that does not
open is named ``unopened``; a run whose key is gone (erased) or wrapped by a key the
keyring lacks keeps its payloads sealed (checked by size).
"""

from __future__ import annotations

import msgspec

from eventstore.audit.readonly import Snapshot, opened_with
from eventstore.audit.run_calls import CallRow, call_row
from eventstore.erasure import Erasure
from eventstore.keyring import Keyring, KeyringError, UnknownKey, wrapped_key_id
from eventstore.reader import StoredEvent
from eventstore.runs import Refusal, RunInfo
from eventstore.sealing import KeyErased, RunSeal, data_key_context, has_sealed
from eventstore.writer import now_ms
from machine.limits import Limits
from machine.results import resolve_result
from projections.archive.database import ArchiveDatabase
from projections.archive.store import Archive
from projections.receipts.builder import Receipt, build_receipt
from projections.receipts.journal import view_of_fields
from projections.receipts.snapshot import RECEIPT_FIELDS, receipt_snapshot_of

#: The PTTL of a key Redis does not hold (an archived invocation's record and stream).
_ABSENT: int = -2


class ArchiveSource:
    """One namespace of an archive, read as an :class:`~eventstore.audit.source.AuditSource`."""

    archived = True

    def __init__(
        self, database: ArchiveDatabase, namespace: str, *, keys: Keyring | None = None
    ) -> None:
        """Read ``namespace`` of ``database``; with ``keys``, encrypted payloads opened."""
        self.archive = Archive(database, namespace)
        self.keys = keys

    @property
    def namespace(self) -> str:
        """The namespace read."""
        return self.archive.namespace

    async def tool_call_ids(self, run_id: str) -> list[str]:
        """The run's archived calls, oldest first."""
        return await self.archive.tool_call_ids(run_id)

    async def snapshot(self, run_id: str, tool_call_id: str) -> Snapshot:
        """One archived invocation as its record and stream were (empty when not archived)."""
        found = await self.archive.invocation(run_id, tool_call_id)
        snapshot = Snapshot(
            run_id=run_id,
            tool_call_id=tool_call_id,
            fields=found.fields if found is not None else {},
            events=found.events if found is not None else [],
            record_pttl_ms=_ABSENT,
            stream_pttl_ms=_ABSENT,
            archived=True,
        )
        if self.keys is None or not has_sealed(snapshot.fields):
            return snapshot
        try:
            seal = await self.seal(run_id)
        except (KeyErased, UnknownKey, KeyringError):
            return snapshot
        return opened_with(seal, snapshot)

    async def seal(self, run_id: str) -> RunSeal:
        """The seal the run's archived payloads open with: its archived data key, unwrapped.

        Raises:
            KeyErased: the archive keeps no data key for the run (erased, never kept, or
                no keyring given).
            UnknownKey, KeyringError: its data key is wrapped by a key the keyring lacks,
                or does not open.
            ArchiveUnavailable: the database failed.

        """
        # Read each time, never kept: an erasure takes effect on the next read.
        wrapped = await self.archive.data_key(run_id)
        if wrapped is None or self.keys is None:
            raise KeyErased(run_id)
        context = data_key_context(self.namespace, run_id)
        return RunSeal(self.keys.unwrap(wrapped, context), wrapped_key_id(wrapped))

    async def key_id(self, run_id: str) -> str:
        """The master key id the run's archived payloads are encrypted under (``erased``)."""
        wrapped = await self.archive.data_key(run_id)
        return (wrapped_key_id(wrapped) if wrapped is not None else "") or "erased"

    async def run_info(self, run_id: str) -> RunInfo | None:
        """The run's registry entry as last archived."""
        return await self.archive.run_info(run_id)

    async def refusals(self, run_id: str, *, limit: int) -> list[Refusal]:
        """The run's archived refusals, newest first."""
        return await self.archive.refusals(run_id, limit=limit)

    async def erasure(self, run_id: str) -> Erasure | None:
        """The run's tombstone, when its payloads were erased."""
        run = await self.archive.run(run_id)
        return run.erasure if run is not None else None

    async def call_rows(self, run_id: str) -> list[CallRow]:
        """Every archived call of the run as a listing row, oldest first (one query)."""
        archive = self.archive
        rows = await archive.database.fetch(
            "SELECT tool_call_id, record FROM invocations WHERE namespace = ? AND run_id = ? "
            "ORDER BY created_at_ms, tool_call_id",
            (archive.namespace, run_id),
        )
        found = []
        for tool_call_id, record in rows:
            fields = {
                name.encode("utf-8", "surrogateescape"): str(value).encode()
                for name, value in msgspec.json.decode(record).items()
            }
            row = call_row(run_id, str(tool_call_id), fields)
            if row is not None:
                found.append(row)
        return found


def archived_receipt(fields: dict[bytes, bytes], events: list[StoredEvent]) -> Receipt:
    """The receipt an archived record and journal give (built as a live one is).

    A result the record stored once, as its raw response, is read as the result it is.
    """
    result = resolve_result(fields.get(b"result"), fields.get(b"raw"))
    if result is not None:
        fields = {**fields, b"result": result}
    snapshot = receipt_snapshot_of(
        [fields.get(name.encode()) for name in RECEIPT_FIELDS],
        [(stored.entry_id.encode(), {b"e": stored.data}) for stored in events],
        now_ms(),
    )
    return build_receipt(
        view_of_fields(snapshot.fields),
        snapshot.events,
        observed_at_ms=snapshot.observed_at_ms,
        result_limit_bytes=Limits().result_bytes,
    )
