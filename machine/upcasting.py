"""Event schema evolution: upcasters turn stored events of an old schema into the current one.

Every event carries ``schema`` (its shape version). Stored bytes are never rewritten: an
event of an older schema is upcast on read, step by step (``n`` to ``n + 1``), by pure
functions on its decoded fields (a JSON object), and only then converted to the current Struct. The
chain hash always covers the stored bytes, never the upcast shape, so upgrading the code
cannot break a journal's chain.

Rules for a new upcaster: register it for ``(event type, from_schema)``; take a dict and
return a dict; never do I/O; never invent data an auditor could mistake for an
observation (use the field's documented default instead). The registry sets ``schema``
to ``from_schema + 1`` after each step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgspec

from machine.errors import CanonError

JSONObject = dict[str, Any]
Upcaster = Callable[[JSONObject], JSONObject]

_UPCASTERS: dict[tuple[str, int], Upcaster] = {}


class UpcastError(CanonError, msgspec.ValidationError):
    """Raised when a stored event's schema cannot be brought to the current one.

    It is a ``msgspec.ValidationError`` (hence a ``msgspec.DecodeError``), so readers
    that treat undecodable events as such need no special case.
    """


def register_upcaster(event_type: str, from_schema: int) -> Callable[[Upcaster], Upcaster]:
    """Register ``fn`` as the upcaster of ``event_type`` events from ``from_schema``.

    Args:
        event_type: the permanent tag of the event (``"Failed"``...).
        from_schema: the schema the function reads; it produces ``from_schema + 1``.

    Raises:
        ValueError: an upcaster for that pair is already registered.

    """

    def decorator(fn: Upcaster) -> Upcaster:
        key = (event_type, from_schema)
        if key in _UPCASTERS:
            raise ValueError(f"an upcaster for {event_type} schema {from_schema} exists")
        _UPCASTERS[key] = fn
        return fn

    return decorator


def registered_upcasters() -> list[tuple[str, int]]:
    """Return the registered ``(event type, from_schema)`` pairs, sorted."""
    return sorted(_UPCASTERS)


def upcast(obj: JSONObject, current_schema: int) -> JSONObject:
    """Return ``obj`` (a decoded stored event) upcast to ``current_schema``.

    The input is not modified. An event already at ``current_schema`` is returned as is.

    Raises:
        UpcastError: the schema is newer than this code knows, not an integer, or a step
            has no registered upcaster.

    """
    schema = obj.get("schema", current_schema)
    kind = obj.get("type")
    if not isinstance(schema, int) or isinstance(schema, bool) or not isinstance(kind, str):
        raise UpcastError("event has no valid type or schema")
    if schema > current_schema:
        raise UpcastError(f"{kind} schema {schema} is newer than this code ({current_schema})")
    result = dict(obj)
    while schema < current_schema:
        step = _UPCASTERS.get((kind, schema))
        if step is None:
            raise UpcastError(f"no upcaster for {kind} schema {schema}")
        result = dict(step(dict(result)))
        schema += 1
        result["schema"] = schema
    return result


#: The last schema stored as JSON objects; schema 2 stores compact arrays (machine.compact).
JSON_SCHEMA: Final = 1
# The event types stored as JSON objects (schema 1): the four that existed before the
# compact encoding; every later event was stored compact from its first write.
_EVENT_TYPES: Final = ("Preflighted", "ProjectingStarted", "Completed", "Failed")


def _json_to_compact(obj: JSONObject) -> JSONObject:
    """Schema 1 events were JSON objects; schema 2 stores the same fields compactly.

    The fields, their names and their values did not change, so there is nothing to
    convert: the step only records that the event was read from its JSON form.
    """
    return obj


for _kind in _EVENT_TYPES:
    register_upcaster(_kind, JSON_SCHEMA)(_json_to_compact)
