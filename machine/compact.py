"""The compact encoding of stored events (schema 2 on): one MessagePack array per event.

An event is stored as ``[type code, schema, event_id, version, at_ms, prev_hash, <the
fields of its type>]``: the schema first, then the fields in the order the event Structs
of :mod:`machine.events` declare them. The type and the evidence status are permanent
codes; lowercase hex strings (the fields declared :data:`Hex`: payload digests, the
writer's event ids; and the chain hash, :data:`ChainHash`) are the bytes they spell; the
genesis ``prev_hash`` is empty bytes; any other value is itself. The fields are those of
schema 1, which stored JSON objects; only the spelling is shorter (about 110 bytes an
event instead of about 400), which lets an invocation's three events share one small
stream node (see docs/performance.md). New fields go last, with a default, so the
shorter array of an older event still decodes. A field added after its event type's
first compact shape is declared ``T | UnsetType`` with the default ``UNSET`` (an
*appended* field): an event that does not set it is stored without it, byte for byte as
before the field existed, and reads back with it ``UNSET``.

This module derives the arrays from the event declaration (:class:`CompactCodec`); it
imports nothing of :mod:`machine.events`, which hands its Structs in.
"""

from __future__ import annotations

import enum
import typing
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Final

import msgspec
from msgspec import UNSET, UnsetType

from machine.codes import EvidenceStatus, Status
from machine.upcasting import JSONObject, UpcastError

#: Permanent code of each event type (compact events and feed entries).
TYPE_CODES: Final = {
    "Preflighted": 1,
    "ProjectingStarted": 2,
    "Completed": 3,
    "Failed": 4,
    "ApprovalRequested": 5,
    "Approved": 6,
    "Denied": 7,
    "ApprovalExpired": 8,
    "Dispatched": 9,
    "ApprovalAdded": 10,
    "TakenOver": 11,
    "Reconciled": 12,
    "Settled": 13,
}

#: Permanent code of each public status (feed entries).
STATUS_CODES: Final = {Status.PROJECTING: 1, Status.READY: 2, Status.ERROR: 3}

#: Permanent code of each evidence status.
EVIDENCE_CODES: Final = {
    EvidenceStatus.PENDING: 0,
    EvidenceStatus.EVIDENCE_FOUND: 1,
    EvidenceStatus.NO_EVIDENCE: 2,
    EvidenceStatus.ERROR: 3,
}
EVIDENCE_OF_CODE: Final = {code: status for status, code in EVIDENCE_CODES.items()}


class Spelling(enum.IntEnum):
    """How a field is spelled in the array: as is, as hex bytes, as the chain hash, as a code."""

    AS_IS = 0
    HEX = 1
    PREV_HASH = 2
    EVIDENCE = 3


#: A lowercase hex string, stored as the bytes it spells (an event id, a payload digest).
Hex = Annotated[str, Spelling.HEX]
#: The previous event's chain hash: hex bytes, the genesis hash as empty bytes.
ChainHash = Annotated[str, Spelling.PREV_HASH]
#: An appended hex field: the bytes it spells, left out of the array while ``UNSET``.
OptionalHex = Annotated[str | UnsetType, Spelling.HEX]

_TYPE_OF_CODE: Final = {code: kind for kind, code in TYPE_CODES.items()}
# First bytes of a MessagePack array (fixarray, array 16, array 32); JSON starts otherwise.
_ARRAY_MARKERS: Final = frozenset({*range(0x90, 0xA0), 0xDC, 0xDD})

compact_encoder: Final = msgspec.msgpack.Encoder()


def hex_bytes(value: str) -> bytes:
    """Return the bytes a lowercase hex string spells.

    Raises:
        ValueError: ``value`` is empty or not lowercase hex of whole bytes.

    """
    raw = bytes.fromhex(value)
    # The bytes spelled back are the one lowercase spelling: no space, no capital.
    if not raw or raw.hex() != value:
        raise ValueError("not lowercase hex")
    return raw


def is_compact(data: bytes | str) -> bool:
    """Tell whether stored event bytes are in the compact encoding (schema 2 on)."""
    return isinstance(data, bytes) and bool(data) and data[0] in _ARRAY_MARKERS


def _appended(hint: Any) -> Any:
    """The type an appended field (``T | UnsetType``) holds when set, else None."""
    if typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    members = typing.get_args(hint)
    if UnsetType not in members:
        return None
    rest = tuple(member for member in members if member is not UnsetType)
    return rest[0] if len(rest) == 1 else typing.Union[rest]  # noqa: UP007


