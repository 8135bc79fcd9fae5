"""The invocation lifecycle, defined once with ``transitions``.

Everything else is generated from :data:`MACHINE`: the transition table used by the pure
fold, the Lua table loaded into the Redis scripts, and the Mermaid diagram in the docs.
"""

from __future__ import annotations

from typing import Any, Final

from transitions import Machine

from machine.codes import EvidenceStatus, Stage, Status
from machine.compact import STATUS_CODES, TYPE_CODES

_TRANSITIONS: Final[list[dict[str, Any]]] = [
    {"trigger": "Preflighted", "source": Stage.NEW.value, "dest": Stage.EXECUTING.value},
    {
        "trigger": "ProjectingStarted",
        "source": Stage.EXECUTING.value,
        "dest": Stage.PROJECTING.value,
    },
    {"trigger": "Completed", "source": Stage.PROJECTING.value, "dest": Stage.READY.value},
    {
        "trigger": "Failed",
        "source": [Stage.EXECUTING.value, Stage.PROJECTING.value],
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
    Stage.EXECUTING: Status.PROJECTING,
    Stage.PROJECTING: Status.PROJECTING,
    Stage.READY: Status.READY,
    Stage.ERROR: Status.ERROR,
}

#: Evidence statuses a record may hold in each stage.
EVIDENCE_ALLOWED: Final[dict[Stage, frozenset[EvidenceStatus]]] = {
    Stage.EXECUTING: frozenset({EvidenceStatus.PENDING}),
    Stage.PROJECTING: frozenset({EvidenceStatus.PENDING}),
    Stage.READY: frozenset({EvidenceStatus.EVIDENCE_FOUND, EvidenceStatus.NO_EVIDENCE}),
    Stage.ERROR: frozenset({EvidenceStatus.ERROR}),
}

TERMINAL: Final = frozenset({Stage.READY, Stage.ERROR})


def next_stage(stage: Stage, event_type: str) -> Stage | None:
    """Return the stage after ``event_type`` in ``stage``, or None when it is illegal."""
    return TRANSITIONS.get((stage, event_type))


def lua_tables() -> str:
    """Render the transition, status and evidence tables as Lua source for the scripts.

    Feed entries carry an event type and a status as their permanent codes
    (:data:`machine.compact.TYPE_CODES`, :data:`machine.compact.STATUS_CODES`): one byte
    each in the feed's listpack instead of the names, which keeps more entries per node.
    The codes are Lua strings: they only go to Redis, and a Lua number sent to Redis is
    formatted as a float on every call.
    """
    rows = [
        f'  ["{src.value}|{trigger}"] = "{dest.value}",'
        for (src, trigger), dest in sorted(TRANSITIONS.items())
    ]
    statuses = [f'  ["{stage.value}"] = "{status.value}",' for stage, status in STATUS_OF.items()]
    status_codes = [
        f'  ["{stage.value}"] = "{STATUS_CODES[status]}",' for stage, status in STATUS_OF.items()
    ]
    type_codes = [f'  ["{kind}"] = "{code}",' for kind, code in TYPE_CODES.items()]
    evidence = [
        f'  ["{stage.value}|{ev.value}"] = true,'
        for stage, allowed in EVIDENCE_ALLOWED.items()
        for ev in sorted(allowed)
    ]
    return "\n".join(
        [
            "local TRANSITIONS = {",
            *rows,
            "}",
            "local STATUS_OF = {",
            *statuses,
            "}",
            "local EVIDENCE_ALLOWED = {",
            *evidence,
            "}",
            "local FEED_STATUS_CODE = {",
            *status_codes,
            "}",
            "local FEED_TYPE_CODE = {",
            *type_codes,
            "}",
        ]
    )


def mermaid() -> str:
    """Render the lifecycle as a Mermaid state diagram (checked into the docs)."""
    lines = ["stateDiagram-v2", f"    [*] --> {Stage.NEW.value}"]
    for (src, trigger), dest in sorted(TRANSITIONS.items()):
        lines.append(f"    {src.value} --> {dest.value}: {trigger}")
    lines += [f"    {stage.value} --> [*]" for stage in sorted(TERMINAL)]
    return "\n".join(lines) + "\n"
