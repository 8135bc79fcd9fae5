"""The lifecycle is defined once: the table, the Lua tables and the diagram come from it."""

from __future__ import annotations

import re

from machine.codes import EvidenceStatus, Stage, Status
from machine.events import EVENT_TYPES
from machine.lifecycle import (
    EVIDENCE_ALLOWED,
    MACHINE,
    STATUS_OF,
    TERMINAL,
    TRANSITIONS,
    lua_tables,
    mermaid,
    next_stage,
)

_DESIGN = {
    (Stage.NEW, "Preflighted"): Stage.EXECUTING,
    (Stage.EXECUTING, "ProjectingStarted"): Stage.PROJECTING,
    (Stage.PROJECTING, "Completed"): Stage.READY,
    (Stage.EXECUTING, "Failed"): Stage.ERROR,
    (Stage.PROJECTING, "Failed"): Stage.ERROR,
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
    """The lifecycle is the one in the design: five legal transitions, nothing more."""
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


def test_lua_tables_list_exactly_the_transitions() -> None:
    """The generated Lua TRANSITIONS table has one row per pair of TRANSITIONS, no more."""
    source = lua_tables()
    block = source.split("local TRANSITIONS = {", 1)[1].split("}", 1)[0]
    rows = re.findall(r'\["(\w+)\|(\w+)"\] = "(\w+)",', block)
    assert len(rows) == len(block.strip().splitlines())
    assert {(Stage(src), kind): Stage(dest) for src, kind, dest in rows} == TRANSITIONS
    assert len(rows) == len(TRANSITIONS)


def test_lua_tables_carry_status_and_evidence_rules() -> None:
    """STATUS_OF and EVIDENCE_ALLOWED reach Lua entry for entry."""
    source = lua_tables()
    status_block = source.split("local STATUS_OF = {", 1)[1].split("}", 1)[0]
    statuses = dict(re.findall(r'\["(\w+)"\] = "(\w+)",', status_block))
    assert statuses == {stage.value: status.value for stage, status in STATUS_OF.items()}
    evidence_block = source.split("local EVIDENCE_ALLOWED = {", 1)[1].split("}", 1)[0]
    allowed = set(re.findall(r'\["(\w+)\|(\w+)"\] = true,', evidence_block))
    expected = {(s.value, e.value) for s, evs in EVIDENCE_ALLOWED.items() for e in evs}
    assert allowed == expected


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
