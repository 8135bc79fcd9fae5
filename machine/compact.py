"""The compact encoding of stored events (schema 2 on): one MessagePack array per event.

An event is stored as ``[type code, schema, event_id, version, at_ms, prev_hash, <the
fields of its type>]``, in the order of the Structs below. The type and the evidence
status are permanent codes; lowercase hex strings (payload digests, chain hashes, the
writer's event ids) are the bytes they spell; the genesis ``prev_hash`` is empty bytes;
any other value is itself. The fields are those of schema 1, which stored JSON objects;
only the spelling is shorter (about 110 bytes an event instead of about 400), which lets
an invocation's three events share one small stream node (see docs/performance.md). New
fields go last, with a default, so the shorter array of an older event still decodes.

This module knows the arrays only; :mod:`machine.events` turns events into them and back.
"""

from __future__ import annotations

from typing import Final

import msgspec

from machine.codes import ErrorCode, EvidenceStatus, Status
from machine.upcasting import JSONObject, UpcastError

#: Permanent code of each event type (compact events and feed entries).
TYPE_CODES: Final = {"Preflighted": 1, "ProjectingStarted": 2, "Completed": 3, "Failed": 4}

#: Permanent code of each public status (feed entries).
STATUS_CODES: Final = {Status.PROJECTING: 1, Status.READY: 2, Status.ERROR: 3}

#: Permanent code of each evidence status.
EVIDENCE_CODES: Final = {
    EvidenceStatus.PENDING: 0,
    EvidenceStatus.EVIDENCE_FOUND: 1,
    EvidenceStatus.NO_EVIDENCE: 2,
    EvidenceStatus.ERROR: 3,
}


class CompactEvent(msgspec.Struct, frozen=True, array_like=True):
    """The fields every array carries after its type code.

    These Structs read arrays whose digests, hashes and ids are all bytes, which is all a
    writer stores, so reading through them is the fast path; :func:`compact_document`
    reads any array.
    """

    schema: int
    event_id: bytes
    version: int
    at_ms: int
    prev_hash: bytes


class CompactPreflighted(CompactEvent, frozen=True, tag=TYPE_CODES["Preflighted"]):
    """The array of a ``Preflighted`` event."""

    run_id: str
    tool_call_id: str
    tool: str
    request_sha256: bytes
    request_bytes: int


class CompactProjectingStarted(CompactEvent, frozen=True, tag=TYPE_CODES["ProjectingStarted"]):
    """The array of a ``ProjectingStarted`` event."""

    raw_sha256: bytes
    raw_bytes: int


class CompactCompleted(CompactEvent, frozen=True, tag=TYPE_CODES["Completed"]):
    """The array of a ``Completed`` event."""

    result_sha256: bytes
    result_bytes: int
    evidence_status: int
    scope: str = ""


class CompactFailed(CompactEvent, frozen=True, tag=TYPE_CODES["Failed"]):
    """The array of a ``Failed`` event."""

    error_code: ErrorCode
    rejected_bytes: int | None = None


_COMPACT_TYPES: Final = {
    "Preflighted": CompactPreflighted,
    "ProjectingStarted": CompactProjectingStarted,
    "Completed": CompactCompleted,
    "Failed": CompactFailed,
}

#: Fields of the array after the type code and the schema, per event type.
COMPACT_LAYOUT: Final = {
    kind: tuple(name for name in wire.__struct_fields__ if name != "schema")
    for kind, wire in _COMPACT_TYPES.items()
}

#: How a field is spelled: as hex bytes, as the previous hash, as an evidence code, as is.
HEX, PREV_HASH, EVIDENCE, AS_IS = range(4)
_HEX_FIELDS: Final = frozenset({"event_id", "request_sha256", "raw_sha256", "result_sha256"})


def _spelling(name: str) -> int:
    if name == "prev_hash":
        return PREV_HASH
    if name in _HEX_FIELDS:
        return HEX
    return EVIDENCE if name == "evidence_status" else AS_IS


#: ``(field, spelling)`` of each field of the array after the schema, per event type.
SPELLINGS: Final = {
    kind: tuple((name, _spelling(name)) for name in layout)
    for kind, layout in COMPACT_LAYOUT.items()
}

_TYPE_OF_CODE: Final = {code: kind for kind, code in TYPE_CODES.items()}
EVIDENCE_OF_CODE: Final = {code: status for status, code in EVIDENCE_CODES.items()}
# First bytes of a MessagePack array (fixarray, array 16, array 32); JSON starts otherwise.
_ARRAY_MARKERS: Final = frozenset({*range(0x90, 0xA0), 0xDC, 0xDD})

compact_encoder: Final = msgspec.msgpack.Encoder()
compact_decoder: Final = msgspec.msgpack.Decoder(
    CompactPreflighted | CompactProjectingStarted | CompactCompleted | CompactFailed
)


def hex_bytes(value: str) -> bytes:
    """Return the bytes a lowercase hex string spells.

    Raises:
        ValueError: ``value`` is empty or not lowercase hex of whole bytes.

    """
    raw = bytes.fromhex(value)
    if not raw or len(value) != 2 * len(raw) or not (value.islower() or value.isdigit()):
        raise ValueError("not lowercase hex")
    return raw


def is_compact(data: bytes | str) -> bool:
    """Tell whether stored event bytes are in the compact encoding (schema 2 on)."""
    return isinstance(data, bytes) and bool(data) and data[0] in _ARRAY_MARKERS


def _unspelled(spelling: int, value: object, genesis_hash: str) -> object:
    if isinstance(value, bytes) and spelling == PREV_HASH:
        return value.hex() if value else genesis_hash
    if isinstance(value, bytes) and spelling == HEX:
        return value.hex()
    if spelling == EVIDENCE and isinstance(value, int) and not isinstance(value, bool):
        if value not in EVIDENCE_OF_CODE:
            raise msgspec.ValidationError(f"unknown evidence status code {value}")
        return EVIDENCE_OF_CODE[value].value
    return value


def compact_document(data: bytes, *, genesis_hash: str, newest_schema: int) -> JSONObject:
    """Return any compact array as the JSON object of its fields, as stored (not upcast).

    Args:
        data: the stored bytes.
        genesis_hash: what an empty ``prev_hash`` stands for.
        newest_schema: the newest schema the caller knows; a newer one is refused before
            its fields are read.

    Raises:
        msgspec.DecodeError: the bytes are not a compact event (UpcastError for a newer
            schema).

    """
    items = msgspec.msgpack.decode(data)
    if not isinstance(items, list) or len(items) < 2:
        raise msgspec.ValidationError("a compact event must be an array")
    code, schema, *values = items
    kind = _TYPE_OF_CODE.get(code) if isinstance(code, int) else None
    if kind is None:
        raise msgspec.ValidationError(f"unknown event type code {code!r}")
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise msgspec.ValidationError("event has no valid schema")
    if schema > newest_schema:
        raise UpcastError(f"{kind} schema {schema} is newer than this code ({newest_schema})")
    spellings = SPELLINGS[kind]
    if len(values) > len(spellings):
        raise msgspec.ValidationError(f"{kind} has more fields than schema {schema} knows")
    document: JSONObject = {"type": kind}
    for (name, spelling), value in zip(spellings, values, strict=False):
        document[name] = _unspelled(spelling, value, genesis_hash)
    document["schema"] = schema
    return document
