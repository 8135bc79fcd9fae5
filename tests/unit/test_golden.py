"""Golden event histories fold to byte-identical records, so no fold or shape change slips by."""

from __future__ import annotations

import hashlib
import importlib.util
import pathlib
from types import ModuleType

import msgspec
import pytest

from machine.compact import is_compact
from machine.events import (
    COMPACT_LAYOUT,
    GENESIS_HASH,
    SCHEMA_VERSION,
    decode_event,
    encode_event,
    event_hash,
    stored_document,
)

GOLDEN = pathlib.Path(__file__).parents[1] / "golden"
NAMES = sorted(path.name.removesuffix(".jsonl") for path in GOLDEN.glob("*.jsonl"))

#: What each fixture is about, checked against its expected file so the files stay meaningful.
EXPECTED_OUTCOME = {
    "ready": ("READY", "EVIDENCE_FOUND", None),
    "no-evidence": ("READY", "NO_EVIDENCE", None),
    "error-executing": ("ERROR", "ERROR", "EXECUTION_FAILED"),
    "error-projecting": ("ERROR", "ERROR", "RESULT_TOO_LARGE"),
    "legacy-schema0": ("ERROR", "ERROR", "EXECUTION_FAILED"),
}


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_golden", GOLDEN / "make_golden.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: The schema 2 (compact) companions: the same lifecycles, and one stream that began as
#: JSON before the upgrade and ended compactly after it.
COMPACT_OUTCOME = {
    "ready": EXPECTED_OUTCOME["ready"],
    "no-evidence": EXPECTED_OUTCOME["no-evidence"],
    "error-executing": EXPECTED_OUTCOME["error-executing"],
    "error-projecting": EXPECTED_OUTCOME["error-projecting"],
    "upgrade": ("READY", "EVIDENCE_FOUND", None),
    "error-detail": ("ERROR", "ERROR", "EXECUTION_FAILED"),
    "error-detail-projecting": ("ERROR", "ERROR", "PROJECTION_FAILED"),
}
COMPACT_NAMES = sorted(path.name.removesuffix(".compact.hex") for path in GOLDEN.glob("*.hex"))


def _lines(name: str) -> list[bytes]:
    return (GOLDEN / f"{name}.jsonl").read_bytes().splitlines()


def _compact_lines(name: str) -> list[bytes]:
    text = (GOLDEN / f"{name}.compact.hex").read_text("ascii")
    return [bytes.fromhex(line) for line in text.splitlines()]


def test_every_required_history_is_checked_in() -> None:
    """READY, NO_EVIDENCE, both ERROR paths and a schema 0 history all have fixtures."""
    assert sorted(EXPECTED_OUTCOME) == NAMES
    for name in NAMES:
        assert (GOLDEN / f"{name}.expected.json").is_file()


@pytest.mark.parametrize("name", NAMES)
def test_history_folds_to_the_byte_identical_expected_record(name: str) -> None:
    """Folding the stored lines gives exactly the checked-in expected record bytes."""
    expected = (GOLDEN / f"{name}.expected.json").read_bytes()
    assert _generator().render_state(_lines(name)) == expected


@pytest.mark.parametrize("name", NAMES)
def test_expected_record_states_the_intended_outcome(name: str) -> None:
    """Each expected record has the status, evidence and error code its history is about."""
    record = msgspec.json.decode((GOLDEN / f"{name}.expected.json").read_bytes())
    status, evidence, error_code = EXPECTED_OUTCOME[name]
    assert (record["status"], record["evidence_status"], record["error_code"]) == (
        status,
        evidence,
        error_code,
    )
    assert record["version"] == len(_lines(name))
    assert record["last_hash"] == event_hash(_lines(name)[-1])


@pytest.mark.parametrize("name", NAMES)
def test_history_chain_links_the_stored_bytes(name: str) -> None:
    """Each line's prev_hash is the hash of the line before (genesis for the first)."""
    previous = GENESIS_HASH
    for line in _lines(name):
        assert msgspec.json.decode(line)["prev_hash"] == previous
        previous = event_hash(line)


@pytest.mark.parametrize("name", NAMES)
def test_current_schema_lines_reencode_to_the_same_bytes(name: str) -> None:
    """A current-schema event re-encodes byte for byte: an event shape change fails here."""
    for line in _lines(name):
        if msgspec.json.decode(line)["schema"] == SCHEMA_VERSION:
            assert encode_event(decode_event(line)) == line


def test_legacy_history_really_holds_a_schema0_event() -> None:
    """The legacy fixture stores a schema 0 Failed with ``code`` and no ``error_code``."""
    legacy = msgspec.json.decode(_lines("legacy-schema0")[-1])
    assert legacy["schema"] == 0
    assert "code" in legacy and "error_code" not in legacy


def test_generator_reproduces_the_checked_in_histories() -> None:
    """The generator script and the checked-in lines agree (fixtures are not hand-edited)."""
    for name, lines in _generator().histories().items():
        assert lines == _lines(name)


