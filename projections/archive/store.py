"""What the archive holds, written and read: runs, run events, refusals, invocations, events.

:class:`Archive` is one namespace of one archive database. :meth:`Archive.write` stores a
batch in one transaction: each run's registry entry (never its token hash) and the run
events it shows, its refusals, each invocation's record (payloads as stored) and events,
and the worker's position on each shard. Every write is idempotent: an event is keyed by
(namespace, invocation id, version) and inserted once; an invocation's row is replaced
only by a higher version; refusals by their log entry id; so a redelivered batch changes
nothing. The run's row is written first, which locks it: an erasure (which writes it
first too) and a batch of the same run are never interleaved, and a batch that follows
an erasure stores no payload.

Reads give back what Redis held: a record's hash fields as bytes and its stream's
events, so the audit tools judge an archived invocation exactly as a live one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import msgspec

from eventstore.erasure import ERASED_FIELD, Erasure
from eventstore.reader import StoredEvent, stored_events
from eventstore.runs import Refusal, RunInfo, prefixed_counts, refused_counts
from eventstore.sealing import DATA_KEY_FIELD
from machine.events import PAYLOAD_FIELDS, event_type
from machine.ids import invocation_id
from projections.archive.database import ArchiveDatabase, Transaction

#: Record fields holding payload bytes (request, raw, result, failure detail).
PAYLOADS: Final = tuple(PAYLOAD_FIELDS)
#: Payloads PostgreSQL also keeps as jsonb for search.
SEARCHED_PAYLOADS: Final = ("request", "result")
#: Run hash fields never archived in the run's info: a credential's digest, and the
#: wrapped data key (bytes, kept in a column of its own).
_RUN_SECRETS: Final = frozenset({"token_sha256", DATA_KEY_FIELD})
_json = msgspec.json.Encoder()


def now_ms() -> int:
    """The wall clock in ms since the epoch."""
    return time.time_ns() // 1_000_000


class ArchivedInvocation(msgspec.Struct, frozen=True, kw_only=True):
    """One invocation as read from Redis for the archive: its record and its events.

    ``fields`` is the record hash as HGETALL answers it (payloads included); ``events``
    the stream's events up to the record's version.
    """

    run_id: str
    tool_call_id: str
    fields: dict[bytes, bytes]
    events: list[StoredEvent]

    @property
    def invocation_id(self) -> str:
        """The invocation id (SHA-256 of run id and tool call id)."""
        return invocation_id(self.run_id, self.tool_call_id)

    def text(self, name: str) -> str | None:
        """A record field as text (None when absent)."""
        value = self.fields.get(name.encode())
        return value.decode("utf-8", "replace") if value is not None else None

    def number(self, name: str) -> int | None:
        """A record field as an integer (None when absent or not a number)."""
        value = self.fields.get(name.encode())
        return int(value) if value is not None and value.isdigit() else None


class RunSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A run's registry entry as read from Redis (token hash left out), and new refusals.

    ``data_key`` is the run's wrapped data key as Redis holds it (payloads encrypted at
    rest; never unwrapped here), None when it holds none.
    """

    run_id: str
    fields: dict[str, str]
    refusals: list[Refusal] = msgspec.field(default_factory=list)
    data_key: bytes | None = None


class ArchiveBatch(msgspec.Struct, kw_only=True):
    """What one transaction of the worker writes.

    ``runs`` are the runs touched (their registry entry when Redis still held it);
    ``positions`` the newest feed entry settled per shard, as (ms, seq).
    """

    runs: list[RunSnapshot] = msgspec.field(default_factory=list)
    invocations: list[ArchivedInvocation] = msgspec.field(default_factory=list)
    positions: dict[int, tuple[int, int]] = msgspec.field(default_factory=dict)


class ArchivedRun(msgspec.Struct, frozen=True, kw_only=True):
    """A run's row: its registry entry as last seen, times, and any erasure."""

    run_id: str
    fields: dict[str, str]
    opened_at_ms: int | None
    updated_at_ms: int
    erasure: Erasure | None


class RunEvent(msgspec.Struct, frozen=True, kw_only=True):
    """Something that happened to a run: opened, paused, unpaused, closed, erased..."""

    kind: str
    at_ms: int
    actor: str | None = None
    reason: str | None = None


