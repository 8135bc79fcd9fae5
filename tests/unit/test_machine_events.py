"""Events: explicit permanent tags, one compact stored encoding, lossless round trips."""

from __future__ import annotations

import msgspec
import pytest

from machine.codes import ErrorCode, EvidenceStatus
from machine.compact import EVIDENCE_CODES, TYPE_CODES, is_compact
from machine.events import (
    COMPACT_LAYOUT,
    EVENT_TYPES,
    GENESIS_HASH,
    PAYLOAD_FIELDS,
    PAYLOAD_OF,
    PAYLOADS_OF,
    SCHEMA_VERSION,
    ApprovalAdded,
    ApprovalExpired,
    ApprovalRequested,
    Approved,
    Completed,
    Denied,
    Dispatched,
    Event,
    Failed,
    Preflighted,
    ProjectingStarted,
    Reconciled,
    Settled,
    TakenOver,
    decode_event,
    encode_event,
    event_hash,
    event_type,
    payload_digest,
    stored_document,
)
from tests.helpers import make_event

_CLASSES = {
    "Preflighted": Preflighted,
    "ProjectingStarted": ProjectingStarted,
    "Completed": Completed,
    "Failed": Failed,
    "ApprovalRequested": ApprovalRequested,
    "ApprovalAdded": ApprovalAdded,
    "Approved": Approved,
    "Denied": Denied,
    "ApprovalExpired": ApprovalExpired,
    "Dispatched": Dispatched,
    "TakenOver": TakenOver,
    "Reconciled": Reconciled,
    "Settled": Settled,
}
#: The event types stored as JSON before schema 2 (the governed call's came after).
_SCHEMA_1_TYPES = ("Preflighted", "ProjectingStarted", "Completed", "Failed")


@pytest.mark.parametrize("kind", EVENT_TYPES)
def test_event_round_trips_with_explicit_tag(kind: str) -> None:
    """Each event is stored with its type and schema and decodes back to an equal event."""
    event = make_event(kind, None)
    data = encode_event(event)
    assert is_compact(data)
    assert msgspec.msgpack.decode(data)[:2] == [TYPE_CODES[kind], SCHEMA_VERSION]
    document = stored_document(data)
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
    """JSON events decode from str as from bytes; an unknown type is a DecodeError."""
    event = make_event("Failed", None)
    stored_json = msgspec.json.encode(event)
    assert decode_event(stored_json.decode()) == event == decode_event(stored_json)
    with pytest.raises(msgspec.DecodeError):
        decode_event(b'{"type":"Teleported","event_id":"x","version":1,"at_ms":1}')
    with pytest.raises(msgspec.DecodeError):
        decode_event(msgspec.msgpack.encode([9, SCHEMA_VERSION, "x", 1, 1, b""]))
    with pytest.raises(msgspec.DecodeError):
        decode_event(b"not json")
    with pytest.raises(msgspec.DecodeError):
        decode_event(b"\x93\x01")  # a truncated compact event


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
    """Error codes are stored as their stable strings, evidence statuses as permanent codes."""
    failed = encode_event(make_event("Failed", None))
    assert ErrorCode.EXECUTION_FAILED.value in msgspec.msgpack.decode(failed)
    assert stored_document(failed)["error_code"] == ErrorCode.EXECUTION_FAILED.value
    completed = encode_event(make_event("Completed", None))
    position = 2 + COMPACT_LAYOUT["Completed"].index("evidence_status")
    code = EVIDENCE_CODES[EvidenceStatus.EVIDENCE_FOUND]
    assert msgspec.msgpack.decode(completed)[position] == code
    assert stored_document(completed)["evidence_status"] == "EVIDENCE_FOUND"


