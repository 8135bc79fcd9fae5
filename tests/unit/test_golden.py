"""Golden event histories fold to byte-identical records, so no fold or shape change slips by."""

from __future__ import annotations

import importlib.util
import pathlib
from types import ModuleType

import msgspec
import pytest

from machine.events import GENESIS_HASH, SCHEMA_VERSION, decode_event, encode_event, event_hash

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


def _lines(name: str) -> list[bytes]:
    return (GOLDEN / f"{name}.jsonl").read_bytes().splitlines()


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
