"""``CallTrace``: one tool call's decisions so far, and the log lines that report them.

The boundary logs ids, never payloads: an id that is not safe to show is logged as None.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from eventstore.boundary.contracts import (
    AgentReply,
    RunContext,
    ToolEnvelope,
    ToolError,
    reply_status,
)
from eventstore.boundary.interrupts import INTERRUPTED_CODE
from eventstore.logs import get_logger
from eventstore.writer import Head
from machine.codes import ErrorCode
from machine.ids import invocation_id, is_run_id, is_tool_call_id
from machine.limits import LimitHit

log = get_logger("canon.boundary")


class CallTrace:
    """One call's decisions so far and the logger that reports them: ids, never payloads.

    Decisions are logged as they are taken: ``invocation_refused`` (INFO) when a call is
    turned away before any record exists (naming no invocation id: there is none),
    ``event_committed`` (DEBUG) for each lifecycle event written, and one
    ``invocation_finished`` per call, INFO unless a call that got past its refusals ended
    in ERROR (WARNING).
    """

    __slots__ = (
        "debug",
        "event_type",
        "ids",
        "invocation_id",
        "logger",
        "refused",
        "replayed",
        "task",
        "version",
    )

    def __init__(self, ctx: RunContext, envelope: ToolEnvelope, task: asyncio.Task[Any]) -> None:
        # The task that runs the call: its time limits cancel it (eventstore.wire.deadlines).
        self.task = task
        # One concrete logger per call: the lazy proxy would rebuild one per line.
        self.logger: Any = log.bind()
        is_enabled_for = getattr(self.logger, "is_enabled_for", None)
        # The benchmark logs at INFO with little margin: with DEBUG off, no per-event
        # line is even built.
        self.debug: bool = is_enabled_for is None or bool(is_enabled_for(logging.DEBUG))
        # Unsafe ids are never logged: they may carry anything the agent sent.
        run_id = ctx.run_id if is_run_id(ctx.run_id) else None
        tool_call_id = envelope.tool_call_id if is_tool_call_id(envelope.tool_call_id) else None
        self.invocation_id = (
            invocation_id(run_id, tool_call_id) if run_id and tool_call_id else None
        )
        # The ids every line of the call carries.
        self.ids = {
            "run_id": run_id,
            "tool_call_id": tool_call_id,
            "invocation_id": self.invocation_id,
        }
        self.version = 0
        self.event_type: str | None = None
        self.refused = False
        self.replayed = False

    def refuse(self, code: ErrorCode, stage: str, limit: LimitHit | None = None) -> ToolError:
        """Log a refusal at ``stage`` (nothing was written, so no version) and return it.

        A refused call has no invocation: from here on its lines name the run, the call
        and the code, and no invocation id (a new dict: a span started with the old one
        keeps it).
        """
        self.refused = True
        self.ids = {**self.ids, "invocation_id": None}
        self.logger.info(
            "invocation_refused",
            **self.ids,
            stage=stage,
            error_code=code.value,
        )
        return self.error(code, recorded=False, limit=limit)

    def error(
        self,
        code: ErrorCode,
        *,
        recorded: bool,
        limit: LimitHit | None = None,
        message: str | None = None,
    ) -> ToolError:
        """The reply for ``code``; ``recorded``: this call's record holds the outcome.

        ``limit``: the size limit that was hit, which the message then names.
        ``message``: the tool's own error text its record keeps as the agent result,
        shown instead of the code's fixed message (None: the fixed message).
        """
        return ToolError.of(
            code,
            tool_call_id=self.ids["tool_call_id"],
            invocation_id=self.invocation_id if recorded else None,
            limit=limit,
            message=message,
        )

    def interrupted(self, closed: Head | None, error_type: str | None) -> None:
        """Note how closing a call cut short went (see :mod:`eventstore.boundary.interrupts`)."""
        if closed is not None:
            self.commit("Failed", closed, INTERRUPTED_CODE)
        elif error_type is not None:  # the record stays PROJECTING
            self.logger.warning("interrupted_call_not_closed", **self.ids, error_type=error_type)

    def replay(self, reply: AgentReply) -> AgentReply:
        """Log that ``reply`` was answered from an earlier call's record and return it."""
        self.replayed = True
        self.logger.info(
            "invocation_replayed",
            **self.ids,
            status=reply_status(reply),
            error_code=reply.error_code.value if isinstance(reply, ToolError) else None,
        )
        return reply

    def commit(self, event_type: str, head: Head, code: ErrorCode | None = None) -> Head:
        """Note that ``event_type`` was written at ``head.version``; log it at DEBUG."""
        self.version, self.event_type = head.version, event_type
        if self.debug:
            self.logger.debug(
                "event_committed",
                **self.ids,
                event_type=event_type,
                version=head.version,
                error_code=code.value if code is not None else None,
            )
        return head

    def finish(self, reply: AgentReply, tool: str | None, started: float) -> None:
        """Log the call's outcome, its last lifecycle event and its duration."""
        failed = isinstance(reply, ToolError)
        # A refusal or a replayed outcome is no new failure: INFO.
        quiet = self.refused or self.replayed
        (self.logger.warning if failed and not quiet else self.logger.info)(
            "invocation_finished",
            **self.ids,
            tool=tool,
            status=reply_status(reply),
            error_code=reply.error_code.value if isinstance(reply, ToolError) else None,
            event_type=self.event_type,
            version=self.version,
            duration_ms=round((time.perf_counter() - started) * 1000, 3),
        )
