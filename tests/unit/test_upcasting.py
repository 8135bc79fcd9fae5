"""Event schema evolution: old stored shapes are upcast on read, hashes cover stored bytes."""

from __future__ import annotations

import msgspec
import pytest

from machine.codes import ErrorCode
from machine.events import (
    EVENT_TYPES,
    GENESIS_HASH,
    SCHEMA_VERSION,
    Failed,
    Preflighted,
    decode_event,
    encode_event,
    event_hash,
    stored_document,
)
from machine.fold import fold
from machine.upcasting import (
    UpcastError,
    register_upcaster,
    registered_upcasters,
    upcast,
)

LEGACY_FAILED = {
    "type": "Failed",
    "code": "EXECUTION_FAILED",
    "event_id": "e2",
    "version": 2,
    "at_ms": 2,
    "prev_hash": GENESIS_HASH,
    "schema": 0,
}


def _preflighted() -> Preflighted:
    return Preflighted(
        event_id="e1",
        version=1,
        at_ms=1,
        prev_hash=GENESIS_HASH,
        run_id="run-1",
        tool_call_id="call-1",
        tool="search",
        request_sha256="a" * 64,
        request_bytes=2,
    )


def test_current_schema_is_two_and_every_event_carries_it() -> None:
    """Events are written with schema 2, stored second in their compact array."""
    assert SCHEMA_VERSION == 2
    assert msgspec.msgpack.decode(encode_event(_preflighted()))[1] == 2
    assert stored_document(encode_event(_preflighted()))["schema"] == 2


def test_every_event_type_of_schema_1_has_a_step_to_schema_2() -> None:
    """Each event type stored as JSON (schema 1) has a registered upcaster to schema 2; the
    governed call's events came after schema 2 and never need one."""
    for kind in ("Preflighted", "ProjectingStarted", "Completed", "Failed"):
        assert (kind, 1) in registered_upcasters()
    assert not [kind for kind, _ in registered_upcasters() if kind not in EVENT_TYPES]


def test_schema0_failed_with_code_decodes_as_current_failed() -> None:
    """A schema 0 Failed event (``code``) decodes to a current Failed with ``error_code``."""
    event = decode_event(msgspec.json.encode(LEGACY_FAILED))
    assert isinstance(event, Failed)
    assert event.error_code is ErrorCode.EXECUTION_FAILED
    assert event.rejected_bytes is None
    assert event.schema == SCHEMA_VERSION


def test_upcast_leaves_its_input_untouched() -> None:
    """Upcasting returns a new object and never mutates the decoded stored event."""
    original = dict(LEGACY_FAILED)
    result = upcast(original, SCHEMA_VERSION)
    assert original == LEGACY_FAILED
    assert result["error_code"] == "EXECUTION_FAILED"
    assert "code" not in result
    assert result["schema"] == SCHEMA_VERSION


def test_current_event_is_returned_unchanged_by_upcast() -> None:
    """An event already at the current schema passes through upcast as an equal object."""
    obj = stored_document(encode_event(_preflighted()))
    assert upcast(obj, SCHEMA_VERSION) == obj


def test_future_schema_is_refused_as_a_decode_error() -> None:
    """An event newer than the code is undecodable (a DecodeError), never guessed at."""
    obj = stored_document(encode_event(_preflighted()))
    obj["schema"] = SCHEMA_VERSION + 1
    with pytest.raises(msgspec.DecodeError):
        decode_event(msgspec.json.encode(obj))
    items = msgspec.msgpack.decode(encode_event(_preflighted()))
    items[1] = SCHEMA_VERSION + 1
    with pytest.raises(UpcastError):
        decode_event(msgspec.msgpack.encode(items))


def test_old_schema_without_an_upcaster_is_refused() -> None:
    """A schema with no registered step raises UpcastError, a msgspec ValidationError."""
    obj = stored_document(encode_event(_preflighted()))
    obj["schema"] = 0
    with pytest.raises(UpcastError):
        upcast(obj, SCHEMA_VERSION)
    with pytest.raises(msgspec.ValidationError):
        decode_event(msgspec.json.encode(obj))


def test_malformed_current_event_still_raises_validation_error() -> None:
    """A current-schema event missing a field fails decoding after the slow path too."""
    obj = stored_document(encode_event(_preflighted()))
    del obj["tool"]
    with pytest.raises(msgspec.ValidationError):
        decode_event(msgspec.json.encode(obj))
    truncated = msgspec.msgpack.decode(encode_event(_preflighted()))[:-3]
    with pytest.raises(msgspec.ValidationError):
        decode_event(msgspec.msgpack.encode(truncated))


def test_non_object_json_is_refused() -> None:
    """A stored event that is JSON but not an object is a validation error."""
    with pytest.raises(msgspec.ValidationError):
        decode_event(b"[1, 2]")


def test_registering_the_same_step_twice_is_refused() -> None:
    """Each (event type, from_schema) pair has exactly one upcaster."""
    assert ("Failed", 0) in registered_upcasters()
    with pytest.raises(ValueError, match="exists"):
        register_upcaster("Failed", 0)(lambda obj: obj)


def test_chain_hash_covers_the_stored_bytes_not_the_upcast_shape() -> None:
    """Folding an upcast event with the stored bytes' hash keeps the chain of stored bytes."""
    first = encode_event(_preflighted())
    legacy = dict(LEGACY_FAILED, prev_hash=event_hash(first))
    stored = msgspec.json.encode(legacy)
    event = decode_event(stored)
    state = fold(fold(None, decode_event(first), event_hash(first)), event, event_hash(stored))
    assert state.last_hash == event_hash(stored)
    assert state.last_hash != event_hash(encode_event(event))
    assert state.error_code is ErrorCode.EXECUTION_FAILED
