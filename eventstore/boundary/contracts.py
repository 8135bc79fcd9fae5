"""The harness-facing types: run context, envelope, tool spec, projection and replies.

Executors, projectors, error texts, approval policies and reconcile hooks are plug-ins;
their contracts are the Protocols here. An executor, a projector or a reconcile hook
(:class:`Reconcile`) may be a plain or an async callable; an error text
(:class:`ErrorResult`) and an approval policy (:class:`ApprovalPolicy`) are plain ones.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from datetime import timedelta
from typing import Any, Final, Literal, Protocol

import msgspec

from machine.codes import SAFE_MESSAGES, ErrorCode, EvidenceStatus
from machine.errors import InvalidArgument
from machine.governance import RUN_IDENTITY_PREFIX
from machine.limits import LimitHit

#: Longest requester identity a run context may name (characters), as an approver's.
MAX_REQUESTER_CHARS: Final = 200


class RunContext(msgspec.Struct, frozen=True):
    """The harness's explicit knowledge of which run is executing, and for whom.

    Attributes:
        run_id: the run.
        requester: the identity on whose behalf the run calls its tools (a user the
            harness authenticated), frozen in each governed call it makes; that identity
            may never approve the call. None: the run's own identity (``run:<run id>``).

    """

    run_id: str
    requester: str | None = None

    def __post_init__(self) -> None:
        """Check the requester: printable text of 1 to 200 characters, never ``run:...``.

        Raises:
            InvalidArgument: it is not.

        """
        requester = self.requester
        if requester is not None and not (
            isinstance(requester, str)
            and requester.strip()
            and requester.isprintable()
            and len(requester) <= MAX_REQUESTER_CHARS
            and not requester.startswith(RUN_IDENTITY_PREFIX)
        ):
            raise InvalidArgument(
                f"requester must be printable text of 1 to {MAX_REQUESTER_CHARS} characters "
                f"not starting with {RUN_IDENTITY_PREFIX!r}"
            )


class ToolEnvelope(msgspec.Struct, frozen=True, kw_only=True):
    """One tool call as the agent framework emitted it.

    Attributes:
        run_id: the run the framework says the call belongs to.
        tool_call_id: the framework's own id, used exactly as given (never replaced).
        tool: the tool's name.
        arguments: the input, as a mapping or as JSON text of an object.

    """

    run_id: str
    tool_call_id: str
    tool: str
    arguments: Mapping[str, Any] | str | bytes


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """What an executor and a projector learn about the call they serve."""

    run_id: str
    tool_call_id: str
    invocation_id: str
    tool: str


class Projection(msgspec.Struct, frozen=True, kw_only=True):
    """A projector's answer: the bounded agent result and what it says about evidence.

    Attributes:
        result: any JSON value; it is all the agent will see.
        evidence_status: EVIDENCE_FOUND or NO_EVIDENCE (anything else makes the call ERROR).
        scope: what was searched, so a NO_EVIDENCE result stays a scoped observation.

    """

    result: Any
    evidence_status: EvidenceStatus | str
    scope: str = ""


class Executor(Protocol):
    """Runs the tool and returns its raw response (JSON value, ``str`` or ``bytes``)."""

    def __call__(self, arguments: dict[str, Any], call: ToolCall, /) -> Any | Awaitable[Any]:
        """Execute the tool."""


class Projector(Protocol):
    """Turns the raw response into a bounded :class:`Projection` for the agent."""

    def __call__(self, raw: Any, call: ToolCall, /) -> Projection | Awaitable[Projection]:
        """Project the raw response."""


class ErrorResult(Protocol):
    """Turns the exception a tool's executor raised into the text its agent is shown.

    A plain callable (``str`` will do). What it returns is scrubbed of secrets by the
    store's scrubber and must fit the agent result limit; a callable that raises, or
    returns anything but a non-empty ``str``, or a text over the limit, leaves the agent
    the code's fixed message.
    """

    def __call__(self, error: Exception, /) -> str:
        """Return the agent-facing text of ``error``."""


class ApprovalPolicy(Protocol):
    """Decides, per request, whether a call of a side-effecting tool waits for an operator.

    Called with the call's arguments (decoded from its canonical request) and ids, on
    the event loop, at least once per call (an adapter may ask it before the boundary
    does, as the OpenAI Agents SDK's ``needs_approval`` does): it should be quick, pure
    (the same answer for the same call) and must not do I/O. True: the call
    waits for an approval; False: it runs at once and its record says no approval was
    needed. A policy that raises is taken as True: a call is never run unapproved by
    accident.
    """

    def __call__(self, arguments: dict[str, Any], call: ToolCall, /) -> bool:
        """Return whether this call needs an operator's approval."""


#: How long a governed call waits for a decision by default (never past its record's TTL).
DEFAULT_APPROVAL_TIMEOUT: Final = timedelta(hours=24)
#: How long a reconcile hook may take by default before its call is left as it is.
DEFAULT_RECONCILE_TIMEOUT_S: Final = 30.0
#: Longest evidence text a settlement keeps (characters).
MAX_EVIDENCE_CHARS: Final = 2000
#: What a reconcile hook found: the call ran, it did not, or it cannot tell.
ReconcileOutcome = Literal["executed", "not_executed", "unknown"]


class Reconciliation(msgspec.Struct, frozen=True, kw_only=True):
    """What a tool's reconcile hook learned of an attempted call from the business system.

    Build one with :meth:`executed`, :meth:`not_executed` or :meth:`unknown`.

    Attributes:
        outcome: ``executed`` (the call ran: ``raw`` is its raw response, projected as
            the executor's would have been), ``not_executed`` (it did not run: the call
            ends ERROR RECONCILED_NOT_EXECUTED and is never run again by itself) or
            ``unknown`` (it cannot tell: the call stays attempted, for a later reconcile
            or an operator).
        raw: the raw response of a call that ran, as the executor would have returned it.
        evidence: what the answer rests on (a payment id, "no refund with this key"):
            printable text of at most 2,000 characters, scrubbed of secrets and kept
            beside the settlement, its digest in the call's journal.

    """

    outcome: ReconcileOutcome
    raw: Any = None
    evidence: str = ""

    @classmethod
    def executed(cls, raw: Any, evidence: str = "") -> Reconciliation:
        """The call ran; ``raw`` is its raw response (projected as usual)."""
        return cls(outcome="executed", raw=raw, evidence=evidence)

    @classmethod
    def not_executed(cls, evidence: str = "") -> Reconciliation:
        """The call did not run: it ends RECONCILED_NOT_EXECUTED, never run again by itself."""
        return cls(outcome="not_executed", evidence=evidence)

    @classmethod
    def unknown(cls, evidence: str = "") -> Reconciliation:
        """The business system cannot tell yet: the call stays attempted."""
        return cls(outcome="unknown", evidence=evidence)


class Reconcile(Protocol):
    """Asks the business system what happened to an attempted call (a tool's hook).

    Called by a reconcile (``ToolBoundary.reconcile``, ``canon reconcile``) for a call
    whose process died after its dispatch, with the call's frozen request (decoded) and
    its ids, within ``ToolSpec.reconcile_timeout_s``. It must only read: look the
    operation up (by ``call.invocation_id``, an idempotency key the executor passed on,
    ...), never perform it. A hook that raises or times out leaves the call as it is.
    """

    def __call__(
        self, arguments: dict[str, Any], call: ToolCall, /
    ) -> Reconciliation | Awaitable[Reconciliation]:
        """Return what was found."""


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A tool the boundary may run.

    Attributes:
        executor: produces the raw response.
        projector: produces the bounded agent result from the raw response.
        read_only: True (default) for a tool that changes nothing. A side-effecting tool
            (False) is refused with NOT_READ_ONLY unless it declares ``approval``.
        authorized: False refuses every call before execution.
        timeout_s: most seconds the executor may take (None: no bound).
        thread: run a plain (non-async) executor in a worker thread so it cannot block
            the event loop.
        projector_in_thread: run a plain projector in a worker thread too (for a slow
            one); by default it runs on the event loop, as projectors are meant to be
            quick.
        description: what the tool does, for the stacks that show tools to a model
            (an MCP server's tool list, a framework's tool objects).
        input_schema: the JSON Schema of the tool's arguments, for those same stacks;
            descriptive only: the boundary checks that the input is a JSON object
            within the limits, never the schema.
        error_result: opt in to errors the model can correct: when the executor raises
            an ``Exception``, the call still ends ERROR with EXECUTION_FAILED, but the
            agent is shown this callable's text of the exception (scrubbed of secrets,
            within the agent result limit; see :class:`ErrorResult`) instead of the
            code's fixed message, and the record keeps that text as its agent result.
            None (default): the fixed message. Never applied to the tool's time limit,
            its own ``CancelledError``, a projector's failure or a size error (whose
            message names the limit that was hit).
        approval: for a side-effecting tool only: True, every call is governed (it is
            recorded with its request frozen and waits for an operator's approval; the
            agent is answered :class:`ApprovalPending` and the tool runs, once, only when
            an approved call is resumed); an :class:`ApprovalPolicy`, which decides per
            request; False (default), no call may run.
        approval_timeout: how long a governed call waits for a decision before it ends
            ERROR with APPROVAL_EXPIRED (default 24 hours; never past the record's TTL).
        approvals_required: how many distinct operators must approve a governed call
            before it may run (1 to 10; default 1). None of them may be the identity that
            requested it (``RunContext.requester``); a denial by any one ends it.
        reconcile: for a side-effecting tool: how to learn what happened to a call whose
            process died after its dispatch (:class:`Reconcile`); None (default): an
            operator settles such a call.
        reconcile_timeout_s: how long the hook may take (default 30 seconds).

    """

    executor: Executor
    projector: Projector
    read_only: bool = True
    authorized: bool = True
    timeout_s: float | None = None
    thread: bool = True
    projector_in_thread: bool = False
    description: str = ""
    input_schema: Mapping[str, Any] | None = None
    error_result: ErrorResult | None = None
    approval: bool | ApprovalPolicy = False
    approval_timeout: timedelta = DEFAULT_APPROVAL_TIMEOUT
    approvals_required: int = 1
    reconcile: Reconcile | None = None
    reconcile_timeout_s: float = DEFAULT_RECONCILE_TIMEOUT_S

    @property
    def governed(self) -> bool:
        """Whether calls of this tool may wait for an operator's approval (``approval`` set)."""
        return self.approval is not False

    def needs_approval(self, arguments: dict[str, Any], call: ToolCall) -> bool:
        """Whether this call waits for an operator's approval (False for a tool not governed).

        ``arguments`` is the call's decoded request. A policy that raises, or answers
        anything but False, means yes: a side effect never runs unapproved because a
        policy failed.
        """
        approval = self.approval
        if approval is True or approval is False:
            return approval
        try:
            return approval(arguments, call) is not False
        except Exception:
            return True


class ToolResult(msgspec.Struct, frozen=True, kw_only=True, tag="READY", tag_field="status"):
    """A successful reply: the bounded agent result, its evidence status and the call's ids.

    Attributes:
        result: the agent result exactly as stored (its JSON decoded), so a replayed reply
            and a receipt show the same value.
        evidence_status: EVIDENCE_FOUND or NO_EVIDENCE.
        scope: what was searched.
        tool_call_id: the framework's id of the call this answers, for routing the reply.
        invocation_id: the canonical record's public id.

    """

    result: Any
    evidence_status: EvidenceStatus
    scope: str
    tool_call_id: str
    invocation_id: str


class ToolError(msgspec.Struct, frozen=True, kw_only=True, tag="ERROR", tag_field="status"):
    """A failed reply: a stable code, its message and the call's ids, nothing else.

    Attributes:
        error_code: the stable code.
        message: the code's fixed message; for a payload refused for its size, the
            message naming the limit that was hit and its configured size
            (:meth:`machine.limits.LimitHit.message`), never the payload's own size;
            for EXECUTION_FAILED of a tool whose ``ToolSpec`` has an ``error_result``,
            the tool's own error text, scrubbed and bounded, exactly as its record keeps
            it (:attr:`from_tool`).
        tool_call_id: the framework's id of the call this answers; None when that id was
            refused (an unsafe id is never echoed).
        invocation_id: the canonical record's public id when a record holds this outcome,
            else None (a refusal before creation creates no record).

    """

    error_code: ErrorCode
    message: str
    tool_call_id: str | None = None
    invocation_id: str | None = None

    @property
    def from_tool(self) -> bool:
        """Whether :attr:`message` is the tool's own error text, not the code's fixed one.

        Only EXECUTION_FAILED carries a tool's text: a size error's message naming its
        limit is not one. A tool's text identical to the fixed message reads as the fixed
        message.
        """
        code = self.error_code
        return code is ErrorCode.EXECUTION_FAILED and self.message != SAFE_MESSAGES[code]

    @classmethod
    def of(
        cls,
        code: ErrorCode,
        *,
        tool_call_id: str | None = None,
        invocation_id: str | None = None,
        limit: LimitHit | None = None,
        message: str | None = None,
    ) -> ToolError:
        """Build the reply for ``code`` with its fixed message, ``limit``'s or ``message``.

        ``limit``: the size limit that was hit, whose message (naming that limit) is the
        reply's when it is ``code``'s. ``message``: the tool's own error text its record
        keeps (None: no text), the reply's for EXECUTION_FAILED, the only code a tool's
        text answers with; it is never anything else. Any other code keeps its message.
        """
        text = SAFE_MESSAGES[code]
        if limit is not None and limit.code is code:
            text = limit.message()
        if message is not None and code is ErrorCode.EXECUTION_FAILED:
            text = message
        return cls(
            error_code=code,
            message=text,
            tool_call_id=tool_call_id,
            invocation_id=invocation_id,
        )


class ApprovalPending(
    msgspec.Struct, frozen=True, kw_only=True, tag="AWAITING_APPROVAL", tag_field="status"
):
    """A governed call recorded and waiting for an operator's decision: not an error.

    The tool has not run. The call's request is frozen in its record; an operator approves
    or denies it, then the harness resumes it (``ToolBoundary.resume``, or the framework
    calling the tool again with the same run and tool call id), which runs the recorded
    request once, never new arguments. Its record's public status is PROJECTING.

    Attributes:
        tool_call_id: the framework's id of the call this answers.
        invocation_id: the canonical record's public id.
        approval_id: the approval the operator decides.

    """

    tool_call_id: str
    invocation_id: str
    approval_id: str

    @property
    def message(self) -> str:
        """The fixed text a model reads: waiting, not run, not to be retried."""
        return (
            f"The tool call is awaiting an operator's approval (approval {self.approval_id}) "
            "and has not run. Do not retry it: it runs once approved."
        )


AgentReply = ToolResult | ToolError | ApprovalPending

#: The ``status`` an agent reads on a reply.
ReplyStatus = Literal["READY", "ERROR", "AWAITING_APPROVAL"]


def reply_status(reply: AgentReply) -> ReplyStatus:
    """The ``status`` of ``reply``, as :func:`reply_to_builtins` names it."""
    if isinstance(reply, ToolResult):
        return "READY"
    return "ERROR" if isinstance(reply, ToolError) else "AWAITING_APPROVAL"


def reply_to_builtins(reply: AgentReply) -> dict[str, Any]:
    """Return the reply as plain JSON-ready data, every key always present.

    ``{"status": "READY", "result", "evidence_status", "scope", "tool_call_id",
    "invocation_id"}``, ``{"status": "ERROR", "error_code", "message", "tool_call_id",
    "invocation_id"}`` (the ids may be None on an error) or ``{"status":
    "AWAITING_APPROVAL", "tool_call_id", "invocation_id", "approval_id", "message"}``.
    """
    data = msgspec.to_builtins(reply)
    assert isinstance(data, dict)
    if isinstance(reply, ApprovalPending):
        data["message"] = reply.message
    return data
