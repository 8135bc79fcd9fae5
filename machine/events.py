"""The four invocation events: frozen, tagged msgspec Structs and their one stored encoding.

Events carry digests and UTF-8 sizes of payloads, never payload bytes; the canonical
record is the one place that holds the bytes. Each event names the hash of the event
before it, so an invocation's stream is a tamper-evident chain.

Tags are explicit and permanent: renaming a class never changes what is stored.

Events are stored in the compact encoding of schema 2 (:mod:`machine.compact`): one
MessagePack array with every field, hex as bytes. Events of schemas 0 and 1 were JSON
objects; they are read, upcast (:mod:`machine.upcasting`) and hashed as stored, never
rewritten.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any, Final

import msgspec

from machine.codes import ErrorCode, EvidenceStatus
from machine.compact import (
    EVIDENCE,
    EVIDENCE_CODES,
    EVIDENCE_OF_CODE,
    HEX,
    PREV_HASH,
    SPELLINGS,
    TYPE_CODES,
    CompactCompleted,
    CompactEvent,
    CompactFailed,
    CompactPreflighted,
    CompactProjectingStarted,
    compact_decoder,
    compact_document,
    compact_encoder,
    hex_bytes,
    is_compact,
)
from machine.upcasting import JSONObject, upcast

#: ``prev_hash`` of the first event of every invocation.
GENESIS_HASH: Final = "0" * 64

#: Schema version written into every event of the current shape.
SCHEMA_VERSION: Final = 2


class _Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Fields every event carries."""

    event_id: str
    version: int
    at_ms: int
    prev_hash: str
    schema: int = SCHEMA_VERSION


class Preflighted(_Event, frozen=True, tag="Preflighted"):
    """The call passed preflight; the record is created with the complete request."""

    run_id: str
    tool_call_id: str
    tool: str
    request_sha256: str
    request_bytes: int


class ProjectingStarted(_Event, frozen=True, tag="ProjectingStarted"):
    """The executor returned; its raw response is stored complete."""

    raw_sha256: str
    raw_bytes: int


class Completed(_Event, frozen=True, tag="Completed"):
    """The projector returned a bounded agent result; the record becomes READY."""

    result_sha256: str
    result_bytes: int
    evidence_status: EvidenceStatus
    scope: str = ""


class Failed(_Event, frozen=True, tag="Failed"):
    """The invocation ended in ERROR with a stable code.

    ``rejected_bytes`` records the size of a payload refused for its size, for audit;
    the payload itself is never stored.
    """

    error_code: ErrorCode
    rejected_bytes: int | None = None


Event = Preflighted | ProjectingStarted | Completed | Failed

#: Event type names (the permanent tags), in lifecycle order.
EVENT_TYPES: Final = ("Preflighted", "ProjectingStarted", "Completed", "Failed")

_json_decoder = msgspec.json.Decoder(Event)


def _prev_bytes(value: str) -> bytes:
    return b"" if value == GENESIS_HASH else hex_bytes(value)


def _compact_head(event: Event) -> dict[str, Any]:
    """The fields every compact event starts with; ValueError when an id is not hex."""
    return {
        "schema": event.schema,
        "event_id": hex_bytes(event.event_id),
        "version": event.version,
        "at_ms": event.at_ms,
        "prev_hash": _prev_bytes(event.prev_hash),
    }


def _compact_of(event: Event) -> CompactEvent:
    """The fast-path array of ``event``; ValueError when one of its strings is not hex."""
    head = _compact_head(event)
    match event:
        case Preflighted():
            return CompactPreflighted(
                **head,
                run_id=event.run_id,
                tool_call_id=event.tool_call_id,
                tool=event.tool,
                request_sha256=hex_bytes(event.request_sha256),
                request_bytes=event.request_bytes,
            )
        case ProjectingStarted():
            return CompactProjectingStarted(
                **head,
                raw_sha256=hex_bytes(event.raw_sha256),
                raw_bytes=event.raw_bytes,
            )
        case Completed():
            return CompactCompleted(
                **head,
                result_sha256=hex_bytes(event.result_sha256),
                result_bytes=event.result_bytes,
                evidence_status=EVIDENCE_CODES[event.evidence_status],
                scope=event.scope,
            )
        case Failed():
            return CompactFailed(
                **head,
                error_code=event.error_code,
                rejected_bytes=event.rejected_bytes,
            )
    raise TypeError(f"not an event: {type(event).__name__}")  # pragma: no cover


