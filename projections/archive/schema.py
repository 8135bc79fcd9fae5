"""The archive's versioned schema and its migrations (``canon archive --migrate``).

Each migration is a numbered list of statements per dialect, applied in order, each in
one transaction with its row in ``archive_schema``; applying them again does nothing.
Workers and readers check the version first and refuse an archive that is older (run
``--migrate``) or newer (upgrade canon) than the one they were written for. The tables,
one by one, are described in docs/archive.md.

Types: ids, codes and hashes are text; times are integer milliseconds since the epoch;
payloads are the stored bytes (SQLite: TEXT when UTF-8, so JSON1 reads it, else BLOB;
PostgreSQL: ``bytea``, with a ``jsonb`` copy of a JSON request and result for search,
under GIN indexes).
"""

from __future__ import annotations

import time
from typing import Final

from projections.archive.database import ArchiveDatabase, ArchiveSchemaError, Dialect

#: The schema version this code reads and writes.
SCHEMA_VERSION: Final = 3


def _types(dialect: Dialect) -> dict[str, str]:
    if dialect == "postgresql":
        return {"int": "bigint", "blob": "bytea", "doc": "jsonb"}
    return {"int": "INTEGER", "blob": "BLOB", "doc": "TEXT"}


def _first(dialect: Dialect) -> list[str]:
    """Schema 1: runs, their events and refusals, invocations, events, positions."""
    t = _types(dialect)
    docs = f", request_doc {t['doc']}, result_doc {t['doc']}" if dialect == "postgresql" else ""
    statements = [
        f"""CREATE TABLE runs (
            namespace text NOT NULL,
            run_id text NOT NULL,
            opened_at_ms {t["int"]},
            deadline_ms {t["int"]},
            expires_at_ms {t["int"]},
            active {t["int"]},
            closed_at_ms {t["int"]},
            info text NOT NULL,
            first_seen_at_ms {t["int"]} NOT NULL,
            updated_at_ms {t["int"]} NOT NULL,
            erased_at_ms {t["int"]},
            erased_by text,
            erased_reason text,
            PRIMARY KEY (namespace, run_id))""",
        "CREATE INDEX runs_updated ON runs (namespace, updated_at_ms)",
        f"""CREATE TABLE run_events (
            namespace text NOT NULL,
            run_id text NOT NULL,
            kind text NOT NULL,
            at_ms {t["int"]} NOT NULL,
            actor text,
            reason text,
            PRIMARY KEY (namespace, run_id, kind, at_ms))""",
        f"""CREATE TABLE refusals (
            namespace text NOT NULL,
            run_id text NOT NULL,
            entry_id text NOT NULL,
            at_ms {t["int"]} NOT NULL,
            tool text,
            tool_call_id text,
            tool_call_id_bytes {t["int"]} NOT NULL,
            code text NOT NULL,
            PRIMARY KEY (namespace, run_id, entry_id))""",
        "CREATE INDEX refusals_code ON refusals (namespace, code, at_ms)",
        f"""CREATE TABLE invocations (
            namespace text NOT NULL,
            invocation_id text NOT NULL,
            run_id text NOT NULL,
            tool_call_id text NOT NULL,
            tool text NOT NULL,
            version {t["int"]} NOT NULL,
            stage text NOT NULL,
            status text NOT NULL,
            evidence_status text,
            error_code text,
            exception_type text,
            approver text,
            created_at_ms {t["int"]} NOT NULL,
            updated_at_ms {t["int"]} NOT NULL,
            expires_at_ms {t["int"]},
            last_hash text NOT NULL,
            record text NOT NULL,
            request {t["blob"]},
            raw {t["blob"]},
            result {t["blob"]},
            failure_detail {t["blob"]},
            archived_at_ms {t["int"]} NOT NULL{docs},
            PRIMARY KEY (namespace, invocation_id))""",
        "CREATE INDEX invocations_run ON invocations (namespace, run_id, created_at_ms)",
        "CREATE INDEX invocations_time ON invocations (namespace, created_at_ms)",
        "CREATE INDEX invocations_tool ON invocations (namespace, tool, error_code, created_at_ms)",
        "CREATE INDEX invocations_code ON invocations (namespace, error_code, created_at_ms)",
        "CREATE INDEX invocations_exception ON invocations "
        "(namespace, exception_type, created_at_ms)",
        "CREATE INDEX invocations_stage ON invocations (namespace, stage, created_at_ms)",
        "CREATE INDEX invocations_approver ON invocations (namespace, approver, created_at_ms)",
        f"""CREATE TABLE events (
            namespace text NOT NULL,
            invocation_id text NOT NULL,
            version {t["int"]} NOT NULL,
            entry_id text NOT NULL,
            event_type text,
            at_ms {t["int"]},
            event_hash text NOT NULL,
            stored_hash text NOT NULL,
            data {t["blob"]} NOT NULL,
            archived_at_ms {t["int"]} NOT NULL,
            PRIMARY KEY (namespace, invocation_id, version))""",
        f"""CREATE TABLE positions (
            namespace text NOT NULL,
            shard {t["int"]} NOT NULL,
            entry_ms {t["int"]} NOT NULL,
            entry_seq {t["int"]} NOT NULL,
            updated_at_ms {t["int"]} NOT NULL,
            PRIMARY KEY (namespace, shard))""",
    ]
    if dialect == "postgresql":
        statements += [
            "CREATE INDEX invocations_request_doc ON invocations "
            "USING gin (request_doc jsonb_path_ops)",
            "CREATE INDEX invocations_result_doc ON invocations "
            "USING gin (result_doc jsonb_path_ops)",
        ]
    return statements


