"""A call whose process died: the fold takes it over (ungoverned only), takes on its
outcome or ends it with a settlement, and every door names where a call stands (its
phase) from its record and its lease."""

from __future__ import annotations

import pytest

from machine.codes import SAFE_MESSAGES, SETTLEMENT_CODES, ErrorCode, Stage, Status
from machine.fold import IllegalTransition, fold
from machine.phases import DEFAULT_LEASE_MS, Phase, lease_lapsed, phase_of
from tests.helpers import EVIDENCE, fold_path, make_event

NOW = 1_700_000_100_000


@pytest.mark.parametrize("stage", [Stage.EXECUTING, Stage.PROJECTING])
def test_an_ungoverned_call_in_flight_is_taken_over_and_runs_again(stage: Stage) -> None:
    """TakenOver leads back to EXECUTING, keeping the one record, its attempt counted."""
    state = fold_path(stage)
    taken = fold(state, make_event("TakenOver", state))
    assert (taken.stage, taken.status, taken.attempt) == (Stage.EXECUTING, Status.PROJECTING, 2)
    assert taken.version == (state.version if state else 0) + 1


def test_a_governed_call_is_never_taken_over() -> None:
    """Nothing dispatches a governed call again by itself: TakenOver is refused."""
    approved = fold_path(Stage.APPROVED)
    dispatched = fold(approved, make_event("Dispatched", approved))
    with pytest.raises(IllegalTransition):
        fold(dispatched, make_event("TakenOver", dispatched))


def test_a_settlement_ends_the_call_with_its_code_and_evidence_digest() -> None:
    """Settled ends ERROR with the code it names, who settled it and the evidence digest."""
    state = fold_path(Stage.EXECUTING)
    settled = fold(state, make_event("Settled", state))
    assert (settled.stage, settled.error_code) == (
        Stage.ERROR,
        ErrorCode.RECONCILED_NOT_EXECUTED,
    )
    assert settled.settled_by == "ops@example"
    assert settled.settlement_evidence_bytes == len(EVIDENCE)


def test_a_reconciled_call_goes_on_to_record_its_raw_response() -> None:
    """Reconciled leads to EXECUTING, whence ProjectingStarted records the raw response."""
    state = fold_path(Stage.PROJECTING)
    again = fold(state, make_event("Reconciled", state))
    assert again.stage is Stage.EXECUTING and again.settled_by == "ops@example"
    projecting = fold(again, make_event("ProjectingStarted", again))
    assert fold(projecting, make_event("Completed", projecting)).stage is Stage.READY


@pytest.mark.parametrize("kind", ["TakenOver", "Reconciled", "Settled"])
@pytest.mark.parametrize(
    "stage", [Stage.AWAITING_APPROVAL, Stage.APPROVED, Stage.READY, Stage.ERROR]
)
def test_only_a_call_in_flight_is_taken_on(kind: str, stage: Stage) -> None:
    """A call that waits, or has ended, is never taken over or settled."""
    state = fold_path(stage)
    with pytest.raises(IllegalTransition):
        fold(state, make_event(kind, state))


def test_settlement_codes_have_fixed_messages() -> None:
    """Each code a settlement ends a call with has its own agent-safe message."""
    assert set(SAFE_MESSAGES) >= SETTLEMENT_CODES
    assert "not run again" in SAFE_MESSAGES[ErrorCode.RECONCILED_NOT_EXECUTED]


def test_a_lease_lapses_at_its_end_and_a_legacy_record_after_the_default() -> None:
    """A lease is held until its end (and a grace after it); without one, the default."""
    assert not lease_lapsed(NOW + 1, None, NOW)
    assert lease_lapsed(NOW, None, NOW)
    assert not lease_lapsed(NOW - 10, None, NOW, grace_ms=20)
    assert not lease_lapsed(None, NOW - DEFAULT_LEASE_MS + 1, NOW)
    assert lease_lapsed(None, NOW - DEFAULT_LEASE_MS, NOW)
    assert not lease_lapsed(None, None, NOW)


@pytest.mark.parametrize(
    ("stage", "governed", "settled", "lease", "phase"),
    [
        (Stage.AWAITING_APPROVAL, True, False, None, Phase.AWAITING_APPROVAL),
        (Stage.APPROVED, True, False, None, Phase.APPROVED),
        (Stage.EXECUTING, True, False, NOW + 5, Phase.DISPATCHING),
        (Stage.EXECUTING, True, False, NOW - 5, Phase.ATTEMPTED),
        (Stage.PROJECTING, False, False, NOW + 5, Phase.DISPATCHING),
        (Stage.PROJECTING, False, False, NOW - 5, Phase.ABANDONED),
        (Stage.EXECUTING, True, True, NOW + 5, Phase.DISPATCHING),
        (Stage.READY, False, False, None, Phase.READY),
        (Stage.ERROR, True, False, None, Phase.ERROR),
        (Stage.READY, True, True, None, Phase.RECONCILED),
        (Stage.ERROR, False, True, None, Phase.RECONCILED),
    ],
)
def test_the_phase_names_where_a_call_stands(
    stage: Stage, governed: bool, settled: bool, lease: int | None, phase: Phase
) -> None:
    """Waiting, approved, running, left by a dead process, ended or ended by a settlement."""
    shown = phase_of(
        stage,
        governed=governed,
        settled=settled,
        lease_until_ms=lease,
        updated_at_ms=NOW - 1,
        now_ms=NOW,
    )
    assert shown is phase