def _compact_items(event: Event) -> list[Any]:
    """The same array for any event: strings that are not lowercase hex stay strings."""
    kind = event_type(event)
    items: list[Any] = [TYPE_CODES[kind], event.schema]
    for name, spelling in SPELLINGS[kind]:
        value = getattr(event, name)
        if spelling == EVIDENCE:
            value = EVIDENCE_CODES[value]
        elif spelling in (HEX, PREV_HASH):
            with contextlib.suppress(ValueError):
                value = _prev_bytes(value) if spelling == PREV_HASH else hex_bytes(value)
        items.append(value)
    return items


def encode_event(event: Event) -> bytes:
    """Return the stored bytes of ``event``: its compact encoding (:mod:`machine.compact`)."""
    try:
        return compact_encoder.encode(_compact_of(event))
    except ValueError:
        return compact_encoder.encode(_compact_items(event))


def _from_compact(wire: CompactEvent) -> Event | None:
    """The current event a fast-path array stands for; None when it needs the general path."""
    if wire.schema != SCHEMA_VERSION:
        return None
    # The common fields are spelled out per type: a shared dict unpacked into each
    # constructor made decoding (the workers' hot path) twice as slow.
    prev_hash = wire.prev_hash.hex() if wire.prev_hash else GENESIS_HASH
    match wire:
        case CompactPreflighted():
            return Preflighted(
                event_id=wire.event_id.hex(),
                version=wire.version,
                at_ms=wire.at_ms,
                prev_hash=prev_hash,
                schema=wire.schema,
                run_id=wire.run_id,
                tool_call_id=wire.tool_call_id,
                tool=wire.tool,
                request_sha256=wire.request_sha256.hex(),
                request_bytes=wire.request_bytes,
            )
        case CompactProjectingStarted():
            return ProjectingStarted(
                event_id=wire.event_id.hex(),
                version=wire.version,
                at_ms=wire.at_ms,
                prev_hash=prev_hash,
                schema=wire.schema,
                raw_sha256=wire.raw_sha256.hex(),
                raw_bytes=wire.raw_bytes,
            )
        case CompactCompleted():
            evidence = EVIDENCE_OF_CODE.get(wire.evidence_status)
            if evidence is None:
                return None
            return Completed(
                event_id=wire.event_id.hex(),
                version=wire.version,
                at_ms=wire.at_ms,
                prev_hash=prev_hash,
                schema=wire.schema,
                result_sha256=wire.result_sha256.hex(),
                result_bytes=wire.result_bytes,
                evidence_status=evidence,
                scope=wire.scope,
            )
        case CompactFailed():
            return Failed(
                event_id=wire.event_id.hex(),
                version=wire.version,
                at_ms=wire.at_ms,
                prev_hash=prev_hash,
                schema=wire.schema,
                error_code=wire.error_code,
                rejected_bytes=wire.rejected_bytes,
            )
    return None  # pragma: no cover - the decoder yields only the four types


def stored_document(data: bytes | str) -> JSONObject:
    """Return a stored event as a JSON object of its fields, as stored (not upcast).

    Digests, hashes and ids are given as hex strings and codes as their names, so the
    document reads the same whichever encoding the event was stored in.

    Raises:
        msgspec.DecodeError: the bytes are not an event in a known encoding.

    """
    if isinstance(data, bytes) and is_compact(data):
        return compact_document(data, genesis_hash=GENESIS_HASH, newest_schema=SCHEMA_VERSION)
    obj = msgspec.json.decode(data)
    if not isinstance(obj, dict):
        raise msgspec.ValidationError("an event must be a JSON object")
    return obj


def decode_event(data: bytes | str) -> Event:
    """Decode one stored event, upcast to the current schema; raises ``msgspec.DecodeError``.

    Compact events as writers store them, and JSON events of the current shape, take a
    typed fast path; anything else is decoded to a dict (:func:`stored_document`), upcast
    by :mod:`machine.upcasting` and converted. Hash the stored bytes, not the result.
    """
    event: Event | None
    try:
        if isinstance(data, bytes) and is_compact(data):
            event = _from_compact(compact_decoder.decode(data))
        else:
            event = _json_decoder.decode(data)
            if event.schema != SCHEMA_VERSION:
                event = None
    except msgspec.ValidationError:
        event = None
    if event is not None:
        return event
    upcast_event: Event = msgspec.convert(upcast(stored_document(data), SCHEMA_VERSION), Event)
    return upcast_event


def event_type(event: Event) -> str:
    """Return the permanent tag of ``event``."""
    tag = type(event).__struct_config__.tag
    assert isinstance(tag, str)
    return tag


def event_hash(encoded: bytes) -> str:
    """Return the chain hash of one encoded event: SHA-256 hex of its stored bytes."""
    return hashlib.sha256(encoded).hexdigest()


def payload_digest(payload: bytes) -> str:
    """Return the SHA-256 hex digest of a payload's UTF-8 bytes."""
    return hashlib.sha256(payload).hexdigest()
