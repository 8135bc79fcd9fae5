"""Search across runs: archived calls by their columns and by JSON paths of their payloads.

Calls are found by tool, error code, exception type, stage, approver, run and time, and
by conditions on a JSON path of their request or result. The indexed filters are
columns of ``invocations`` under composite indexes (namespace first, creation time
last), so "every ``refund`` that failed with ``EXECUTION_FAILED`` this quarter" is one
index range. A condition such as ``request.amount>500`` or ``result.status="timeout"``
reads the stored payload: SQLite's JSON1 (``json_extract``, with the JSON type checked,
so ``"600"`` is never a number above 500), PostgreSQL's ``jsonb``: an equality under
the GIN index (``@@`` with a jsonpath predicate), an order or ``!=`` as the same
predicate tested newest first along the time index (``jsonb_path_match``). Results
come newest first, a page at a time, with a cursor for the next page.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any, Final, Literal

import msgspec

from eventstore.errors import InvalidArgument
from projections.archive.store import Archive

#: Most hits one page holds.
MAX_LIMIT: Final = 1000
#: The comparison operators of a condition, as written and as SQL / jsonpath spell them.
_OPERATORS: Final = {
    "=": ("=", "=="),
    "==": ("=", "=="),
    "!=": ("!=", "!="),
    ">": (">", ">"),
    ">=": (">=", ">="),
    "<": ("<", "<"),
    "<=": ("<=", "<="),
}
_CONDITION = re.compile(
    r"(request|result)((?:\.[A-Za-z_][A-Za-z0-9_]*|\[[0-9]{1,6}\]){1,16})\s*"
    r"(==|!=|>=|<=|=|>|<)\s*(.+)",
    re.DOTALL,
)
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[([0-9]+)\]")
_CURSOR = re.compile(r"([0-9]{1,15})\.([0-9a-f]{64})")


class Condition(msgspec.Struct, frozen=True, kw_only=True):
    """A condition on a JSON path of a call's request or result.

    ``path`` is the keys and array indexes from the payload's root; ``value`` a JSON
    scalar (number, string, true, false, null).
    """

    payload: Literal["request", "result"]
    path: tuple[str | int, ...]
    operator: str
    value: Any


def parse_condition(text: str) -> Condition:
    """Read ``request.amount>500``, ``result.status="timeout"``, ``request.items[0].sku=A1``.

    The value is JSON when it reads as JSON, else the text itself (a string).

    Raises:
        InvalidArgument: not a condition of that shape, or a value that is not a scalar,
            or an order (``<``, ``>``) on true, false or null.

    """
    match = _CONDITION.fullmatch(text.strip())
    if match is None:
        raise InvalidArgument(
            "a condition is request.<path> or result.<path>, an operator (= != < <= > >=) "
            'and a value, e.g. request.amount>500 or result.status="timeout"'
        )
    payload, steps, operator, raw = match.groups()
    path: list[str | int] = [key if key else int(index) for key, index in _STEP.findall(steps)]
    try:
        value = msgspec.json.decode(raw.strip())
    except msgspec.DecodeError:
        value = raw.strip()
    if isinstance(value, dict | list):
        raise InvalidArgument("a condition's value is a number, a string, true, false or null")
    if (value is None or isinstance(value, bool)) and operator not in ("=", "==", "!="):
        raise InvalidArgument("true, false and null are compared with = or != only")
    return Condition(payload=payload, path=tuple(path), operator=operator, value=value)  # type: ignore[arg-type]


def parse_time(text: str) -> int:
    """Read a time as ms since the epoch: ISO 8601 (UTC unless it names an offset) or ms.

    Raises:
        InvalidArgument: neither.

    """
    if text.isdigit():
        return int(text)
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgument("a time is ISO 8601 (2026-01-31T12:00Z) or ms") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1000)


class SearchQuery(msgspec.Struct, frozen=True, kw_only=True):
    """What to look for; every filter given must hold."""

    tool: str | None = None
    error_code: str | None = None
    exception_type: str | None = None
    stage: str | None = None
    approver: str | None = None
    run_id: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    conditions: tuple[Condition, ...] = ()
    limit: int = 50
    cursor: str | None = None


class SearchHit(msgspec.Struct, frozen=True, kw_only=True):
    """One archived call found (no payload: its page shows them)."""

    invocation_id: str
    run_id: str
    tool_call_id: str
    tool: str
    stage: str
    status: str
    evidence_status: str | None
    error_code: str | None
    exception_type: str | None
    approver: str | None
    created_at_ms: int
    updated_at_ms: int


class SearchPage(msgspec.Struct, frozen=True, kw_only=True):
    """One page of hits, newest first; ``cursor`` fetches the next (None: the last page)."""

    hits: list[SearchHit]
    cursor: str | None


def _sqlite_path(path: tuple[str | int, ...]) -> str:
    return "$" + "".join(f'."{step}"' if isinstance(step, str) else f"[{step}]" for step in path)


def _sqlite_condition(condition: Condition) -> tuple[str, list[Any]]:
    column = f"i.{condition.payload}"
    doc = f"CASE WHEN typeof({column}) = 'text' AND json_valid({column}) THEN {column} END"
    path = _sqlite_path(condition.path)
    sql_operator = _OPERATORS[condition.operator][0]
    value = condition.value
    if value is None:
        test = "= 'null'" if sql_operator == "=" else "!= 'null'"
        return f"json_type({doc}, ?) {test}", [path]
    if isinstance(value, bool):
        wanted = "true" if value else "false"
        if sql_operator == "=":
            return f"json_type({doc}, ?) = ?", [path, wanted]
        return f"json_type({doc}, ?) IN ('true', 'false') AND json_type({doc}, ?) != ?", [
            path,
            path,
            wanted,
        ]
    kinds = "('integer', 'real')" if isinstance(value, int | float) else "('text')"
    return (
        f"json_type({doc}, ?) IN {kinds} AND json_extract({doc}, ?) {sql_operator} ?",
        [path, path, value],
    )


def _jsonpath(condition: Condition) -> str:
    steps = "".join(
        "." + msgspec.json.encode(step).decode() if isinstance(step, str) else f"[{step}]"
        for step in condition.path
    )
    literal = msgspec.json.encode(condition.value).decode()
    return f"$.{steps[1:]} {_OPERATORS[condition.operator][1]} {literal}" if steps else "$"


def _postgres_condition(condition: Condition) -> tuple[str, list[Any]]:
    column = f"i.{condition.payload}_doc"
    if _OPERATORS[condition.operator][1] == "==":
        return f"{column} @@ ?::jsonpath", [_jsonpath(condition)]
    # The GIN index serves equality only. For an order or !=, PostgreSQL estimates `@@`
    # at a handful of rows, so it reads the whole table and sorts it (12 s on a million
    # calls); the same test as a function gets the default estimate, and the plan walks
    # the time index newest first and stops at a page (tens of ms). Same semantics: `@@`
    # is jsonb_path_match with its errors silenced.
    return f"jsonb_path_match({column}, ?::jsonpath, '{{}}', true)", [_jsonpath(condition)]


async def search(archive: Archive, query: SearchQuery) -> SearchPage:
    """Find archived calls of the archive's namespace, newest first, one page.

    Raises:
        InvalidArgument: a limit out of 1..1000, or a cursor no page ended with.
        ArchiveUnavailable: the archive failed.

    """
    if not 1 <= query.limit <= MAX_LIMIT:
        raise InvalidArgument(f"limit must be between 1 and {MAX_LIMIT}")
    where = ["i.namespace = ?"]
    params: list[Any] = [archive.namespace]
    for column, value in (
        ("tool", query.tool),
        ("error_code", query.error_code),
        ("exception_type", query.exception_type),
        ("stage", query.stage),
        ("approver", query.approver),
        ("run_id", query.run_id),
    ):
        if value is not None:
            where.append(f"i.{column} = ?")
            params.append(value)
    if query.since_ms is not None:
        where.append("i.created_at_ms >= ?")
        params.append(query.since_ms)
    if query.until_ms is not None:
        where.append("i.created_at_ms < ?")
        params.append(query.until_ms)
    for condition in query.conditions:
        sql, values = (
            _postgres_condition(condition)
            if archive.database.dialect == "postgresql"
            else _sqlite_condition(condition)
        )
        where.append(f"({sql})")
        params += values
    if query.cursor is not None:
        match = _CURSOR.fullmatch(query.cursor)
        if match is None:
            raise InvalidArgument("that cursor is not one a page of search results ended with")
        at, inv_id = int(match.group(1)), match.group(2)
        where.append("(i.created_at_ms < ? OR (i.created_at_ms = ? AND i.invocation_id < ?))")
        params += [at, at, inv_id]
    rows = await archive.database.fetch(
        "SELECT i.invocation_id, i.run_id, i.tool_call_id, i.tool, i.stage, i.status, "
        "i.evidence_status, i.error_code, i.exception_type, i.approver, i.created_at_ms, "
        f"i.updated_at_ms FROM invocations i WHERE {' AND '.join(where)} "
        "ORDER BY i.created_at_ms DESC, i.invocation_id DESC LIMIT ?",
        [*params, query.limit + 1],
    )
    hits = [
        SearchHit(
            invocation_id=str(row[0]),
            run_id=str(row[1]),
            tool_call_id=str(row[2]),
            tool=str(row[3]),
            stage=str(row[4]),
            status=str(row[5]),
            evidence_status=row[6],
            error_code=row[7],
            exception_type=row[8],
            approver=row[9],
            created_at_ms=int(row[10]),
            updated_at_ms=int(row[11]),
        )
        for row in rows[: query.limit]
    ]
    cursor = None
    if len(rows) > query.limit:
        last = hits[-1]
        cursor = f"{last.created_at_ms}.{last.invocation_id}"
    return SearchPage(hits=hits, cursor=cursor)
