"""What a governed call's journal says of its approval: the frozen policy, the approvals.

A governed call's ApprovalRequested freezes the policy it waits under: who requested it
(who may never approve it) and how many distinct operators must approve it. Each approval
is an event (ApprovalAdded, then Approved for the one that completes the count). The
decision doors and the dispatch permit judge a call by these events, never by the
mutable record: :func:`tally` reads them. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import msgspec
from msgspec import UNSET

from machine.events import ApprovalAdded, ApprovalRequested, Approved, Event

#: How many distinct operators may be asked to approve one call, at most.
MAX_APPROVALS_REQUIRED: Final = 10
#: The prefix of a run's own identity (see :func:`run_identity`).
RUN_IDENTITY_PREFIX: Final = "run:"


def run_identity(run_id: str) -> str:
    """The identity of a run itself: the requester of its calls when the harness names none.

    No operator may decide under it (an operator's name never starts with ``run:``).
    """
    return f"{RUN_IDENTITY_PREFIX}{run_id}"


class Tally(msgspec.Struct, frozen=True, kw_only=True):
    """A governed call's approval as its journal holds it.

    Attributes:
        requested_by: the identity that requested the call (None: a call recorded before
            requesters were kept).
        approvals_required: how many distinct operators must approve it.
        approvers: who approved it so far, in order.
        approved: whether the approvals are complete (the last one an Approved).

    """

    requested_by: str | None
    approvals_required: int
    approvers: tuple[str, ...]
    approved: bool

    def may_approve(self, by: str, run_id: str) -> bool:
        """Whether ``by`` may add an approval: not the requester, not the run, not again."""
        return by not in (self.requested_by, run_identity(run_id)) and by not in self.approvers


def tally(events: Iterable[Event]) -> Tally | None:
    """Read a governed call's approval from its events in order; None when it is not one."""
    opened: ApprovalRequested | None = None
    approvers: list[str] = []
    approved = False
    for event in events:
        if isinstance(event, ApprovalRequested):
            opened = event
        elif isinstance(event, ApprovalAdded | Approved):
            approvers.append(event.decided_by)
            approved = approved or isinstance(event, Approved)
    if opened is None:
        return None
    required = opened.approvals_required
    return Tally(
        requested_by=None if opened.requested_by is UNSET else opened.requested_by,
        approvals_required=1 if required is UNSET else required,
        approvers=tuple(approvers),
        approved=approved,
    )