def run_events(fields: Mapping[str, str]) -> list[RunEvent]:
    """The run events a registry entry shows (a time of 0: the entry keeps none)."""
    events: list[RunEvent] = []

    def number(name: str) -> int | None:
        value = fields.get(name)
        return int(value) if value is not None and value.lstrip("-").isdigit() else None

    if (opened := number("created_at_ms")) is not None:
        events.append(RunEvent(kind="opened", at_ms=opened))
    for word in ("paused", "unpaused", "erased"):
        at = number(f"{word}_at_ms")
        if at is not None:
            events.append(
                RunEvent(
                    kind=word,
                    at_ms=at,
                    actor=fields.get(f"{word}_by"),
                    reason=fields.get(f"{word}_reason"),
                )
            )
    if fields.get("active") == "0":
        events.append(RunEvent(kind="closed", at_ms=number("closed_at_ms") or 0))
    for name in sorted(fields):
        if name.startswith("revoked:"):
            events.append(RunEvent(kind=f"tool_revoked:{name[len('revoked:') :]}", at_ms=0))
    return events


def run_info_of(run_id: str, fields: Mapping[str, str], invocations: int) -> RunInfo | None:
    """A :class:`RunInfo` from an archived registry entry (None when it was never seen)."""
    if "created_at_ms" not in fields:
        return None
    tools = {
        name[5:]: int(fields[f"budget:{name[5:]}"]) if f"budget:{name[5:]}" in fields else None
        for name in fields
        if name.startswith("tool:")
    }
    budget = fields.get("budget_total")
    return RunInfo(
        run_id=run_id,
        active=fields.get("active") == "1",
        deadline_ms=int(fields.get("deadline_ms", "0")),
        expires_at_ms=int(fields.get("expires_at_ms", "0")),
        created_at_ms=int(fields["created_at_ms"]),
        budget_total=int(budget) if budget is not None else None,
        used_total=int(fields.get("used_total", "0")),
        tools=tools,
        used=prefixed_counts(fields, "used:"),
        revoked=frozenset(name[8:] for name in fields if name.startswith("revoked:")),
        invocations=invocations,
        refused=refused_counts(fields),
        failed=prefixed_counts(fields, "failed:"),
        paused=fields.get("paused") == "1",
        awaiting_approval=int(fields.get("awaiting_approval", "0")),
    )


def _exception_type(detail: bytes | None) -> str | None:
    """The exception type a failure detail names (None when there is none)."""
    if not detail:
        return None
    try:
        document = msgspec.json.decode(detail)
    except msgspec.DecodeError:
        return None
    kind = document.get("type") if isinstance(document, dict) else None
    return kind if isinstance(kind, str) else None


def _json_doc(value: bytes | None) -> str | None:
    """A payload as jsonb input when it is a JSON object or array (else None)."""
    if not value:
        return None
    try:
        document = msgspec.json.decode(value)
    except msgspec.DecodeError:
        return None
    # PostgreSQL's jsonb refuses \u0000 in strings; such a payload is not searched.
    if not isinstance(document, dict | list) or b"\\u0000" in value:
        return None
    return value.decode("utf-8")


_RUN_COLUMNS: Final = (
    "namespace, run_id, opened_at_ms, deadline_ms, expires_at_ms, active, closed_at_ms, info, "
    "first_seen_at_ms, updated_at_ms, erased_at_ms, erased_by, erased_reason, data_key"
)
# The wrapped data key: the one Redis holds now (a rewrap replaces it), kept while Redis
# no longer holds the run, and never once the run is erased.
_UPSERT_RUN: Final = f"""
INSERT INTO runs ({_RUN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (namespace, run_id) DO UPDATE SET
  opened_at_ms = coalesce(excluded.opened_at_ms, runs.opened_at_ms),
  deadline_ms = coalesce(excluded.deadline_ms, runs.deadline_ms),
  expires_at_ms = coalesce(excluded.expires_at_ms, runs.expires_at_ms),
  active = coalesce(excluded.active, runs.active),
  closed_at_ms = coalesce(excluded.closed_at_ms, runs.closed_at_ms),
  info = CASE WHEN excluded.info = '{{}}' THEN runs.info ELSE excluded.info END,
  updated_at_ms = CASE WHEN excluded.updated_at_ms > runs.updated_at_ms
    THEN excluded.updated_at_ms ELSE runs.updated_at_ms END,
  erased_at_ms = coalesce(runs.erased_at_ms, excluded.erased_at_ms),
  erased_by = coalesce(runs.erased_by, excluded.erased_by),
  erased_reason = coalesce(runs.erased_reason, excluded.erased_reason),
  data_key = CASE WHEN coalesce(runs.erased_at_ms, excluded.erased_at_ms) IS NULL
    THEN coalesce(excluded.data_key, runs.data_key) END
RETURNING erased_at_ms"""
_INVOCATION_COLUMNS: Final = (
    "namespace",
    "invocation_id",
    "run_id",
    "tool_call_id",
    "tool",
    "version",
    "stage",
    "status",
    "evidence_status",
    "error_code",
    "exception_type",
    "approver",
    "created_at_ms",
    "updated_at_ms",
    "expires_at_ms",
    "last_hash",
    "record",
    *PAYLOADS,
    "archived_at_ms",
)
_DOC_COLUMNS: Final = tuple(f"{name}_doc" for name in SEARCHED_PAYLOADS)


