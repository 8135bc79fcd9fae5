"""Taking a governed call's dispatch permit in a test, as a resumer would, without a tool.

:func:`take_permit` asks the permit script (``Writer.dispatch``) for the permit of the call
``state`` describes, with the tool and the request digest its record holds, and says what
came of it: the head of the one caller that got it, or where the call stands and why not.
"""

from __future__ import annotations

from dataclasses import dataclass

from eventstore.store import Store
from eventstore.wire.scripts import PermitRefused
from eventstore.writer import Head, head_of
from machine.codes import ErrorCode, Stage
from machine.fold import InvocationState

_HOLDS: frozenset[str] = frozenset({ErrorCode.RUN_PAUSED.value, ErrorCode.EXECUTION_PAUSED.value})


@dataclass(frozen=True)
class PermitOutcome:
    """A permit asked for: ``head`` for the winner; else the stage and the code."""

    head: Head | None
    stage: Stage
    code: ErrorCode | None = None
    refusal: PermitRefused | None = None


async def take_permit(store: Store, state: InvocationState, expires_at_ms: int) -> PermitOutcome:
    """Ask for the permit of the approved call ``state`` describes (its own tool and digest).

    An expired approval is recorded as such, as a resumer does.
    """
    if state.stage is not Stage.APPROVED:
        return PermitOutcome(None, state.stage, state.error_code)
    try:
        permit = await store.writer.dispatch(
            head_of(state, expires_at_ms), state.tool, state.request_sha256
        )
    except PermitRefused as refused:
        if refused.code == ErrorCode.APPROVAL_EXPIRED.value:
            await store.decisions.expire(state.run_id, state.tool_call_id)
            return PermitOutcome(None, Stage.ERROR, ErrorCode.APPROVAL_EXPIRED, refused)
        if refused.code in _HOLDS:
            return PermitOutcome(None, Stage.APPROVED, ErrorCode(refused.code), refused)
        record = await store.reader.get(state.run_id, state.tool_call_id)
        if record is None:
            return PermitOutcome(None, Stage.ERROR, ErrorCode.RECORD_EXPIRED, refused)
        return PermitOutcome(None, record.state.stage, record.state.error_code, refused)
    return PermitOutcome(permit.head, Stage.EXECUTING)
