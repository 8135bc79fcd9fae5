"""The pure fold: legal paths, illegal pairs, version gaps, broken chains, evidence rules."""

from __future__ import annotations

import pytest

from machine.codes import ErrorCode, EvidenceStatus, Stage, Status
from machine.events import EVENT_TYPES, GENESIS_HASH, encode_event, event_hash, payload_digest
from machine.fold import (
    ChainBroken,
    IllegalTransition,
    InvalidEvidence,
    InvocationState,
    VersionMismatch,
    fold,
    fold_all,
)
from machine.lifecycle import TRANSITIONS
from tests.helpers import RAW, REQUEST, RESULT, fold_path, make_event


def _path(*kinds: str) -> list[InvocationState]:
    states: list[InvocationState] = []
    state: InvocationState | None = None
    for kind in kinds:
        state = fold(state, make_event(kind, state))
        states.append(state)
    return states


def test_legal_path_to_ready() -> None:
    """Preflighted, ProjectingStarted, Completed lead to READY with the found evidence."""
    created, projecting, ready = _path("Preflighted", "ProjectingStarted", "Completed")
    assert (created.stage, created.status) == (Stage.EXECUTING, Status.PROJECTING)
    assert (projecting.stage, projecting.status) == (Stage.PROJECTING, Status.PROJECTING)
    assert created.evidence_status is projecting.evidence_status is EvidenceStatus.PENDING
    assert (ready.stage, ready.status) == (Stage.READY, Status.READY)
    assert ready.evidence_status is EvidenceStatus.EVIDENCE_FOUND
    assert ready.version == 3
    assert ready.request_sha256 == payload_digest(REQUEST)
    assert (ready.raw_sha256, ready.raw_bytes) == (payload_digest(RAW), len(RAW))
    assert (ready.result_sha256, ready.result_bytes) == (payload_digest(RESULT), len(RESULT))
    assert ready.scope == "docs"
    assert ready.error_code is None


def test_no_evidence_completes_ready() -> None:
    """NO_EVIDENCE is a valid way to complete: READY holding a negative observation."""
    state = fold_path(Stage.PROJECTING)
    ready = fold(state, make_event("Completed", state, evidence=EvidenceStatus.NO_EVIDENCE))
    assert ready.status is Status.READY
    assert ready.evidence_status is EvidenceStatus.NO_EVIDENCE


@pytest.mark.parametrize("before", [Stage.EXECUTING, Stage.PROJECTING])
def test_failed_leads_to_error_from_executing_and_projecting(before: Stage) -> None:
    """Failed from EXECUTING or PROJECTING gives ERROR, evidence ERROR and the code."""
    state = fold_path(before)
    assert state is not None
    failed = fold(state, make_event("Failed", state))
    assert (failed.stage, failed.status) == (Stage.ERROR, Status.ERROR)
    assert failed.evidence_status is EvidenceStatus.ERROR
    assert failed.error_code is ErrorCode.EXECUTION_FAILED
    assert failed.rejected_bytes == 7
    assert failed.version == state.version + 1
    assert failed.request_sha256 == state.request_sha256


def test_each_fold_records_hash_and_times() -> None:
    """last_hash is the hash of the applied event's encoding; times come from the events."""
    first = make_event("Preflighted", None, at_ms=1000)
    state = fold(None, first)
    assert state.last_hash == event_hash(encode_event(first))
    second = make_event("ProjectingStarted", state, at_ms=2000)
    state = fold(state, second, "f" * 64)
    assert state.last_hash == "f" * 64
    assert (state.created_at_ms, state.updated_at_ms) == (1000, 2000)


_STAGES = list(Stage)
_ILLEGAL = [
    (stage, kind) for stage in _STAGES for kind in EVENT_TYPES if (stage, kind) not in TRANSITIONS
]


@pytest.mark.parametrize(("stage", "kind"), _ILLEGAL, ids=[f"{s.value}-{k}" for s, k in _ILLEGAL])
def test_every_illegal_pair_raises_illegal_transition(stage: Stage, kind: str) -> None:
    """Each (stage, event) pair the table does not list raises IllegalTransition."""
    state = fold_path(stage)
    with pytest.raises(IllegalTransition):
        fold(state, make_event(kind, state))


def test_terminal_stages_refuse_everything() -> None:
    """READY and ERROR are terminal: no event type is legal after them."""
    for stage in (Stage.READY, Stage.ERROR):
        assert not [kind for kind in EVENT_TYPES if (stage, kind) in TRANSITIONS]


@pytest.mark.parametrize("offset", [-1, 0, 2, 5])
def test_version_gap_raises_version_mismatch(offset: int) -> None:
    """An event whose version is not the current version plus one is refused."""
    state = fold_path(Stage.EXECUTING)
    assert state is not None
    with pytest.raises(VersionMismatch):
        fold(state, make_event("ProjectingStarted", state, version=state.version + offset))


def test_first_event_must_be_version_one() -> None:
    """A Preflighted that is not version 1 is refused as a version mismatch."""
    with pytest.raises(VersionMismatch):
        fold(None, make_event("Preflighted", None, version=2))


def test_wrong_prev_hash_raises_chain_broken() -> None:
    """An event that does not name the previous event's hash breaks the chain."""
    state = fold_path(Stage.EXECUTING)
    with pytest.raises(ChainBroken):
        fold(state, make_event("ProjectingStarted", state, prev_hash="a" * 64))
    with pytest.raises(ChainBroken):
        fold(None, make_event("Preflighted", None, prev_hash="a" * 64))


def test_first_event_follows_genesis() -> None:
    """The first event of an invocation names the genesis hash as its predecessor."""
    assert make_event("Preflighted", None).prev_hash == GENESIS_HASH
    assert fold(None, make_event("Preflighted", None)).version == 1


@pytest.mark.parametrize("evidence", [EvidenceStatus.PENDING, EvidenceStatus.ERROR])
def test_completed_with_pending_or_error_evidence_is_invalid(evidence: EvidenceStatus) -> None:
    """READY can hold only EVIDENCE_FOUND or NO_EVIDENCE; PENDING and ERROR are refused."""
    state = fold_path(Stage.PROJECTING)
    with pytest.raises(InvalidEvidence):
        fold(state, make_event("Completed", state, evidence=evidence))


def test_version_is_checked_before_the_transition() -> None:
    """A stale event on a finished invocation is a version conflict, as Redis reports it."""
    state = fold_path(Stage.READY)
    assert state is not None
    with pytest.raises(VersionMismatch):
        fold(state, make_event("Failed", state, version=state.version))


def test_fold_all_replays_pairs_and_none_for_nothing() -> None:
    """fold_all folds (event, hash) pairs in order and gives None for no events."""
    assert fold_all([]) is None
    state: InvocationState | None = None
    pairs = []
    for kind in ("Preflighted", "ProjectingStarted", "Completed"):
        event = make_event(kind, state)
        hash_ = event_hash(encode_event(event))
        pairs.append((event, hash_))
        state = fold(state, event, hash_)
    assert fold_all(pairs) == state


def test_fold_does_not_mutate_its_input() -> None:
    """fold returns a new state and leaves the previous one as it was."""
    state = fold_path(Stage.EXECUTING)
    assert state is not None
    before = (state.stage, state.version, state.last_hash)
    fold(state, make_event("ProjectingStarted", state))
    assert (state.stage, state.version, state.last_hash) == before