def _spelling_and_type(hint: Any) -> tuple[Spelling, Any]:
    """The spelling a declared field type asks for, and the type its array item has.

    An appended field's item may also be nil (``UNSET`` before a later appended field).
    """
    appended = _appended(hint)
    if typing.get_origin(hint) is Annotated:
        base, *marks = typing.get_args(hint)
        for mark in marks:
            if mark in (Spelling.HEX, Spelling.PREV_HASH):
                return Spelling(mark), (bytes if appended is None else bytes | None)
        hint = base if appended is None else appended
    elif appended is not None:
        hint = appended
    if hint is EvidenceStatus:
        return Spelling.EVIDENCE, int
    return Spelling.AS_IS, (hint if appended is None else hint | None)


# The converters are generated from the declaration and spell every field out per type:
# a shared dict unpacked into each constructor made decoding (the workers' hot path)
# twice as slow, and a loop over the fields slower still.
_DECODE_TEMPLATE: Final = """
def from_compact(wire):
    if wire.schema != SCHEMA:
        return None
    prev_hash = wire.prev_hash.hex() if wire.prev_hash else GENESIS
{checks}    return EVENT({arguments})
"""
_ENCODE_TEMPLATE: Final = """
def to_compact(event):
    return WIRE({arguments})
"""
# A type with appended fields is encoded as a list, so that the appended fields still at
# UNSET at its end can be left out: the array is then the one stored before they existed.
_ENCODE_APPENDED_TEMPLATE: Final = """
def to_compact(event):
    items = [CODE, {arguments}]
    while len(items) > KEPT and items[-1] is None:
        items.pop()
    return items
"""