@pytest.mark.parametrize("name", NAMES)
def test_json_lines_keep_their_shape_in_schema_2(name: str) -> None:
    """Schema 2 changed the encoding only: a schema 1 line re-encodes as JSON byte for byte."""
    for line in _lines(name):
        if msgspec.json.decode(line)["schema"] == 1:
            event = msgspec.structs.replace(decode_event(line), schema=1)
            assert msgspec.json.encode(event) == line


def test_every_compact_history_is_checked_in() -> None:
    """Each lifecycle also has a schema 2 history, and one stream spans the upgrade."""
    assert sorted(COMPACT_OUTCOME) == COMPACT_NAMES
    for name in COMPACT_NAMES:
        assert (GOLDEN / f"{name}.compact.expected.json").is_file()
    mixed = [is_compact(line) for line in _compact_lines("upgrade")]
    assert mixed == [False, True, True]


@pytest.mark.parametrize("name", COMPACT_NAMES)
def test_compact_history_folds_to_the_byte_identical_expected_record(name: str) -> None:
    """Folding the stored compact lines gives exactly the checked-in expected record bytes."""
    expected = (GOLDEN / f"{name}.compact.expected.json").read_bytes()
    assert _generator().render_state(_compact_lines(name)) == expected


@pytest.mark.parametrize("name", COMPACT_NAMES)
def test_compact_expected_record_states_the_intended_outcome(name: str) -> None:
    """Each compact expected record has its status, evidence, error code and last hash."""
    record = msgspec.json.decode((GOLDEN / f"{name}.compact.expected.json").read_bytes())
    status, evidence, error_code = COMPACT_OUTCOME[name]
    assert (record["status"], record["evidence_status"], record["error_code"]) == (
        status,
        evidence,
        error_code,
    )
    assert record["version"] == len(_compact_lines(name))
    assert record["last_hash"] == event_hash(_compact_lines(name)[-1])


@pytest.mark.parametrize("name", sorted(set(COMPACT_NAMES) & set(NAMES)))
def test_the_encoding_changes_nothing_but_the_chain_hashes(name: str) -> None:
    """A lifecycle stored compactly folds to the JSON history's record but for last_hash."""
    as_json = msgspec.json.decode((GOLDEN / f"{name}.expected.json").read_bytes())
    compact = msgspec.json.decode((GOLDEN / f"{name}.compact.expected.json").read_bytes())
    assert as_json.pop("last_hash") != compact.pop("last_hash")
    assert as_json == compact


@pytest.mark.parametrize("name", COMPACT_NAMES)
def test_compact_history_chain_links_the_stored_bytes(name: str) -> None:
    """Each compact line names the hash of the line before (genesis for the first)."""
    previous = GENESIS_HASH
    for line in _compact_lines(name):
        assert stored_document(line)["prev_hash"] == previous
        previous = event_hash(line)


@pytest.mark.parametrize("name", COMPACT_NAMES)
def test_compact_lines_reencode_to_the_same_bytes(name: str) -> None:
    """A current-schema event re-encodes byte for byte: an encoding change fails here."""
    for line in _compact_lines(name):
        if is_compact(line):
            assert stored_document(line)["schema"] == SCHEMA_VERSION
            assert encode_event(decode_event(line)) == line


def test_generator_reproduces_the_checked_in_compact_histories() -> None:
    """The generator script and the checked-in compact lines agree."""
    for name, lines in _generator().compact_histories().items():
        assert lines == _compact_lines(name)


@pytest.mark.parametrize("name", ["error-detail", "error-detail-projecting"])
def test_a_kept_failure_detail_ends_the_failed_event(name: str) -> None:
    """Its digest and size are the Failed array's last items, and the fold records both."""
    detail = _generator().DETAIL
    failed = msgspec.msgpack.decode(_compact_lines(name)[-1])
    assert failed[-2:] == [hashlib.sha256(detail).digest(), len(detail)]
    record = msgspec.json.decode((GOLDEN / f"{name}.compact.expected.json").read_bytes())
    assert record["failure_detail_sha256"] == hashlib.sha256(detail).hexdigest()
    assert record["failure_detail_bytes"] == len(detail)


@pytest.mark.parametrize("name", ["error-executing", "error-projecting"])
def test_a_failed_event_without_detail_keeps_its_first_shape(name: str) -> None:
    """No digest, no size: the array ends with rejected_bytes, as before the detail existed."""
    failed = msgspec.msgpack.decode(_compact_lines(name)[-1])
    assert len(failed) == 2 + COMPACT_LAYOUT["Failed"].index("rejected_bytes") + 1
    record = msgspec.json.decode((GOLDEN / f"{name}.compact.expected.json").read_bytes())
    assert "failure_detail_sha256" not in record
    assert decode_event(_compact_lines(name)[-1]).failure_detail_sha256 is msgspec.UNSET  # type: ignore[union-attr]