def _settlement_evidence(dialect: Dialect) -> list[str]:
    # An operator's evidence for settling a call left in flight is a payload of its
    # record (as the failure detail is): kept, and erased, with the others.
    return [f"ALTER TABLE invocations ADD COLUMN settlement_evidence {_types(dialect)['blob']}"]


def _run_data_key(dialect: Dialect) -> list[str]:
    # An encrypted run's wrapped data key (never unwrapped), so that its archived
    # payloads open after the TTL with the keyring, and nothing opens them once erased.
    return [f"ALTER TABLE runs ADD COLUMN data_key {_types(dialect)['blob']}"]


#: Every migration: its version, what it does, and its statements per dialect.
MIGRATIONS: Final = (
    (1, "runs, run events, refusals, invocations, events, positions", _first),
    (2, "the settlement evidence of a call left in flight", _settlement_evidence),
    (3, "an encrypted run's wrapped data key", _run_data_key),
)


async def schema_version(database: ArchiveDatabase) -> int:
    """The archive's schema version (0 for a database without the archive's tables)."""
    if database.dialect == "sqlite":
        exists = "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?"
    else:
        exists = (
            "SELECT count(*) FROM information_schema.tables "
            "WHERE table_name = ? AND table_schema = current_schema()"
        )
    if not (await database.fetch(exists, ("archive_schema",)))[0][0]:
        return 0
    rows = await database.fetch("SELECT max(version) FROM archive_schema")
    return int(rows[0][0] or 0) if rows else 0


async def migrate(database: ArchiveDatabase) -> list[int]:
    """Apply every migration the archive has not had yet; return the versions applied.

    Raises:
        ArchiveSchemaError: the archive's schema is newer than this code's.
        ArchiveUnavailable: the database failed.

    """
    async with database.transaction() as tx:
        await tx.execute(
            "CREATE TABLE IF NOT EXISTS archive_schema (version integer PRIMARY KEY, "
            "applied_at_ms bigint NOT NULL, description text NOT NULL)"
        )
    current = await schema_version(database)
    if current > SCHEMA_VERSION:
        raise ArchiveSchemaError(
            f"the archive's schema is version {current}, newer than this canon's "
            f"{SCHEMA_VERSION}: upgrade canon"
        )
    applied = []
    for version, description, statements in MIGRATIONS:
        if version <= current:
            continue
        async with database.transaction() as tx:
            for statement in statements(database.dialect):
                await tx.execute(statement)
            await tx.execute(
                "INSERT INTO archive_schema (version, applied_at_ms, description) VALUES (?, ?, ?)",
                (version, time.time_ns() // 1_000_000, description),
            )
        applied.append(version)
    return applied


async def check_schema(database: ArchiveDatabase) -> None:
    """Refuse an archive whose schema is not exactly this code's version.

    Raises:
        ArchiveSchemaError: no schema yet, an older one (``canon archive --migrate``) or
            a newer one (upgrade canon).
        ArchiveUnavailable: the database failed.

    """
    version = await schema_version(database)
    if version == SCHEMA_VERSION:
        return
    if version < SCHEMA_VERSION:
        raise ArchiveSchemaError(
            f"the archive's schema is version {version}, this canon needs "
            f"{SCHEMA_VERSION}: run canon archive --migrate"
        )
    raise ArchiveSchemaError(
        f"the archive's schema is version {version}, newer than this canon's "
        f"{SCHEMA_VERSION}: upgrade canon"
    )
