"""Closing the record of a call cut short: the caller's cancellation, or the process exiting.

When ``invoke`` is cancelled, or a tool raises ``KeyboardInterrupt`` or ``SystemExit``,
the exception must go on (it is not the boundary's to swallow) but the record must not
stay PROJECTING. Before re-raising, the boundary writes ``Failed`` with
``CALLER_CANCELLED``, in a task of its own (so a second cancellation cannot cut the
write off; the boundary keeps a reference until it ends) and within the store timeout.
It is best-effort: an unreachable Redis, or a process killed outright, can still leave a
record PROJECTING.

The write that was in flight when the call was cut short may or may not have landed:

- the creation: the very same ``Preflighted`` event is sent again; it is answered as
  applied if the first one landed and creates the record if it did not, so the record
  that exists is always found and closed, and never one of another caller;
- a later event: ``Failed`` is written after the last acknowledged head; if that event
  landed meanwhile (``VERSION_CONFLICT``), the record's own version and hash are read and
  ``Failed`` follows them, unless the record is already READY or ERROR;
- a ``ProjectingStarted`` written ahead of its answer (the projector was running): its
  answer is read first, and ``Failed`` follows it if it landed, the head before it if not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

from eventstore.errors import CanonError, Refused
from eventstore.reader import Reader
from eventstore.writer import Head, Pending, Writer, head_of
from machine.codes import ErrorCode, Status
from machine.events import Preflighted

#: The code an interrupted call's record ends with.
INTERRUPTED_CODE: Final = ErrorCode.CALLER_CANCELLED
#: Refusals that mean another event of the call landed after the head we hold.
_MOVED_ON: Final = frozenset({"VERSION_CONFLICT", "CHAIN_BROKEN"})


def caller_cancelled(task: asyncio.Task[object]) -> bool:
    """Tell whether ``task`` has been asked to cancel (not a tool raising CancelledError)."""
    return task.cancelling() > 0


async def close_interrupted(
    writer: Writer,
    reader: Reader,
    *,
    head: Head | Pending | None,
    creation: tuple[Preflighted, bytes] | None = None,
) -> Head | None:
    """Write ``Failed`` (CALLER_CANCELLED) for a call that was cut short.

    Args:
        writer: the store's writer.
        reader: the store's reader, for a record that moved past ``head``.
        head: the last head the call was told about, or None if its creation was in flight,
            or the event written ahead of its answer (whose answer decides).
        creation: the call's ``Preflighted`` event and request, when ``head`` is None.

    Returns:
        The ``Failed`` event's head, or None when there was nothing of this call to close
        (never created, or already READY or ERROR).

    Raises:
        CanonError: the store refused or failed the write (the caller logs it).

    """
    if isinstance(head, Pending):
        head = await _answered(writer, head)
    if head is None:
        if creation is None:
            return None
        event, request = creation
        try:
            # Sent again only to find the record: a refusal now was answered (and put on
            # the run's refusal log) by the first send, if it landed.
            head = await writer.append(
                event,
                request,
                run_id=event.run_id,
                tool_call_id=event.tool_call_id,
                log_refusals="none",
            )
        except Refused:
            return None  # refused again (a duplicate, a budget...): nothing of ours exists
    try:
        return await writer.fail(head, INTERRUPTED_CODE)
    except Refused as refused:
        if refused.code not in _MOVED_ON:
            raise
    record = await reader.get(head.run_id, head.tool_call_id)
    if record is None or record.state.status is not Status.PROJECTING:
        return None
    return await writer.fail(head_of(record.state, record.expires_at_ms), INTERRUPTED_CODE)


async def _answered(writer: Writer, pending: Pending) -> Head:
    """The head after ``pending``'s event if it landed, else the head before it."""
    if pending.sent is not None:
        try:
            return await writer.answer(pending)
        except Refused:
            return pending.before
    return pending.committed or pending.before


def taken(pending: Pending) -> Pending:
    """A copy of ``pending`` that alone may read its answer (``pending`` no longer can)."""
    copy = Pending(pending.before, pending.head, pending.sent, pending.committed)
    pending.sent = None
    return copy


#: Told the Failed head of a closed call (None: nothing to close), or the error type
#: that kept it from being closed.
Report = Callable[[Head | None, str | None], None]


class Interruptions:
    """Closes interrupted calls of one boundary, each in a task of its own.

    Args:
        writer: the store's writer.
        reader: the store's reader.
        timeout_s: the longest a closing may take.
        outlived: told of each closing as it starts, so the store's close waits for one
            that outlives its caller (``Store.finish_before_closing``).

    """

    def __init__(
        self,
        writer: Writer,
        reader: Reader,
        timeout_s: float,
        outlived: Callable[[asyncio.Task[None]], None],
    ) -> None:
        self._writer = writer
        self._reader = reader
        self._timeout_s = timeout_s
        self._outlived = outlived
        # Closings still running after a second cancellation left them: referenced
        # until they end, or the event loop could drop them.
        self._running: set[asyncio.Task[None]] = set()

    async def close(
        self,
        head: Head | Pending | None,
        creation: tuple[Preflighted, bytes] | None,
        report: Report,
    ) -> None:
        """Close a call cut short (see :func:`close_interrupted`); never raises.

        A second cancellation of the caller ends the wait for the closing, never the
        closing itself.
        """
        if isinstance(head, Pending):
            head = taken(head)  # its answer is the closing's to read
        closing = asyncio.ensure_future(self._close(head, creation, report))
        self._running.add(closing)
        closing.add_done_callback(self._running.discard)
        self._outlived(closing)
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError:
            return  # cancelled again: the closing goes on; the caller re-raises its own

    async def settle(self, pending: Pending) -> None:
        """Read the answer of ``pending``'s event when nothing will follow it; never raises.

        For a call that ended, by a failure of the boundary's own, between writing the
        event and its outcome: the connection it holds goes back, whatever the answer.
        """
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._writer.answer(pending)
        except (CanonError, TimeoutError):
            return

    async def _close(
        self,
        head: Head | Pending | None,
        creation: tuple[Preflighted, bytes] | None,
        report: Report,
    ) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                closed = await close_interrupted(
                    self._writer, self._reader, head=head, creation=creation
                )
        except (CanonError, TimeoutError) as exc:
            report(None, type(exc).__name__)  # best-effort: the record stays PROJECTING
            return
        report(closed, None)
