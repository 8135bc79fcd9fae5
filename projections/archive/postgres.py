"""The PostgreSQL archive (production): psycopg 3 with a connection pool.

Installed with the ``archive-postgres`` extra (``psycopg[binary,pool]``); without it,
opening a ``postgresql://`` archive fails with one line naming the extra. Statements are
written with ``?`` (as for SQLite) and sent with ``%s``; batches go through
``executemany``, which psycopg pipelines into one round trip.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import lru_cache
from typing import Any

from projections.archive.database import (
    ArchiveDatabase,
    ArchiveDriverMissing,
    ArchiveUnavailable,
    Row,
    Transaction,
)

try:
    import psycopg
    from psycopg_pool import AsyncConnectionPool
except ImportError:  # pragma: no cover - the extra is installed by the test suite
    psycopg = None  # type: ignore[assignment]
    AsyncConnectionPool = None  # type: ignore[assignment,misc]

_PLACEHOLDER = re.compile(r"\?")


@lru_cache(maxsize=256)
def postgres_sql(sql: str) -> str:
    """``sql`` with ``?`` placeholders as psycopg's ``%s`` (a literal ``%`` doubled)."""
    return _PLACEHOLDER.sub("%s", sql.replace("%", "%%"))


class _PostgresTransaction(Transaction):
    def __init__(self, connection: Any) -> None:
        self._connection = connection

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        try:
            cursor = await self._connection.execute(postgres_sql(sql), tuple(params))
        except psycopg.Error as exc:
            raise ArchiveUnavailable(type(exc).__name__) from None
        return int(cursor.rowcount)

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if not rows:
            return
        try:
            async with self._connection.cursor() as cursor:
                await cursor.executemany(postgres_sql(sql), [tuple(row) for row in rows])
        except psycopg.Error as exc:
            raise ArchiveUnavailable(type(exc).__name__) from None

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        try:
            cursor = await self._connection.execute(postgres_sql(sql), tuple(params))
            return [tuple(row) for row in await cursor.fetchall()]
        except psycopg.Error as exc:
            raise ArchiveUnavailable(type(exc).__name__) from None


class PostgresArchive(ArchiveDatabase):
    """An archive in a PostgreSQL database, over a pool of at most ``pool_size`` connections.

    Raises:
        ArchiveDriverMissing: psycopg is not installed.

    """

    dialect = "postgresql"

    def __init__(self, url: str, *, pool_size: int = 4) -> None:
        if psycopg is None:
            raise ArchiveDriverMissing(
                "a PostgreSQL archive needs psycopg: pip install 'canon-store[archive-postgres]'"
            )
        self._pool = AsyncConnectionPool(
            url, min_size=1, max_size=max(pool_size, 1), open=False, kwargs={"autocommit": True}
        )
        self._opened = False

    async def _open(self) -> None:
        if not self._opened:
            try:
                await self._pool.open(wait=True, timeout=10.0)
            except (psycopg.Error, Exception) as exc:
                raise ArchiveUnavailable(type(exc).__name__) from None
            self._opened = True

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        """One transaction on a pooled connection."""
        await self._open()
        try:
            async with self._pool.connection() as connection, connection.transaction():
                yield _PostgresTransaction(connection)
        except psycopg.Error as exc:
            raise ArchiveUnavailable(type(exc).__name__) from None

    async def aclose(self) -> None:
        """Close the pool and its connections."""
        if self._opened:
            await self._pool.close()
            self._opened = False
