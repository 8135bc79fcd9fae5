"""The invocation lifecycle, defined once with ``transitions``.

Everything else is generated from :data:`MACHINE`: the transition table used by the pure
fold, the Lua functions pasted into the Redis scripts, and the Mermaid diagram in the docs.
"""

from __future__ import annotations

from typing import Any, Final

from transitions import Machine

from machine.codes import EvidenceStatus, Stage, Status
from machine.compact import STATUS_CODES, TYPE_CODES
from machine.events import LAPSED_EVENTS

_TRANSITIONS: Final[list[dict[str, Any]]] = [
    {"trigger": "Preflighted", "source": Stage.NEW.value, "dest": Stage.EXECUTING.value},
    # A governed call: recorded frozen, decided by an operator, dispatched once.
    {
        "trigger": "ApprovalRequested",
        "source": Stage.NEW.value,
        "dest": Stage.AWAITING_APPROVAL.value,
    },
    # One approval of several a tool's policy asks for: the call still waits.
    {
        "trigger": "ApprovalAdded",
        "source": Stage.AWAITING_APPROVAL.value,
        "dest": Stage.AWAITING_APPROVAL.value,
    },
    {"trigger": "Approved", "source": Stage.AWAITING_APPROVAL.value, "dest": Stage.APPROVED.value},
    {"trigger": "Denied", "source": Stage.AWAITING_APPROVAL.value, "dest": Stage.ERROR.value},
    {
        "trigger": "ApprovalExpired",
        "source": [Stage.AWAITING_APPROVAL.value, Stage.APPROVED.value],
        "dest": Stage.ERROR.value,
    },
    {"trigger": "Dispatched", "source": Stage.APPROVED.value, "dest": Stage.EXECUTING.value},
    {
        "trigger": "ProjectingStarted",
        "source": Stage.EXECUTING.value,
        "dest": Stage.PROJECTING.value,
    },
    {"trigger": "Completed", "source": Stage.PROJECTING.value, "dest": Stage.READY.value},
    # A call in flight whose process died (its lease lapsed): an ungoverned one taken over
    # by a retry runs again; an attempted one found to have run has its outcome taken on;
    # a settlement ends either.
    {
        "trigger": "TakenOver",
        "source": [Stage.EXECUTING.value, Stage.PROJECTING.value],
        "dest": Stage.EXECUTING.value,
    },
    {
        "trigger": "Reconciled",
        "source": [Stage.EXECUTING.value, Stage.PROJECTING.value],
        "dest": Stage.EXECUTING.value,
    },
    {
        "trigger": "Settled",
        "source": [Stage.EXECUTING.value, Stage.PROJECTING.value],
        "dest": Stage.ERROR.value,
    },
    # A governed call fails before its dispatch when the permit is refused for good: its
    # record disagrees with its journal, or its run lost the authority to run it.
    {
        "trigger": "Failed",
        "source": [
            Stage.AWAITING_APPROVAL.value,
            Stage.APPROVED.value,
            Stage.EXECUTING.value,
            Stage.PROJECTING.value,
        ],
        "dest": Stage.ERROR.value,
    },
]

#: The one definition of the lifecycle. Only its structure is used; no model is driven.
MACHINE: Final = Machine(
    model=None,
    states=[stage.value for stage in Stage],
    transitions=_TRANSITIONS,
    initial=Stage.NEW.value,
    auto_transitions=False,
    send_event=False,
)


def _table(machine: Machine) -> dict[tuple[Stage, str], Stage]:
    table: dict[tuple[Stage, str], Stage] = {}
    for trigger, event in machine.events.items():
        for source, transitions in event.transitions.items():
            for transition in transitions:
                assert transition.dest is not None  # no internal transitions are defined
                table[(Stage(source), trigger)] = Stage(transition.dest)
    return table


#: (stage, event type) -> next stage. Pairs not listed are illegal.
TRANSITIONS: Final[dict[tuple[Stage, str], Stage]] = _table(MACHINE)

#: Public status shown for each machine stage.
STATUS_OF: Final[dict[Stage, Status]] = {
    Stage.AWAITING_APPROVAL: Status.PROJECTING,
    Stage.APPROVED: Status.PROJECTING,
    Stage.EXECUTING: Status.PROJECTING,
    Stage.PROJECTING: Status.PROJECTING,
    Stage.READY: Status.READY,
    Stage.ERROR: Status.ERROR,
}

