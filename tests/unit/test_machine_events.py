"""Events: explicit permanent tags, canonical JSON, lossless round trips."""

from __future__ import annotations

import json

import msgspec
import pytest

from machine.codes import ErrorCode, EvidenceStatus
from machine.events import (
    EVENT_TYPES,
    GENESIS_HASH,
    SCHEMA_VERSION,
    Completed,
    Failed,
    Preflighted,
    ProjectingStarted,
    decode_event,
    encode_event,
    event_hash,
    event_type,
    payload_digest,
)
from tests.helpers import make_event

_CLASSES = {
    "Preflighted": Preflighted,
    "ProjectingStarted": ProjectingStarted,
    "Completed": Completed,
    "Failed": Failed,
}


@pytest.mark.parametrize("kind", EVENT_TYPES)
def test_event_round_trips_with_explicit_tag(kind: str) -> None:
    """Each event encodes with "type": <its tag> and decodes back to an equal event."""
    event = make_event(kind, None)
    data = encode_event(event)
    document = json.loads(data)
    assert document["type"] == kind
    assert document["schema"] == SCHEMA_VERSION
    decoded = decode_event(data)
    assert type(decoded) is _CLASSES[kind]
    assert decoded == event
    assert event_type(decoded) == kind
    assert encode_event(decoded) == data


def test_tags_do_not_depend_on_class_names() -> None:
    """The tag is declared explicitly on every event class, never derived from its name."""
    for kind, cls in _CLASSES.items():
        assert cls.__struct_config__.tag == kind
        assert cls.__struct_config__.tag_field == "type"


def test_decoding_accepts_text_and_refuses_unknown_tags() -> None:
    """Stored events decode from str as from bytes; an unknown type is a DecodeError."""
    event = make_event("Failed", None)
    assert decode_event(encode_event(event).decode()) == event
    with pytest.raises(msgspec.DecodeError):
        decode_event(b'{"type":"Teleported","event_id":"x","version":1,"at_ms":1}')
    with pytest.raises(msgspec.DecodeError):
        decode_event(b"not json")


def test_old_fixture_without_defaults_still_decodes() -> None:
    """A Completed stored without scope or schema decodes with their defaults."""
    stored = (
        b'{"type":"Completed","event_id":"e3","version":3,"at_ms":5,"prev_hash":"'
        + GENESIS_HASH.encode()
        + b'","result_sha256":"ab","result_bytes":2,"evidence_status":"NO_EVIDENCE"}'
    )
    event = decode_event(stored)
    assert isinstance(event, Completed)
    assert event.scope == ""
    assert event.schema == SCHEMA_VERSION
    assert event.evidence_status is EvidenceStatus.NO_EVIDENCE


def test_enum_fields_are_stored_as_their_values() -> None:
    """Evidence statuses and error codes are stored as their stable string values."""
    failed = json.loads(encode_event(make_event("Failed", None)))
    assert failed["error_code"] == ErrorCode.EXECUTION_FAILED.value
    completed = json.loads(encode_event(make_event("Completed", None)))
    assert completed["evidence_status"] == "EVIDENCE_FOUND"


def test_events_carry_digests_never_payloads() -> None:
    """An encoded event holds the payload digest and size, not the payload bytes."""
    payload = b'{"secret-marker":1}'
    event = ProjectingStarted(
        event_id="e2",
        version=2,
        at_ms=1,
        prev_hash=GENESIS_HASH,
        raw_sha256=payload_digest(payload),
        raw_bytes=len(payload),
    )
    data = encode_event(event)
    assert b"secret-marker" not in data
    assert payload_digest(payload).encode() in data


def test_hashes_are_sha256_hex() -> None:
    """Chain hashes and payload digests are 64 lowercase hex digits of SHA-256."""
    assert event_hash(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert payload_digest(b"abc") == event_hash(b"abc")
    assert GENESIS_HASH == "0" * 64


def test_events_are_frozen() -> None:
    """Events cannot be changed after they are built."""
    event = make_event("Preflighted", None)
    with pytest.raises(AttributeError):
        event.version = 2  # type: ignore[misc]