class CompactCodec:
    """The compact arrays of the event Structs handed in, derived from their declaration.

    Args:
        events: the event Structs (tagged, with the fields of :mod:`machine.events`).
        genesis_hash: what an empty ``prev_hash`` stands for.
        schema: the current schema; arrays of another schema take the general path.

    Attributes:
        layout: per event type, its fields in array order after the schema.
        spellings: per event type, ``(field, spelling)`` in the same order.
        decoder: reads an array whose hex fields are all bytes (all a writer stores) into
            its compact Struct; :meth:`document` reads any array.
        from_compact: per compact Struct, the function that turns it into its event
            (None for another schema or an unknown evidence code); :meth:`decode` is the
            two steps in one.

    """

    def __init__(
        self, events: Sequence[type[msgspec.Struct]], *, genesis_hash: str, schema: int
    ) -> None:
        self._genesis_hash = genesis_hash
        self._schema = schema
        self.layout: dict[str, tuple[str, ...]] = {}
        self.spellings: dict[str, tuple[tuple[str, Spelling], ...]] = {}
        self._to_compact: dict[type[Any], Callable[[Any], Any]] = {}
        # Per event type, how many array items are always stored (appended ones may not be).
        self._kept: dict[str, int] = {}
        self.from_compact: dict[type[Any], Callable[[Any], Any]] = {}
        wires = [self._derive(event) for event in events]
        self.decoder = msgspec.msgpack.Decoder(typing.Union[tuple(wires)])  # noqa: UP007

    def _derive(self, event: type[msgspec.Struct]) -> type[msgspec.Struct]:
        kind = event.__struct_config__.tag
        assert isinstance(kind, str)
        hints = typing.get_type_hints(event, include_extras=True)
        defaults = {f.name: f.default for f in msgspec.structs.fields(event)}
        # Struct fields list a kw_only base's fields after the type's own; the array holds
        # the schema, the base's (every event's) fields, then the type's, as declared.
        common: tuple[str, ...] = getattr(event.__mro__[1], "__struct_fields__", ())
        own = tuple(name for name in event.__struct_fields__ if name not in common)
        names = ("schema", *(name for name in common if name != "schema"), *own)
        spelled = {name: _spelling_and_type(hints[name]) for name in names}
        appended = [name for name in names if _appended(hints[name]) is not None]
        self._kept[kind] = 1 + names.index(appended[0]) if appended else len(names) + 1
        self.layout[kind] = names[1:]
        self.spellings[kind] = tuple((name, spelled[name][0]) for name in names[1:])
        wire = msgspec.defstruct(
            f"Compact{kind}",
            [
                (name, spelled[name][1])
                if defaults[name] is msgspec.NODEFAULT or name == "schema"
                else (name, spelled[name][1], None if name in appended else defaults[name])
                for name in names
            ],
            tag=TYPE_CODES[kind],
            array_like=True,
            frozen=True,
        )
        scope: dict[str, Any] = {
            "SCHEMA": self._schema,
            "GENESIS": self._genesis_hash,
            "EVENT": event,
            "WIRE": wire,
            "EVIDENCE_OF_CODE": EVIDENCE_OF_CODE,
            "EVIDENCE_CODES": EVIDENCE_CODES,
            "hex_bytes": hex_bytes,
            "prev_bytes": self._prev_bytes,
            "UNSET": UNSET,
            "CODE": TYPE_CODES[kind],
            "KEPT": self._kept[kind],
        }
        checks, decoded, encoded = "", [], []
        for name in names:
            spelling = spelled[name][0]
            if name in appended:
                # Only hex and as-is fields are appended so far; nil stands for UNSET.
                assert spelling in (Spelling.HEX, Spelling.AS_IS), name
                spell = "hex_bytes(event.{0})" if spelling is Spelling.HEX else "event.{0}"
                unspell = "wire.{0}.hex()" if spelling is Spelling.HEX else "wire.{0}"
                decoded.append(f"{name}=UNSET if wire.{name} is None else {unspell.format(name)}")
                encoded.append(f"None if event.{name} is UNSET else {spell.format(name)}")
            elif spelling is Spelling.HEX:
                decoded.append(f"{name}=wire.{name}.hex()")
                encoded.append(f"hex_bytes(event.{name})")
            elif spelling is Spelling.PREV_HASH:
                decoded.append(f"{name}=prev_hash")
                encoded.append(f"prev_bytes(event.{name})")
            elif spelling is Spelling.EVIDENCE:
                checks += f"    {name} = EVIDENCE_OF_CODE.get(wire.{name})\n"
                checks += f"    if {name} is None:\n        return None\n"
                decoded.append(f"{name}={name}")
                encoded.append(f"EVIDENCE_CODES[event.{name}]")
            else:
                decoded.append(f"{name}=wire.{name}")
                encoded.append(f"event.{name}")
        exec(_DECODE_TEMPLATE.format(checks=checks, arguments=", ".join(decoded)), scope)  # noqa: S102 - our own template
        template = _ENCODE_APPENDED_TEMPLATE if appended else _ENCODE_TEMPLATE
        exec(template.format(arguments=", ".join(encoded)), scope)  # noqa: S102
        self.from_compact[wire] = scope["from_compact"]
        self._to_compact[event] = scope["to_compact"]
        return wire

    def _prev_bytes(self, value: str) -> bytes:
        return b"" if value == self._genesis_hash else hex_bytes(value)

    def encode(self, event: msgspec.Struct) -> bytes:
        """Return the array of ``event``; strings that are not lowercase hex stay strings."""
        try:
            return compact_encoder.encode(self._to_compact[type(event)](event))
        except ValueError:
            return compact_encoder.encode(self._items(event))

    def _items(self, event: msgspec.Struct) -> list[Any]:
        kind = event.__struct_config__.tag
        assert isinstance(kind, str)
        items: list[Any] = [TYPE_CODES[kind], getattr(event, "schema")]  # noqa: B009
        for name, spelling in self.spellings[kind]:
            value = getattr(event, name)
            if value is UNSET:
                pass
            elif spelling is Spelling.EVIDENCE:
                value = EVIDENCE_CODES[value]
            elif spelling is Spelling.HEX:
                value = _hex_or_text(value)
            elif spelling is Spelling.PREV_HASH:
                value = b"" if value == self._genesis_hash else _hex_or_text(value)
            items.append(None if value is UNSET else value)
        while len(items) > self._kept[kind] and items[-1] is None:
            items.pop()
        return items

    def decode(self, data: bytes) -> Any:
        """Return the current event an array stands for; None when it needs the general path.

        Raises:
            msgspec.ValidationError: the array does not fit the fast path's types.

        """
        wire = self.decoder.decode(data)
        return self.from_compact[type(wire)](wire)

    def document(self, data: bytes, *, newest_schema: int) -> JSONObject:
        """Return any compact array as the JSON object of its fields, as stored (not upcast).

        ``newest_schema`` is the newest schema the caller knows; a newer one is refused
        before its fields are read.

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
        spellings = self.spellings[kind]
        if len(values) > len(spellings):
            raise msgspec.ValidationError(f"{kind} has more fields than schema {schema} knows")
        document: JSONObject = {"type": kind}
        for position, ((name, spelling), value) in enumerate(
            zip(spellings, values, strict=False), start=2
        ):
            # A nil appended field was UNSET: the document leaves it out, as JSON did.
            if value is not None or position < self._kept[kind]:
                document[name] = _unspelled(spelling, value, self._genesis_hash)
        document["schema"] = schema
        return document


def _hex_or_text(value: str) -> bytes | str:
    try:
        return hex_bytes(value)
    except ValueError:
        return value


def _unspelled(spelling: Spelling, value: object, genesis_hash: str) -> object:
    if isinstance(value, bytes) and spelling is Spelling.PREV_HASH:
        return value.hex() if value else genesis_hash
    if isinstance(value, bytes) and spelling is Spelling.HEX:
        return value.hex()
    if spelling is Spelling.EVIDENCE and isinstance(value, int) and not isinstance(value, bool):
        if value not in EVIDENCE_OF_CODE:
            raise msgspec.ValidationError(f"unknown evidence status code {value}")
        return EVIDENCE_OF_CODE[value].value
    return value
