"""Where a call stands, as every door shows it: the public status refined by who holds it.

The public status of a record is PROJECTING, READY or ERROR. An operator needs more: a
governed call waiting for a decision, approved and not dispatched yet, running under a
live process, or left in flight by a process that died (its *lease* lapsed: nobody runs
it any more). :func:`phase_of` names that from a record's lifecycle fields and the time
it is read; replay, ``canon runs``, ``status``, ``approvals``, the console, the demo and
every ``--json`` show it beside the status. Pure: no I/O.

A call in flight holds a lease (``lease_until_ms``, the server's clock) that its process
renews while the tool runs; once it has passed, the call is *attempted* (a governed call:
its tool may have run, a reconcile or an operator settles it) or *abandoned* (an
ungoverned call: a retry of its id takes it over, else the sweep ends it ABANDONED).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from machine.codes import Stage

#: How long a call's lease lasts from its last renewal, unless the store says otherwise.
DEFAULT_LEASE_MS: Final = 30_000
#: The most events one call's journal holds. A call is taken over (or taken on by a
#: reconciler) only while its journal leaves room for the raw response and an outcome
#: after it; past that, only a settlement ends it. So a journal stays short enough for a
#: receipt to read whole in one bounded read.
MAX_JOURNAL_EVENTS: Final = 32
#: The last version a TakenOver or a Reconciled may have (room for three more events).
LAST_TAKEN_VERSION: Final = MAX_JOURNAL_EVENTS - 3


class Phase(StrEnum):
    """The finer stage shown beside a record's public status."""

    #: A governed call waiting for operators' decisions (not run).
    AWAITING_APPROVAL = "awaiting_approval"
    #: Approved, not dispatched yet: it runs once when its harness resumes it.
    APPROVED = "approved"
    #: In flight under a live process (its lease is renewed while the tool runs).
    DISPATCHING = "dispatching"
    #: A governed call dispatched by a process that died: it may have run; a reconcile
    #: or an operator settles it, nothing dispatches it again by itself.
    ATTEMPTED = "attempted"
    #: An ungoverned call left by a process that died: a retry of its id takes it over,
    #: else the sweep ends it ABANDONED.
    ABANDONED = "abandoned"
    READY = "ready"
    ERROR = "error"
    #: Ended by a settlement after its process died (a reconcile hook, an operator or the
    #: sweep): READY or ERROR, its record says who settled it and how.
    RECONCILED = "reconciled"


#: The phases of a call no process is running and nothing ended yet.
LEFT_IN_FLIGHT: Final = frozenset({Phase.ATTEMPTED, Phase.ABANDONED})


def lease_lapsed(
    lease_until_ms: int | None, updated_at_ms: int | None, now_ms: int, grace_ms: int = 0
) -> bool:
    """Whether a call in flight is past its lease (and ``grace_ms`` more) at ``now_ms``.

    A record written before calls held leases has none: its lease is taken to end
    :data:`DEFAULT_LEASE_MS` after its last event.
    """
    if lease_until_ms is None:
        if updated_at_ms is None:
            return False
        lease_until_ms = updated_at_ms + DEFAULT_LEASE_MS
    return now_ms >= lease_until_ms + grace_ms


def phase_of(
    stage: Stage,
    *,
    governed: bool,
    settled: bool,
    lease_until_ms: int | None,
    updated_at_ms: int | None,
    now_ms: int,
) -> Phase:
    """The phase of a record in ``stage`` read at ``now_ms``.

    Args:
        stage: the record's lifecycle stage.
        governed: the call is a governed one (its record has an approval id).
        settled: a settlement (Reconciled or Settled) is in its journal.
        lease_until_ms: when its holder's lease ends (None: a record without one).
        updated_at_ms: when its last event was written.
        now_ms: when it is read (a reader's clock against the server's lease: shown, never
            acted upon; the scripts judge a lease by the server's clock).

    """
    if stage is Stage.AWAITING_APPROVAL:
        return Phase.AWAITING_APPROVAL
    if stage is Stage.APPROVED:
        return Phase.APPROVED
    if stage in (Stage.READY, Stage.ERROR):
        if settled:
            return Phase.RECONCILED
        return Phase.READY if stage is Stage.READY else Phase.ERROR
    if stage is Stage.NEW or not lease_lapsed(lease_until_ms, updated_at_ms, now_ms):
        return Phase.DISPATCHING
    return Phase.ATTEMPTED if governed else Phase.ABANDONED