#: Evidence statuses a record may hold in each stage.
EVIDENCE_ALLOWED: Final[dict[Stage, frozenset[EvidenceStatus]]] = {
    Stage.AWAITING_APPROVAL: frozenset({EvidenceStatus.PENDING}),
    Stage.APPROVED: frozenset({EvidenceStatus.PENDING}),
    Stage.EXECUTING: frozenset({EvidenceStatus.PENDING}),
    Stage.PROJECTING: frozenset({EvidenceStatus.PENDING}),
    Stage.READY: frozenset({EvidenceStatus.EVIDENCE_FOUND, EvidenceStatus.NO_EVIDENCE}),
    Stage.ERROR: frozenset({EvidenceStatus.ERROR}),
}

TERMINAL: Final = frozenset({Stage.READY, Stage.ERROR})


def next_stage(stage: Stage, event_type: str) -> Stage | None:
    """Return the stage after ``event_type`` in ``stage``, or None when it is illegal."""
    return TRANSITIONS.get((stage, event_type))


def lua_lifecycle() -> str:
    """Render the transition, status, evidence and feed-code rules as Lua functions.

    Functions, not tables: a script's body runs anew on every call, so a Lua table would
    be rebuilt entry by entry each time, while a chain of comparisons between interned
    strings costs a few instructions. Each rule is one line, ``if ... then return ...
    end``, in the order of the Python tables; a pair no line names answers ``nil`` (an
    illegal transition, an evidence status the stage may not hold).

    Feed entries carry an event type and a status as their permanent codes
    (:data:`machine.compact.TYPE_CODES`, :data:`machine.compact.STATUS_CODES`): one byte
    each in the feed's listpack instead of the names, which keeps more entries per node.
    The codes are Lua strings: they only go to Redis, and a Lua number sent to Redis is
    formatted as a float on every call. ``taken_from_a_lapsed_holder`` names the event
    types only ``lapsed.lua`` writes (:data:`machine.events.LAPSED_EVENTS`).
    """
    transitions = [
        f'  if stage == "{src.value}" and event_type == "{trigger}" then return "{dest.value}" end'
        for (src, trigger), dest in sorted(TRANSITIONS.items())
    ]
    statuses = [
        f'  if stage == "{stage.value}" then return "{status.value}" end'
        for stage, status in STATUS_OF.items()
    ]
    evidence = [
        f'  if stage == "{stage.value}" and evidence == "{ev.value}" then return true end'
        for stage, allowed in EVIDENCE_ALLOWED.items()
        for ev in sorted(allowed)
    ]
    status_codes = [
        f'  if stage == "{stage.value}" then return "{STATUS_CODES[status]}" end'
        for stage, status in STATUS_OF.items()
    ]
    type_codes = [
        f'  if event_type == "{kind}" then return "{code}" end' for kind, code in TYPE_CODES.items()
    ]
    lapsed = [f'  if event_type == "{kind}" then return true end' for kind in sorted(LAPSED_EVENTS)]
    return "\n".join(
        [
            "local function next_stage(stage, event_type)",
            *transitions,
            "end",
            "local function status_of(stage)",
            *statuses,
            "end",
            "local function evidence_allowed(stage, evidence)",
            *evidence,
            "end",
            "local function feed_status_code(stage)",
            *status_codes,
            "end",
            "local function feed_type_code(event_type)",
            *type_codes,
            "end",
            "local function taken_from_a_lapsed_holder(event_type)",
            *lapsed,
            "end",
        ]
    )


def lua_first_event() -> str:
    """Render what the creating event leads to as Lua constants, for the creating script.

    The stage after ``Preflighted`` from NEW, its public status, and the feed codes of
    that event type and that status: the transition nearly every creation makes, so the
    script needs no lookup for it (a governed call's ``ApprovalRequested`` looks its
    stage up in the table).
    """
    trigger = "Preflighted"
    dest = TRANSITIONS[(Stage.NEW, trigger)]
    status = STATUS_OF[dest]
    return "\n".join(
        [
            f'local FIRST_TYPE = "{trigger}"',
            f'local FIRST_STAGE = "{dest.value}"',
            f'local FIRST_STATUS = "{status.value}"',
            f'local FIRST_TYPE_CODE = "{TYPE_CODES[trigger]}"',
            f'local FIRST_STATUS_CODE = "{STATUS_CODES[status]}"',
        ]
    )


def mermaid() -> str:
    """Render the lifecycle as a Mermaid state diagram (checked into the docs)."""
    lines = ["stateDiagram-v2", f"    [*] --> {Stage.NEW.value}"]
    for (src, trigger), dest in sorted(TRANSITIONS.items()):
        lines.append(f"    {src.value} --> {dest.value}: {trigger}")
    lines += [f"    {stage.value} --> [*]" for stage in sorted(TERMINAL)]
    return "\n".join(lines) + "\n"
