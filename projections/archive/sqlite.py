"""The SQLite archive (the embedded default): one file, stdlib ``sqlite3``, WAL mode.

One connection, used by one transaction at a time (an asyncio lock), each statement run
on a worker thread so the event loop never waits on the disk. WAL lets readers in other
processes (``canon replay --archive``) read while the worker writes; ``busy_timeout``
makes a writer wait for another one instead of failing.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

from projections.archive.database import ArchiveDatabase, ArchiveUnavailable, Row, Transaction

#: How long a statement waits for another process's write lock before failing.
BUSY_TIMEOUT_MS: Final = 30_000


class _SqliteTransaction(Transaction):
    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        def run() -> int:
            return self._connection.execute(sql, tuple(params)).rowcount

        rowcount: int = await _guarded(run)
        return rowcount

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            await _guarded(lambda: self._connection.executemany(sql, [tuple(r) for r in rows]))

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        def run() -> list[Row]:
            return [tuple(row) for row in self._connection.execute(sql, tuple(params))]

        rows: list[Row] = await _guarded(run)
        return rows


async def _guarded(work: Any) -> Any:
    """Run ``work`` on a thread; a database error becomes :class:`ArchiveUnavailable`."""
    try:
        return await asyncio.to_thread(work)
    except sqlite3.Error as exc:
        raise ArchiveUnavailable(type(exc).__name__) from None


class SqliteArchive(ArchiveDatabase):
    """An archive in one SQLite file (created, with its folder, when missing)."""

    dialect = "sqlite"

    def __init__(self, path: str) -> None:
        self.path = path
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        try:
            # isolation_level=None: transactions are begun and ended here, explicitly.
            self._connection = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            if path != ":memory:":
                self._connection.execute("PRAGMA journal_mode = WAL")
            # A commit reaches the WAL file; fsync at checkpoints (WAL's usual trade).
            self._connection.execute("PRAGMA synchronous = NORMAL")
            self._connection.execute("PRAGMA foreign_keys = ON")
        except sqlite3.Error as exc:
            raise ArchiveUnavailable(type(exc).__name__) from None
        self._lock = asyncio.Lock()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        """One transaction on the one connection (BEGIN IMMEDIATE: writers queue up front)."""
        async with self._lock:
            await _guarded(lambda: self._connection.execute("BEGIN IMMEDIATE"))
            try:
                yield _SqliteTransaction(self._connection)
            except BaseException:
                await asyncio.shield(_guarded(lambda: self._connection.execute("ROLLBACK")))
                raise
            await _guarded(lambda: self._connection.execute("COMMIT"))

    def text(self, value: bytes) -> Any:
        """UTF-8 payloads as TEXT (so JSON1 can read them), other bytes as a BLOB."""
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value

    async def aclose(self) -> None:
        """Close the connection (waiting for a transaction in progress)."""
        async with self._lock:
            await asyncio.to_thread(self._connection.close)
