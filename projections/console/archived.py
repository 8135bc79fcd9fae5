"""The console's pages for what Redis no longer holds: archived runs, and search across runs.

With an archive (``Console(..., archive=database)``, ``canon serve --archive URL``), a run
page, a call's page or a call's payloads page that Redis cannot answer (the run or the
call expired) is answered from the archive instead: the same pages, built by the same
code of :mod:`.views` from what the archive's audit source
(:class:`~projections.archive.source.ArchiveSource`) reads, marked "archived" and
read-only. Only finished calls are archived, so nothing on them waits for a decision;
the pages carry no decision form whatever the record says, and never refresh themselves.
Replay reads the archived invocation through the same
:class:`~eventstore.audit.source.AuditSource` interface as ``canon replay --archive``, so
the verdict is the one the command gives; the receipt shown is the one the archived record
and journal give (``canon inspect --archive``), since the receipt API answers
``invocation_not_found`` once Redis let the call go.

The search page then searches the archive across runs (:mod:`projections.archive.search`):
by tool, error code, exception type, stage, approver, run, a time range and one condition
on a JSON path of the request or result, newest first, a page at a time, each call linked
to its page. An archive that fails answers 503, as Redis does; only the error's type is
logged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final
from urllib.parse import urlencode

import msgspec

from eventstore.audit import replay_invocation
from eventstore.audit.run_calls import CallRow
from eventstore.errors import StoreUnavailable
from eventstore.keyring import Keyring
from eventstore.logs import get_logger
from eventstore.sealing import is_sealed
from eventstore.settings import StoreSettings
from machine.results import resolve_result
from projections.archive.database import ArchiveDatabase, ArchiveUnavailable
from projections.archive.search import (
    SearchHit,
    SearchQuery,
    parse_condition,
    parse_time,
    search,
)
from projections.archive.source import ArchiveSource, archived_receipt
from projections.console import views
from projections.receipts.builder import encode_receipt

log = get_logger("canon.console")

#: The search page's query fields (each once): its filters and the next page's cursor.
SEARCH_FIELDS: Final = frozenset(
    {"tool", "code", "exception", "stage", "approver", "run", "since", "until", "where", "cursor"}
)
#: What the search page says of a query it cannot read (it never repeats the query).
SEARCH_USAGE: Final = (
    "The search takes tool, code, exception, stage, approver, run, since, until (ISO 8601 "
    "or ms), where (one JSON-path condition) and cursor, each once and at most 200 "
    "characters."
)
#: Calls one search page lists.
SEARCH_PAGE_CALLS: Final = 50
#: The HTTP status the receipt API answers for a call Redis no longer holds.
_RECEIPT_GONE: Final = 404


class SearchView(msgspec.Struct, frozen=True, kw_only=True):
    """The archive's search page: the query as given, one page of calls, the next page.

    ``next_query`` is the query string of the next page (None: this is the last).
    """

    query: dict[str, str]
    hits: list[SearchHit]
    next_query: str | None


def search_query(fields: dict[str, str]) -> SearchQuery:
    """The archive query the search page's fields ask for (none: the newest calls).

    Raises:
        InvalidArgument: a time, the condition or the cursor cannot be read (the message
            never repeats it).

    """
    return SearchQuery(
        tool=fields.get("tool"),
        error_code=fields.get("code"),
        exception_type=fields.get("exception"),
        stage=fields.get("stage"),
        approver=fields.get("approver"),
        run_id=fields.get("run"),
        since_ms=parse_time(fields["since"]) if "since" in fields else None,
        until_ms=parse_time(fields["until"]) if "until" in fields else None,
        conditions=(parse_condition(fields["where"]),) if "where" in fields else (),
        limit=SEARCH_PAGE_CALLS,
        cursor=fields.get("cursor"),
    )


@asynccontextmanager
async def _archive_errors() -> AsyncIterator[None]:
    """An archive that fails is a store that is unavailable (the console answers 503)."""
    try:
        yield
    except ArchiveUnavailable as exc:
        log.warning("console_archive_unavailable", error=str(exc))
        raise StoreUnavailable("the archive is unavailable") from None


class ArchivedPages:
    """The console's pages read from one namespace of an archive."""

    def __init__(
        self,
        database: ArchiveDatabase,
        namespace: str,
        settings: StoreSettings,
        *,
        keys: Keyring | None = None,
    ) -> None:
        """Read ``namespace`` of ``database``.

        ``settings`` are the console store's: its limits and scrubber, for the sizes and
        payloads shown. ``keys``: the console store's keyring, which opens payloads
        encrypted at rest (without it they show as ``encrypted (key <id>)``).
        """
        self.source = ArchiveSource(database, namespace, keys=keys)
        self._settings = settings

    async def _call(self, run_id: str, invocation_id: str) -> tuple[CallRow, list[CallRow]] | None:
        """The archived call, and every archived call of its run (oldest first), or None."""
        calls = await self.source.call_rows(run_id)
        found = next((row for row in calls if row.invocation_id == invocation_id), None)
        return None if found is None else (found, calls)

    async def run_page(
        self, run_id: str, page: int = 1, where: views.CallFilter | None = None
    ) -> views.RunView | None:
        """Page ``page`` of an archived run, or None (not archived, or no such page)."""
        async with _archive_errors():
            info = await self.source.run_info(run_id)
            if info is None:
                return None
            calls = await self.source.call_rows(run_id)
            refusals = (
                await self.source.refusals(run_id, limit=views.REFUSALS_MARKED)
                if info.refused
                else []
            )
        return views.run_view(info, calls, refusals, page, where, live=False)

    async def invocation_page(self, run_id: str, invocation_id: str) -> views.InvocationView | None:
        """An archived call's page, or None when the archive holds no such call."""
        async with _archive_errors():
            found = await self._call(run_id, invocation_id)
            if found is None:
                return None
            call, calls = found
            replay = await replay_invocation(self.source, run_id, call.tool_call_id)
            snapshot = await self.source.snapshot(run_id, call.tool_call_id)
        index = calls.index(call)
        detail = snapshot.fields.get(views.FAILURE_DETAIL_FIELD.encode())
        receipt = encode_receipt(archived_receipt(snapshot.fields, snapshot.events))
        return views.InvocationView(
            run_id=run_id,
            call=call,
            replay=replay,
            receipt=msgspec.json.format(receipt, indent=2).decode(),
            receipt_status=_RECEIPT_GONE,
            failure_detail=views.parse_failure_detail(detail) if detail is not None else None,
            position=index + 1,
            total=len(calls),
            previous=calls[index - 1] if index > 0 else None,
            following=calls[index + 1] if index + 1 < len(calls) else None,
            sizes=views.call_sizes(call, self._settings.limits),
            waiting_request=None,  # read-only: an archived call is decided for good
        )

    async def payloads_page(
        self, run_id: str, invocation_id: str, *, reveal: bool = False
    ) -> tuple[CallRow, list[views.Payload]] | None:
        """An archived call's payloads, masked unless ``reveal``; None when not archived."""
        async with _archive_errors():
            found = await self._call(run_id, invocation_id)
            if found is None:
                return None
            snapshot = await self.source.snapshot(run_id, found[0].tool_call_id)
            fields = snapshot.fields
            shown = (fields.get(b"request"), fields.get(b"raw"), fields.get(b"result"))
            key_id = await self.source.key_id(run_id) if any(map(is_sealed, shown)) else None
        return found[0], views.payloads_shown(
            fields.get(b"request"),
            fields.get(b"raw"),
            resolve_result(fields.get(b"result"), fields.get(b"raw")),
            self._settings.limits,
            self._settings.scrub,
            reveal,
            key_id=key_id,
        )

    async def search_page(self, fields: dict[str, str]) -> SearchView:
        """One page of archived calls the search page's ``fields`` ask for.

        Raises:
            InvalidArgument: a field cannot be read (:func:`search_query`).

        """
        query = search_query(fields)
        async with _archive_errors():
            found = await search(self.source.archive, query)
        filters = {name: value for name, value in fields.items() if name != "cursor"}
        return SearchView(
            query=filters,
            hits=found.hits,
            next_query=urlencode({**filters, "cursor": found.cursor}) if found.cursor else None,
        )