def _upsert_invocation(dialect: str) -> str:
    columns = _INVOCATION_COLUMNS + (_DOC_COLUMNS if dialect == "postgresql" else ())
    marks = ", ".join("?::jsonb" if c.endswith("_doc") else "?" for c in columns)
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns[2:])
    return (
        f"INSERT INTO invocations ({', '.join(columns)}) VALUES ({marks}) "
        f"ON CONFLICT (namespace, invocation_id) DO UPDATE SET {updates} "
        "WHERE excluded.version > invocations.version"
    )


_INSERT_EVENT: Final = (
    "INSERT INTO events (namespace, invocation_id, version, entry_id, event_type, at_ms, "
    "event_hash, stored_hash, data, archived_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (namespace, invocation_id, version) DO NOTHING"
)
_INSERT_REFUSAL: Final = (
    "INSERT INTO refusals (namespace, run_id, entry_id, at_ms, tool, tool_call_id, "
    "tool_call_id_bytes, code) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (namespace, run_id, entry_id) DO NOTHING"
)
_INSERT_RUN_EVENT: Final = (
    "INSERT INTO run_events (namespace, run_id, kind, at_ms, actor, reason) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (namespace, run_id, kind, at_ms) DO NOTHING"
)
_UPSERT_POSITION: Final = (
    "INSERT INTO positions (namespace, shard, entry_ms, entry_seq, updated_at_ms) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (namespace, shard) DO UPDATE SET "
    "entry_ms = excluded.entry_ms, entry_seq = excluded.entry_seq, "
    "updated_at_ms = excluded.updated_at_ms "
    "WHERE excluded.entry_ms > positions.entry_ms OR (excluded.entry_ms = positions.entry_ms "
    "AND excluded.entry_seq > positions.entry_seq)"
)
_ERASE_PAYLOADS: Final = "UPDATE invocations SET {columns} WHERE namespace = ? AND run_id = ?"


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value is not None and value.lstrip("-").isdigit() else None


