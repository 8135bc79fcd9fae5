"""The four invocation events: frozen, tagged msgspec Structs and their one encoding.

Events carry digests and UTF-8 sizes of payloads, never payload bytes; the canonical
record is the one place that holds the bytes. Each event names the hash of the event
before it, so an invocation's stream is a tamper-evident chain.

Tags are explicit and permanent: renaming a class never changes what is stored.
"""

from __future__ import annotations

import hashlib
from typing import Final

import msgspec

from machine.codes import ErrorCode, EvidenceStatus
from machine.upcasting import upcast

#: ``prev_hash`` of the first event of every invocation.
GENESIS_HASH: Final = "0" * 64

#: Schema version written into every event of the current shape.
SCHEMA_VERSION: Final = 1


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

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Event)


def encode_event(event: Event) -> bytes:
    """Return the canonical JSON bytes of ``event`` (fields in declaration order)."""
    return _encoder.encode(event)


def decode_event(data: bytes | str) -> Event:
    """Decode one stored event, upcast to the current schema; raises ``msgspec.DecodeError``.

    Current-schema events take the typed fast path; older ones are decoded to a dict,
    upcast by :mod:`machine.upcasting` and converted. Hash the stored bytes, not the result.
    """
    try:
        event = _decoder.decode(data)
    except msgspec.ValidationError:
        event = None
    if event is not None and event.schema == SCHEMA_VERSION:
        return event
    obj = msgspec.json.decode(data)
    if not isinstance(obj, dict):
        raise msgspec.ValidationError("an event must be a JSON object")
    upcast_event: Event = msgspec.convert(upcast(obj, SCHEMA_VERSION), Event)
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
