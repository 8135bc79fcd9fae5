"""One interface over the archive's two databases: SQLite (embedded) and PostgreSQL.

Every statement of the archive is written once, with ``?`` placeholders; a backend
runs it in its own dialect (PostgreSQL's driver takes ``%s``). Only the few statements
that differ (the schema's types, a JSON-path condition) are chosen by :attr:`dialect`.

An archive is named by a URL: ``sqlite:///path/to/archive.db`` (a relative path after
``sqlite:///``, an absolute one after ``sqlite:////``) or ``postgresql://user@host:port/db``
(``postgres://`` too). :func:`open_archive` opens either; the URL is never printed or
logged (it may hold a password).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final, Literal
from urllib.parse import urlsplit

from eventstore.errors import CanonError, InvalidArgument

#: The dialects of the archive's backends.
Dialect = Literal["sqlite", "postgresql"]
#: One row as a backend returns it.
Row = tuple[Any, ...]
#: An archive database URL's schemes, by dialect.
SCHEMES: Final[dict[str, Dialect]] = {
    "sqlite": "sqlite",
    "postgresql": "postgresql",
    "postgres": "postgresql",
}


class ArchiveUnavailable(CanonError):
    """Raised when the archive database cannot be reached or fails; carries no URL."""


class ArchiveDriverMissing(CanonError):
    """Raised when a PostgreSQL archive is opened without psycopg (the extra's name says how)."""


class ArchiveSchemaError(CanonError):
    """Raised when the archive's schema is missing, older or newer than this version's."""


class Transaction(abc.ABC):
    """Statements run in one database transaction (committed together, or not at all)."""

    @abc.abstractmethod
    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; return the rows it changed."""

    @abc.abstractmethod
    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement for each of ``rows`` (one round trip where the driver can)."""

    @abc.abstractmethod
    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """Run one query; return its rows."""


class ArchiveDatabase(abc.ABC):
    """An archive database: transactions, reads, and its dialect."""

    #: ``sqlite`` or ``postgresql``: which of the few dialect-specific statements to use.
    dialect: Dialect

    @abc.abstractmethod
    def transaction(self) -> Any:
        """An async context manager yielding a :class:`Transaction`.

        Committed when the block ends, rolled back when it raises.
        """

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """Run one read-only query in a transaction of its own; return its rows."""
        async with self.transaction() as tx:
            rows: list[Row] = await tx.fetch(sql, params)
        return rows

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Close every connection."""

    def text(self, value: bytes) -> Any:
        """A payload as the backend stores it (SQLite keeps UTF-8 as TEXT for JSON1)."""
        return value

    @staticmethod
    def payload_bytes(value: Any) -> bytes | None:
        """A stored payload back as bytes (None when it is not stored)."""
        if value is None:
            return None
        if isinstance(value, str):
            return value.encode("utf-8", "surrogatepass")
        return bytes(value)

    async def __aenter__(self) -> ArchiveDatabase:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def dialect_of(url: str) -> Dialect:
    """Return the dialect an archive URL names.

    Raises:
        InvalidArgument: not an archive URL (the message never repeats it).

    """
    scheme = urlsplit(url).scheme.split("+", 1)[0].lower()
    if scheme not in SCHEMES:
        raise InvalidArgument("the archive URL must start sqlite:/// or postgresql://")
    return SCHEMES[scheme]


def sqlite_path(url: str) -> str:
    """The file of a ``sqlite:///`` URL (``:memory:`` for ``sqlite:///:memory:``).

    Raises:
        InvalidArgument: the URL names no file.

    """
    if not url.lower().startswith("sqlite:///") or len(url) <= len("sqlite:///"):
        raise InvalidArgument("a SQLite archive URL is sqlite:///<path>")
    return url[len("sqlite:///") :]


def open_archive(url: str, *, pool_size: int = 4) -> ArchiveDatabase:
    """Open the archive database ``url`` names (no schema check: see :mod:`.schema`).

    Args:
        url: ``sqlite:///<path>`` or ``postgresql://...``.
        pool_size: most PostgreSQL connections kept open.

    Raises:
        InvalidArgument: not an archive URL.
        ArchiveUnavailable: the database cannot be opened.
        ArchiveDriverMissing: PostgreSQL without its driver (the ``archive-postgres``
            extra).

    """
    if dialect_of(url) == "sqlite":
        from projections.archive.sqlite import SqliteArchive

        return SqliteArchive(sqlite_path(url))
    from projections.archive.postgres import PostgresArchive

    return PostgresArchive(url, pool_size=pool_size)


@asynccontextmanager
async def archive_at(url: str) -> AsyncIterator[ArchiveDatabase]:
    """:func:`open_archive` as an ``async with`` block that closes it."""
    database = open_archive(url)
    try:
        yield database
    finally:
        await database.aclose()