class Archive:
    """One namespace of an archive database: its writes (the worker's) and its reads."""

    def __init__(self, database: ArchiveDatabase, namespace: str) -> None:
        self.database = database
        self.namespace = namespace
        self._upsert_invocation = _upsert_invocation(database.dialect)

    # -- writes -------------------------------------------------------------------------

    async def write(self, batch: ArchiveBatch) -> dict[str, int]:
        """Store ``batch`` in one transaction; return each invocation's version now archived.

        An invocation whose archived version is already as new keeps its row (its
        events, keyed by version, are inserted only when missing).
        """
        at_ms = now_ms()
        written: dict[str, int] = {}
        async with self.database.transaction() as tx:
            erased: dict[str, int | None] = {}
            runs = {run.run_id: run for run in batch.runs}
            for run_id in sorted({*runs, *(inv.run_id for inv in batch.invocations)}):
                snapshot = runs.get(run_id, RunSnapshot(run_id=run_id, fields={}))
                erased[run_id] = await self._write_run(tx, snapshot, at_ms)
            await tx.executemany(
                _INSERT_EVENT,
                [
                    (
                        self.namespace,
                        inv.invocation_id,
                        version,
                        stored.entry_id,
                        None if stored.event is None else event_type(stored.event),
                        None if stored.event is None else stored.event.at_ms,
                        stored.computed_hash,
                        stored.stored_hash,
                        stored.data,
                        at_ms,
                    )
                    for inv in batch.invocations
                    for version, stored in enumerate(inv.events, start=1)
                ],
            )
            rows = [
                self._invocation_row(inv, erased.get(inv.run_id), at_ms)
                for inv in batch.invocations
            ]
            await tx.executemany(self._upsert_invocation, rows)
            await tx.executemany(
                _UPSERT_POSITION,
                [
                    (self.namespace, shard, ms, seq, at_ms)
                    for shard, (ms, seq) in sorted(batch.positions.items())
                ],
            )
            for inv in batch.invocations:
                written[inv.invocation_id] = inv.number("version") or 0
        return written

    async def _write_run(self, tx: Transaction, run: RunSnapshot, at_ms: int) -> int | None:
        """Upsert one run's row (locking it), its run events and refusals; its erasure time."""
        fields = run.fields
        info = {name: value for name, value in fields.items() if name not in _RUN_SECRETS}
        rows = await tx.fetch(
            _UPSERT_RUN,
            (
                self.namespace,
                run.run_id,
                _int_or_none(fields.get("created_at_ms")),
                _int_or_none(fields.get("deadline_ms")),
                _int_or_none(fields.get("expires_at_ms")),
                _int_or_none(fields.get("active")),
                _int_or_none(fields.get("closed_at_ms")),
                _json.encode(info).decode(),
                at_ms,
                at_ms,
                _int_or_none(fields.get("erased_at_ms")),
                fields.get("erased_by"),
                fields.get("erased_reason"),
                None if "erased_at_ms" in fields else run.data_key,
            ),
        )
        await tx.executemany(
            _INSERT_RUN_EVENT,
            [
                (self.namespace, run.run_id, event.kind, event.at_ms, event.actor, event.reason)
                for event in run_events(info)
            ],
        )
        await tx.executemany(
            _INSERT_REFUSAL,
            [
                (
                    self.namespace,
                    run.run_id,
                    refusal.entry_id,
                    refusal.at_ms,
                    refusal.tool,
                    refusal.tool_call_id,
                    refusal.tool_call_id_bytes,
                    refusal.code,
                )
                for refusal in run.refusals
            ],
        )
        erased_at = rows[0][0] if rows else None
        if erased_at is not None and "erased_at_ms" in fields:
            # The run was erased in Redis: what the archive held of it goes too.
            await self._erase_payloads(tx, run.run_id, int(erased_at))
        return int(erased_at) if erased_at is not None else None

    def _invocation_row(
        self, inv: ArchivedInvocation, erased_at_ms: int | None, at_ms: int
    ) -> tuple[Any, ...]:
        """The row of one invocation; an erased run's row keeps no payload."""
        fields = dict(inv.fields)
        if erased_at_ms is not None:
            for name in PAYLOADS:
                fields.pop(name.encode(), None)
            fields[ERASED_FIELD.encode()] = str(erased_at_ms).encode()
        record = {
            name.decode("utf-8", "surrogateescape"): value.decode("utf-8", "replace")
            for name, value in fields.items()
            if name.decode("utf-8", "replace") not in PAYLOAD_FIELDS
        }
        payloads = [fields.get(name.encode()) for name in PAYLOADS]
        row: list[Any] = [
            self.namespace,
            inv.invocation_id,
            inv.run_id,
            inv.tool_call_id,
            inv.text("tool") or "",
            inv.number("version") or 0,
            inv.text("stage") or "",
            inv.text("status") or "",
            inv.text("evidence_status"),
            inv.text("error_code"),
            _exception_type(fields.get(b"failure_detail")),
            inv.text("decided_by"),
            inv.number("created_at_ms") or 0,
            inv.number("updated_at_ms") or 0,
            inv.number("expires_at_ms"),
            inv.text("last_hash") or "",
            _json.encode(record).decode(),
            *(None if value is None else self.database.text(value) for value in payloads),
            at_ms,
        ]
        if self.database.dialect == "postgresql":
            row += [_json_doc(fields.get(name.encode())) for name in SEARCHED_PAYLOADS]
        return tuple(row)

    async def _erase_payloads(self, tx: Transaction, run_id: str, at_ms: int) -> int:
        """Drop every payload of the run's archived invocations; mark their records."""
        columns = [f"{name} = NULL" for name in PAYLOADS]
        if self.database.dialect == "postgresql":
            columns += [f"{name} = NULL" for name in _DOC_COLUMNS]
        erased = await tx.execute(
            _ERASE_PAYLOADS.format(columns=", ".join(columns)), (self.namespace, run_id)
        )
        rows = await tx.fetch(
            "SELECT invocation_id, record FROM invocations WHERE namespace = ? AND run_id = ?",
            (self.namespace, run_id),
        )
        updates = []
        for inv_id, record in rows:
            document = msgspec.json.decode(record)
            if document.get(ERASED_FIELD) is None:
                document[ERASED_FIELD] = str(at_ms)
                updates.append((_json.encode(document).decode(), self.namespace, inv_id))
        await tx.executemany(
            "UPDATE invocations SET record = ? WHERE namespace = ? AND invocation_id = ?", updates
        )
        return erased

    async def erase(self, run_id: str, *, by: str, reason: str, at_ms: int) -> int:
        """Erase a run's payloads and its wrapped data key from the archive; keep a tombstone.

        The tombstone (who, when, why) is kept on the run's row and as its ``erased`` run
        event; digests, sizes and events stay, so the chain still verifies. Any copy of
        an encrypted payload left anywhere opens nothing afterwards. Returns how
        many archived invocations lost their payloads. A run already erased keeps its
        first tombstone.
        """
        async with self.database.transaction() as tx:
            rows = await tx.fetch(
                _UPSERT_RUN,
                (
                    self.namespace,
                    run_id,
                    None,
                    None,
                    None,
                    None,
                    None,
                    "{}",
                    at_ms,
                    at_ms,
                    at_ms,
                    by,
                    reason,
                    None,  # the wrapped data key goes: nothing opens the payloads again
                ),
            )
            erased_at = int(rows[0][0])
            await tx.execute(
                _INSERT_RUN_EVENT, (self.namespace, run_id, "erased", erased_at, by, reason)
            )
            return await self._erase_payloads(tx, run_id, erased_at)

    # -- reads --------------------------------------------------------------------------

    async def applied_version(self, invocation: str) -> int:
        """The version of an invocation the archive holds (0 for none)."""
        rows = await self.database.fetch(
            "SELECT version FROM invocations WHERE namespace = ? AND invocation_id = ?",
            (self.namespace, invocation),
        )
        return int(rows[0][0]) if rows else 0

    async def versions(self, invocation_ids: Sequence[str]) -> dict[str, int]:
        """The archived version of each of ``invocation_ids`` that the archive holds."""
        found: dict[str, int] = {}
        for chunk in chunks(sorted(set(invocation_ids)), 500):
            marks = ", ".join("?" for _ in chunk)
            rows = await self.database.fetch(
                f"SELECT invocation_id, version FROM invocations WHERE namespace = ? "
                f"AND invocation_id IN ({marks})",
                (self.namespace, *chunk),
            )
            found.update((str(inv_id), int(version)) for inv_id, version in rows)
        return found

    async def run(self, run_id: str) -> ArchivedRun | None:
        """A run's archived row, or None."""
        rows = await self.database.fetch(
            "SELECT info, opened_at_ms, updated_at_ms, erased_at_ms, erased_by, erased_reason "
            "FROM runs WHERE namespace = ? AND run_id = ?",
            (self.namespace, run_id),
        )
        if not rows:
            return None
        info, opened, updated, erased_at, erased_by, erased_reason = rows[0]
        erasure = None
        if erased_at is not None:
            erasure = Erasure(
                run_id=run_id, by=erased_by or "", at_ms=int(erased_at), reason=erased_reason or ""
            )
        return ArchivedRun(
            run_id=run_id,
            fields=msgspec.json.decode(info),
            opened_at_ms=opened,
            updated_at_ms=int(updated),
            erasure=erasure,
        )

    async def data_key(self, run_id: str) -> bytes | None:
        """The run's wrapped data key as last archived (None: none kept, or erased)."""
        rows = await self.database.fetch(
            "SELECT data_key FROM runs WHERE namespace = ? AND run_id = ?",
            (self.namespace, run_id),
        )
        return self.database.payload_bytes(rows[0][0]) if rows else None

    async def tool_call_id_of(self, run_id: str, invocation: str) -> str | None:
        """The tool call id of one of the run's archived invocations, or None."""
        rows = await self.database.fetch(
            "SELECT tool_call_id FROM invocations WHERE namespace = ? AND invocation_id = ? "
            "AND run_id = ?",
            (self.namespace, invocation, run_id),
        )
        return str(rows[0][0]) if rows else None

    async def tool_call_ids(self, run_id: str) -> list[str]:
        """The run's archived calls, oldest first."""
        rows = await self.database.fetch(
            "SELECT tool_call_id FROM invocations WHERE namespace = ? AND run_id = ? "
            "ORDER BY created_at_ms, tool_call_id",
            (self.namespace, run_id),
        )
        return [str(row[0]) for row in rows]

    async def invocation(self, run_id: str, tool_call_id: str) -> ArchivedInvocation | None:
        """One archived invocation as Redis held it: record fields and events; or None."""
        inv_id = invocation_id(run_id, tool_call_id)
        rows = await self.database.fetch(
            f"SELECT record, {', '.join(PAYLOADS)} FROM invocations "
            "WHERE namespace = ? AND invocation_id = ?",
            (self.namespace, inv_id),
        )
        if not rows:
            return None
        record, *payloads = rows[0]
        fields = {
            name.encode("utf-8", "surrogateescape"): value.encode()
            for name, value in msgspec.json.decode(record).items()
        }
        for name, value in zip(PAYLOADS, payloads, strict=True):
            data = self.database.payload_bytes(value)
            if data is not None:
                fields[name.encode()] = data
        return ArchivedInvocation(
            run_id=run_id,
            tool_call_id=tool_call_id,
            fields=fields,
            events=await self.events(inv_id),
        )

    async def events(self, inv_id: str) -> list[StoredEvent]:
        """An archived invocation's events in version order, as its stream held them."""
        rows = await self.database.fetch(
            "SELECT entry_id, data, stored_hash, event_hash FROM events "
            "WHERE namespace = ? AND invocation_id = ? ORDER BY version",
            (self.namespace, inv_id),
        )
        entries: list[tuple[bytes, dict[bytes, bytes]]] = []
        for entry_id, data, stored_hash, event_hash in rows:
            entry = {b"e": bytes(data)}
            if stored_hash != event_hash:
                entry[b"h"] = str(stored_hash).encode()
            entries.append((str(entry_id).encode(), entry))
        return stored_events(entries)

    async def refusals(self, run_id: str, *, limit: int) -> list[Refusal]:
        """The run's archived refusals, newest first."""
        rows = await self.database.fetch(
            "SELECT entry_id, at_ms, tool, tool_call_id, tool_call_id_bytes, code FROM refusals "
            "WHERE namespace = ? AND run_id = ? ORDER BY at_ms DESC, entry_id DESC LIMIT ?",
            (self.namespace, run_id, limit),
        )
        return [
            Refusal(
                entry_id=str(entry_id),
                at_ms=int(at_ms),
                tool=tool,
                tool_call_id=call,
                tool_call_id_bytes=int(size),
                code=str(code),
            )
            for entry_id, at_ms, tool, call, size, code in rows
        ]

    async def run_events(self, run_id: str) -> list[RunEvent]:
        """The run's archived run events, oldest first."""
        rows = await self.database.fetch(
            "SELECT kind, at_ms, actor, reason FROM run_events WHERE namespace = ? "
            "AND run_id = ? ORDER BY at_ms, kind",
            (self.namespace, run_id),
        )
        return [
            RunEvent(kind=str(kind), at_ms=int(at), actor=actor, reason=reason)
            for kind, at, actor, reason in rows
        ]

    async def run_info(self, run_id: str) -> RunInfo | None:
        """The run's registry entry as last archived, or None."""
        run = await self.run(run_id)
        if run is None:
            return None
        count = await self.database.fetch(
            "SELECT count(*) FROM invocations WHERE namespace = ? AND run_id = ?",
            (self.namespace, run_id),
        )
        return run_info_of(run_id, run.fields, int(count[0][0]))


def chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    """``items`` in consecutive slices of at most ``size``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]
