"""The lifecycle is defined once: the table, the Lua functions and the diagram come from it."""

from __future__ import annotations

import re

from machine.codes import EvidenceStatus, Stage, Status
from machine.compact import STATUS_CODES, TYPE_CODES
from machine.events import EVENT_TYPES
from machine.lifecycle import (
    EVIDENCE_ALLOWED,
    MACHINE,
    STATUS_OF,
    TERMINAL,
    TRANSITIONS,
    lua_first_event,
    lua_lifecycle,
    mermaid,
    next_stage,
)

_DESIGN = {
    (Stage.NEW, "Preflighted"): Stage.EXECUTING,
    (Stage.EXECUTING, "ProjectingStarted"): Stage.PROJECTING,
    (Stage.PROJECTING, "Completed"): Stage.READY,
    (Stage.EXECUTING, "Failed"): Stage.ERROR,
    (Stage.PROJECTING, "Failed"): Stage.ERROR,
    # A governed call.
    (Stage.NEW, "ApprovalRequested"): Stage.AWAITING_APPROVAL,
    # One approval of several: the call still waits.
    (Stage.AWAITING_APPROVAL, "ApprovalAdded"): Stage.AWAITING_APPROVAL,
    (Stage.AWAITING_APPROVAL, "Approved"): Stage.APPROVED,
    (Stage.AWAITING_APPROVAL, "Denied"): Stage.ERROR,
    (Stage.AWAITING_APPROVAL, "ApprovalExpired"): Stage.ERROR,
    (Stage.APPROVED, "ApprovalExpired"): Stage.ERROR,
    (Stage.APPROVED, "Dispatched"): Stage.EXECUTING,
    # Ended at its permit: the record disagreed with its journal, or the run's authority
    # went (before the dispatch, so nothing ran).
    (Stage.AWAITING_APPROVAL, "Failed"): Stage.ERROR,
    (Stage.APPROVED, "Failed"): Stage.ERROR,
    # A call in flight whose process died: taken over (ungoverned), its outcome taken on
    # (found to have run), or ended by a settlement.
    (Stage.EXECUTING, "TakenOver"): Stage.EXECUTING,
    (Stage.PROJECTING, "TakenOver"): Stage.EXECUTING,
    (Stage.EXECUTING, "Reconciled"): Stage.EXECUTING,
    (Stage.PROJECTING, "Reconciled"): Stage.EXECUTING,
    (Stage.EXECUTING, "Settled"): Stage.ERROR,
    (Stage.PROJECTING, "Settled"): Stage.ERROR,
}


def test_table_is_generated_from_the_machine() -> None:
    """TRANSITIONS holds exactly the (source, trigger) -> dest pairs of MACHINE."""
    pairs = {
        (Stage(source), trigger): Stage(transition.dest)
        for trigger, event in MACHINE.events.items()
        for source, transitions in event.transitions.items()
        for transition in transitions
    }
    assert pairs == TRANSITIONS


def test_table_matches_the_design_lifecycle() -> None:
    """The lifecycle is the one in the design: five legal transitions of every call, nine
    of a governed one and six of a call whose process died, nothing more; only Dispatched
    leads a governed call to EXECUTING the first time."""
    assert TRANSITIONS == _DESIGN
    assert {kind for _, kind in TRANSITIONS} == set(EVENT_TYPES)


def test_machine_has_no_auto_transitions() -> None:
    """No to_<state> shortcuts exist; only the event types are triggers."""
    assert set(MACHINE.events) == set(EVENT_TYPES)


def test_next_stage_is_none_for_illegal_pairs() -> None:
    """next_stage answers the table and None for every pair it does not list."""
    for stage in Stage:
        for kind in EVENT_TYPES:
            assert next_stage(stage, kind) == TRANSITIONS.get((stage, kind))
    assert next_stage(Stage.READY, "Failed") is None