def test_code_tables_are_permanent() -> None:
    """Type and evidence codes never change: stored events are read by them."""
    assert TYPE_CODES == {
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
    assert {status.value: code for status, code in EVIDENCE_CODES.items()} == {
        "PENDING": 0,
        "EVIDENCE_FOUND": 1,
        "NO_EVIDENCE": 2,
        "ERROR": 3,
    }
    assert set(EVIDENCE_CODES) == set(EvidenceStatus)


@pytest.mark.parametrize("kind", EVENT_TYPES)
def test_compact_layout_names_every_field_once(kind: str) -> None:
    """No event field is left out of the compact encoding, none is stored twice."""
    fields = set(_CLASSES[kind].__struct_fields__) - {"schema"}
    layout = COMPACT_LAYOUT[kind]
    assert len(layout) == len(set(layout)) and set(layout) == fields


@pytest.mark.parametrize(
    "event",
    [
        ProjectingStarted(
            event_id="e2", version=2, at_ms=0, prev_hash="AB", raw_sha256="", raw_bytes=0
        ),
        ProjectingStarted(
            event_id="abc", version=2, at_ms=2**62, prev_hash="", raw_sha256="0f", raw_bytes=1
        ),
        Failed(
            event_id="ff" * 40,
            version=9,
            at_ms=1,
            prev_hash=GENESIS_HASH,
            error_code=ErrorCode.RESULT_TOO_LARGE,
        ),
    ],
)
def test_any_string_round_trips(event: Event) -> None:
    """Ids and hashes that are not lowercase hex are stored as text, losslessly."""
    data = encode_event(event)
    assert decode_event(data) == event
    assert encode_event(decode_event(data)) == data


def test_hex_is_stored_as_bytes_and_genesis_as_nothing() -> None:
    """Digests, hashes and ids take the bytes they spell; the genesis hash takes none."""
    first = make_event("Preflighted", None, event_id="ab" * 16)
    items = msgspec.msgpack.decode(encode_event(first))
    assert items[2] == bytes.fromhex("ab" * 16) and items[5] == b""
    assert bytes.fromhex(first.request_sha256) in items
    assert decode_event(encode_event(first)).prev_hash == GENESIS_HASH


def test_schema1_json_events_still_decode() -> None:
    """Events stored as JSON before schema 2 decode to the equal current event."""
    for kind in _SCHEMA_1_TYPES:
        event = make_event(kind, None)
        stored = msgspec.json.encode(msgspec.structs.replace(event, schema=1))
        assert b'"schema":1' in stored and not is_compact(stored)
        assert decode_event(stored) == event
        assert stored_document(stored)["schema"] == 1


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
    assert bytes.fromhex(payload_digest(payload)) in data


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


def test_payload_fields_are_read_from_the_declaration() -> None:
    """Each payload's record field, digest and size come from the event Structs' marks."""
    assert PAYLOAD_FIELDS == {
        "request": ("request_sha256", "request_bytes"),
        "raw": ("raw_sha256", "raw_bytes"),
        "result": ("result_sha256", "result_bytes"),
        "failure_detail": ("failure_detail_sha256", "failure_detail_bytes"),
        "settlement_evidence": ("settlement_evidence_sha256", "settlement_evidence_bytes"),
    }
    assert PAYLOAD_OF["Failed"] == (
        "failure_detail",
        "failure_detail_sha256",
        "failure_detail_bytes",
        "rejected_bytes",
    )
    assert PAYLOAD_OF["Completed"].rejected is None


@pytest.mark.parametrize("kind", EVENT_TYPES)
def test_digests_and_ids_are_stored_as_bytes(kind: str) -> None:
    """Every field declared hex (digests, event ids, the chain hash) is bytes in the array."""
    hex_fields = {"event_id", "prev_hash"} | {
        name for name in COMPACT_LAYOUT[kind] if name.endswith("_sha256")
    }
    event = make_event(kind, None, prev_hash="ab" * 32)
    if isinstance(event, Failed):  # with its appended fields set, so that all are stored
        event = msgspec.structs.replace(
            event,
            failure_detail_sha256=payload_digest(b"{}"),
            failure_detail_bytes=2,
            result_sha256=payload_digest(b'""'),
            result_bytes=2,
        )
    # The appended fields of the others too (the ids of linked calls).
    if isinstance(event, ApprovalRequested):
        event = msgspec.structs.replace(
            event,
            supersedes="call-0",
            requested_by="ana",
            approvals_required=2,
            retry_of="call-0",
            retried_by="bo",
        )
    if isinstance(event, Approved):
        event = msgspec.structs.replace(event, approval_count=2)
    if isinstance(event, Denied):
        event = msgspec.structs.replace(event, superseded_by="call-0.edit1")
    items = msgspec.msgpack.decode(encode_event(event))
    assert len(items) == 2 + len(COMPACT_LAYOUT[kind])
    for position, name in enumerate(COMPACT_LAYOUT[kind], start=2):
        assert isinstance(items[position], bytes) == (name in hex_fields), name


def _failed(**fields: object) -> Failed:
    return Failed(
        event_id="ab" * 16,
        version=2,
        at_ms=5,
        prev_hash=GENESIS_HASH,
        error_code=ErrorCode.EXECUTION_FAILED,
        **fields,  # type: ignore[arg-type]
    )


def test_appended_fields_unset_are_not_stored() -> None:
    """A Failed without a failure detail is stored as before the detail existed."""
    plain = _failed()
    items = msgspec.msgpack.decode(encode_event(plain))
    assert len(items) == 2 + COMPACT_LAYOUT["Failed"].index("rejected_bytes") + 1
    assert items[-1] is None  # rejected_bytes, which always was stored
    assert decode_event(encode_event(plain)) == plain
    assert "failure_detail_sha256" not in stored_document(encode_event(plain))
    assert b"failure_detail" not in msgspec.json.encode(plain)


def test_appended_fields_round_trip_compact_and_json() -> None:
    """A Failed with a detail stores its digest as bytes and reads back equal."""
    digest = payload_digest(b"detail")
    kept = _failed(rejected_bytes=None, failure_detail_sha256=digest, failure_detail_bytes=6)
    data = encode_event(kept)
    assert msgspec.msgpack.decode(data)[-2:] == [bytes.fromhex(digest), 6]
    assert decode_event(data) == kept
    assert encode_event(decode_event(data)) == data
    assert stored_document(data)["failure_detail_sha256"] == digest
    as_json = msgspec.json.encode(msgspec.structs.replace(kept, schema=1))
    assert decode_event(as_json) == kept


def test_a_failed_event_may_name_an_agent_result_without_a_detail() -> None:
    """The agent result (the tool's own error text) is appended after the detail: a Failed
    naming it alone stores nil for the detail, and reads back equal."""
    digest = payload_digest(b'"bad city"')
    shown = _failed(result_sha256=digest, result_bytes=10)
    data = encode_event(shown)
    assert msgspec.msgpack.decode(data)[-4:] == [None, None, bytes.fromhex(digest), 10]
    assert decode_event(data) == shown
    document = stored_document(data)
    assert document["result_sha256"] == digest and "failure_detail_sha256" not in document


def test_a_failed_event_names_two_payloads_in_one_record_field_each() -> None:
    """Failed carries the failure detail, then the agent result, in the very record fields
    (and digest and size fields) Completed stores its result in."""
    assert PAYLOADS_OF["Failed"] == (
        ("failure_detail", "failure_detail_sha256", "failure_detail_bytes", "rejected_bytes"),
        ("result", "result_sha256", "result_bytes", "rejected_bytes"),
    )
    assert PAYLOADS_OF["Completed"] == (PAYLOAD_OF["Completed"],)
    assert PAYLOAD_FIELDS["result"] == ("result_sha256", "result_bytes")


def test_an_appended_field_that_is_not_hex_takes_the_general_path() -> None:
    """A digest that is not lowercase hex is stored as text and still reads back."""
    odd = _failed(failure_detail_sha256="NOT-HEX", failure_detail_bytes=1)
    assert decode_event(encode_event(odd)) == odd