def _lua_function(source: str, name: str) -> list[str]:
    """The body lines of ``local function name(...)`` in generated Lua source."""
    body = source.split(f"local function {name}(", 1)[1].split("\nend", 1)[0]
    return body.splitlines()[1:]


def test_lua_lifecycle_lists_exactly_the_transitions() -> None:
    """The generated Lua next_stage has one line per pair of TRANSITIONS, no more."""
    lines = _lua_function(lua_lifecycle(), "next_stage")
    rows = [
        re.fullmatch(
            r'  if stage == "(\w+)" and event_type == "(\w+)" then return "(\w+)" end', line
        )
        for line in lines
    ]
    assert all(rows)
    assert {(Stage(m[1]), m[2]): Stage(m[3]) for m in rows if m} == TRANSITIONS
    assert len(rows) == len(TRANSITIONS)


def test_lua_lifecycle_carries_status_evidence_and_feed_codes() -> None:
    """STATUS_OF, EVIDENCE_ALLOWED and the feed codes reach Lua entry for entry."""
    source = lua_lifecycle()
    status_lines = _lua_function(source, "status_of")
    statuses = dict(
        re.findall(r'if stage == "(\w+)" then return "(\w+)" end', "\n".join(status_lines))
    )
    assert len(statuses) == len(status_lines)
    assert statuses == {stage.value: status.value for stage, status in STATUS_OF.items()}
    evidence_lines = _lua_function(source, "evidence_allowed")
    pattern = r'if stage == "(\w+)" and evidence == "(\w+)" then return true end'
    allowed = set(re.findall(pattern, "\n".join(evidence_lines)))
    assert len(allowed) == len(evidence_lines)
    expected = {(s.value, e.value) for s, evs in EVIDENCE_ALLOWED.items() for e in evs}
    assert allowed == expected
    codes = dict(re.findall(r'if stage == "(\w+)" then return "(\d)" end', source))
    assert codes == {stage.value: str(STATUS_CODES[status]) for stage, status in STATUS_OF.items()}
    types = dict(re.findall(r'if event_type == "(\w+)" then return "(\d+)" end', source))
    assert types == {kind: str(code) for kind, code in TYPE_CODES.items()}


def test_lua_first_event_is_the_transition_of_preflighted_out_of_new() -> None:
    """The creating script's constants are the stage, status and codes Preflighted leads to."""
    constants = dict(re.findall(r'local (\w+) = "(\w+)"', lua_first_event()))
    assert constants == {
        "FIRST_TYPE": "Preflighted",
        "FIRST_STAGE": TRANSITIONS[(Stage.NEW, "Preflighted")].value,
        "FIRST_STATUS": Status.PROJECTING.value,
        "FIRST_TYPE_CODE": str(TYPE_CODES["Preflighted"]),
        "FIRST_STATUS_CODE": str(STATUS_CODES[Status.PROJECTING]),
    }


def test_public_status_and_evidence_rules() -> None:
    """Both running stages read PROJECTING; READY needs real evidence; ERROR forces ERROR."""
    assert STATUS_OF[Stage.EXECUTING] is STATUS_OF[Stage.PROJECTING] is Status.PROJECTING
    assert EVIDENCE_ALLOWED[Stage.READY] == {
        EvidenceStatus.EVIDENCE_FOUND,
        EvidenceStatus.NO_EVIDENCE,
    }
    assert EVIDENCE_ALLOWED[Stage.ERROR] == {EvidenceStatus.ERROR}
    assert {Stage.READY, Stage.ERROR} == TERMINAL


def test_mermaid_diagram_shows_every_transition() -> None:
    """The diagram has one arrow per transition and ends at the terminal stages."""
    diagram = mermaid()
    assert diagram.startswith("stateDiagram-v2\n")
    for (src, kind), dest in TRANSITIONS.items():
        assert f"    {src.value} --> {dest.value}: {kind}\n" in diagram
    assert "    READY --> [*]\n" in diagram
    assert "    ERROR --> [*]\n" in diagram
