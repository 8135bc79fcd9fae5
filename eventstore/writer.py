"""The Writer: appends events and folds them into the canonical record, atomically.

Each call is one script execution, so an event, its fold, its feed entry (the outbox) and,
for a creation, the run's budget reservation either all happen or none does. Every event
carries a fresh event id; re-sending the same event after a lost reply is answered as
already applied, which is what makes client-side retries safe.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from msgspec import UNSET
from redis.asyncio import Redis

from eventstore.errors import InvalidArgument
from eventstore.wire.keys import Keys
from eventstore.wire.scripts import (
    AppendArgv,
    AppendKeys,
    AppendScript,
    CreateArgv,
    CreateKeys,
    CreateScript,
    RefusalLogging,
    RefuseArgv,
    RefuseKeys,
    RefuseScript,
    Scripts,
)
from machine.codes import ErrorCode, EvidenceStatus
from machine.events import (
    GENESIS_HASH,
    PAYLOAD_OF,
    PAYLOADS_OF,
    ApprovalExpired,
    ApprovalRequested,
    Approved,
    Completed,
    Denied,
    Dispatched,
    Event,
    Failed,
    Preflighted,
    ProjectingStarted,
    encode_event,
    event_hash,
    event_type,
    payload_digest,
)
from machine.fold import InvocationState, record_pairs
from machine.ids import invocation_id, is_run_id, is_tool_name


def now_ms() -> int:
    """Return the wall-clock time in milliseconds."""
    return time.time_ns() // 1_000_000


def new_event_id() -> str:
    """Return a fresh random event id (128 bits, hex).

    An event id only has to be unique (a re-sent event is recognised by it), never
    secret: the module's generator, seeded from the OS and re-seeded in a forked child,
    gives 128 bits without a system call per event.
    """
    return f"{random.getrandbits(128):032x}"


@dataclass(frozen=True, slots=True)
class Head:
    """Where an invocation stands after a write: what the next event must follow.

    Attributes:
        run_id: the run that owns the invocation.
        tool_call_id: the framework's tool call id, exactly as supplied.
        version: version of the last applied event (1-based).
        last_hash: chain hash of the last applied event.
        entry_id: feed entry id of this commit, the position projections wait for
            ("" when the event had already been applied by an earlier attempt).
        expires_at_ms: the record's absolute expiry, fixed at creation.

    """

    run_id: str
    tool_call_id: str
    version: int
    last_hash: str
    entry_id: str
    expires_at_ms: int


def head_of(state: InvocationState, expires_at_ms: int) -> Head:
    """The head a call's next event follows, from its record's state and expiry."""
    return Head(
        run_id=state.run_id,
        tool_call_id=state.tool_call_id,
        version=state.version,
        last_hash=state.last_hash,
        entry_id="",
        expires_at_ms=expires_at_ms,
    )


def preflighted(run_id: str, tool_call_id: str, tool: str, request: bytes) -> Preflighted:
    """Return a new invocation's first event, for :meth:`Writer.append` of ``request``.

    Built apart from the append so that a caller who loses the reply (a cancellation
    mid-flight) can send the very same event again: it is answered as applied if the
    first one landed, and creates the record if it did not, never both.
    """
    return Preflighted(**_first_event(run_id, tool_call_id, tool, request))


def _first_event(run_id: str, tool_call_id: str, tool: str, request: bytes) -> dict[str, Any]:
    """The fields every creating event has: a new id, version 1, now, and the request's.

    The frozen request of a governed call's ``ApprovalRequested`` is recorded exactly as a
    ``Preflighted`` one is.
    """
    return {
        "event_id": new_event_id(),
        "version": 1,
        "at_ms": now_ms(),
        "prev_hash": GENESIS_HASH,
        "run_id": run_id,
        "tool_call_id": tool_call_id,
        "tool": tool,
        "request_sha256": payload_digest(request),
        "request_bytes": len(request),
    }


def _next_event(head: Head) -> dict[str, Any]:
    """The fields every event after ``head`` starts with, written once for all three.

    A new event id, the next version, the time now and the hash of the event before it.
    """
    return {
        "event_id": new_event_id(),
        "version": head.version + 1,
        "at_ms": now_ms(),
        "prev_hash": head.last_hash,
    }


def _utf8_bytes(value: object) -> int:
    """The UTF-8 size of an id as sent (lone surrogates counted as encoded; 0 for none)."""
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    return len(value) if isinstance(value, bytes | bytearray) else 0


class Writer:
    """Appends events through the store's scripts."""

    def __init__(
        self,
        client: Redis,
        keys: Keys,
        scripts: Scripts,
        *,
        ttl_ms: int,
        feed_retention_ms: int,
        refusals_kept: int = 1000,
    ) -> None:
        """Write through ``scripts`` on ``client`` (they carry the batcher, if any).

        Raises:
            InvalidArgument: ``feed_retention_ms`` is shorter than ``ttl_ms``: age trimming
                would then drop feed entries of records that still exist, before every
                projection has seen them.

        """
        if feed_retention_ms < ttl_ms:
            raise InvalidArgument("feed retention must not be shorter than the record TTL")
        self._client = client
        self._keys = keys
        self._scripts = scripts
        self._ttl_ms = ttl_ms
        self._feed_retention_ms = feed_retention_ms
        self._refusals_kept = refusals_kept

    async def append(
        self,
        event: Event,
        payload: bytes | Mapping[str, bytes] | None = None,
        *,
        run_id: str,
        tool_call_id: str,
        log_refusals: RefusalLogging = "all",
    ) -> Head:
        """Append one prepared event (and its payload, if its type has one).

        ``payload`` is the bytes of the event type's payload, or, for a type that carries
        several (``Failed``: the failure detail and the agent result), the bytes of each
        by its record field (:data:`~machine.events.PAYLOADS_OF`); a payload left out is
        not stored.

        A creation the run refuses (budgets, duplicate, deadline, pause...) is put on the
        run's refusal log by the same script, as ``log_refusals`` says (see
        :data:`~eventstore.wire.scripts.RefusalLogging`).

        Raises:
            InvalidArgument: an unsafe run id or tool call id, or (for a creation) a tool
                name that is not allowed; refused before any command is sent.
            Refused: the script refused the event (its ``code`` says why).
            RecordExpired: an update found the record gone; nothing was created.
            StoreUnavailable: Redis failed or timed out.

        """
        # Checked before anything is encoded or sent: an unsafe id is refused, never rewritten.
        keys = self._keys.invocation(run_id, tool_call_id)
        if isinstance(event, Preflighted | ApprovalRequested) and not is_tool_name(event.tool):
            raise InvalidArgument("tool name is not allowed")
        encoded = encode_event(event)
        hash_ = event_hash(encoded)
        kind = event_type(event)
        pairs: list[Any] = record_pairs(event)
        if isinstance(payload, bytes):
            field = PAYLOAD_OF[kind].payload
            if field is not None:
                pairs += (field, payload)
        elif payload is not None:
            for fields in PAYLOADS_OF[kind]:
                value = payload.get(fields.payload) if fields.payload is not None else None
                if value is not None:
                    pairs += (fields.payload, value)
        if isinstance(event, Preflighted | ApprovalRequested):
            committed = await self._scripts.create(
                CreateScript.arguments(
                    CreateKeys(
                        keys.record, keys.stream, keys.feed, keys.run, keys.control, keys.refusals
                    ),
                    CreateArgv(
                        event_id=event.event_id,
                        event_hash=hash_,
                        event=encoded,
                        run_id=run_id,
                        tool_call_id=tool_call_id,
                        tool=event.tool,
                        invocation_id=invocation_id(run_id, tool_call_id),
                        at_ms=event.at_ms,
                        ttl_ms=self._ttl_ms,
                        retention_ms=self._feed_retention_ms,
                        version=event.version,
                        prev_hash=event.prev_hash,
                        refusals_kept=self._refusals_kept,
                        log_refusals=log_refusals,
                        event_type=kind,
                    ),
                    group_args=pairs,
                )
            )
        else:
            committed = await self._scripts.append(
                AppendScript.arguments(
                    AppendKeys(
                        keys.record, keys.stream, keys.feed, keys.progress, keys.run, keys.control
                    ),
                    AppendArgv(
                        event_type=kind,
                        version=event.version,
                        event_id=event.event_id,
                        prev_hash=event.prev_hash,
                        event_hash=hash_,
                        event=encoded,
                        at_ms=event.at_ms,
                        retention_ms=self._feed_retention_ms,
                        run_id=run_id,
                        tool_call_id=tool_call_id,
                    ),
                    group_args=pairs,
                )
            )
        return Head(
            run_id=run_id,
            tool_call_id=tool_call_id,
            version=committed.version,
            last_hash=hash_,
            entry_id=committed.entry_id,
            expires_at_ms=committed.expires_at_ms,
        )

    async def create(self, run_id: str, tool_call_id: str, tool: str, request: bytes) -> Head:
        """Create the invocation: Preflighted with the complete request (status PROJECTING).

        Raises:
            InvalidArgument: an unsafe run id or tool call id, or a tool name that is not
                allowed; nothing is sent and nothing is created.
            Refused: with a preflight code (RUN_INACTIVE, DUPLICATE_TOOL_CALL, budgets...).
            StoreUnavailable: Redis failed or timed out.

        """
        event = preflighted(run_id, tool_call_id, tool, request)
        return await self.append(event, request, run_id=run_id, tool_call_id=tool_call_id)

    async def request_approval(
        self,
        run_id: str,
        tool_call_id: str,
        tool: str,
        request: bytes,
        *,
        approval_id: str,
        approval_expires_at_ms: int,
        log_refusals: RefusalLogging = "all",
        supersedes: str | None = None,
    ) -> Head:
        """Create a governed call: ApprovalRequested with the complete request, frozen.

        The record waits in AWAITING_APPROVAL (status PROJECTING); the tool has not run.
        The same preflight as :meth:`create` (run, budgets, duplicate, pauses) decides in
        the same script, and logs its refusals as ``log_refusals`` says (see
        :meth:`append`). ``supersedes``: the call an operator edited into this one.

        Raises:
            InvalidArgument: an unsafe run id or tool call id, or a tool name that is not
                allowed; nothing is sent and nothing is created.
            Refused: with a preflight code (RUN_INACTIVE, RUN_PAUSED, DUPLICATE_TOOL_CALL...).
            StoreUnavailable: Redis failed or timed out.

        """
        event = ApprovalRequested(
            **_first_event(run_id, tool_call_id, tool, request),
            approval_id=approval_id,
            approval_expires_at_ms=approval_expires_at_ms,
            supersedes=UNSET if supersedes is None else supersedes,
        )
        return await self.append(
            event, request, run_id=run_id, tool_call_id=tool_call_id, log_refusals=log_refusals
        )

    async def approve(self, head: Head, decided_by: str, reason: str, decision_id: str) -> Head:
        """Approve a call awaiting approval (Approved): it may now be dispatched once.

        Raises:
            Refused: ILLEGAL_TRANSITION (not awaiting approval), VERSION_CONFLICT (another
                decision came first), APPROVAL_EXPIRED (past the approval's expiry).
            RecordExpired, StoreUnavailable: as for any append.

        """
        event = Approved(
            **_next_event(head),
            decided_by=decided_by,
            decision_reason=reason,
            decision_id=decision_id,
        )
        return await self.append(event, run_id=head.run_id, tool_call_id=head.tool_call_id)

    async def deny(
        self,
        head: Head,
        decided_by: str,
        reason: str,
        decision_id: str,
        superseded_by: str | None = None,
    ) -> Head:
        """Deny a call awaiting approval (Denied): ERROR APPROVAL_DENIED, never dispatched.

        ``superseded_by``: the edited call that replaces it, when the denial is an edit.

        Raises:
            Refused: ILLEGAL_TRANSITION (not awaiting approval), VERSION_CONFLICT (another
                decision came first).
            RecordExpired, StoreUnavailable: as for any append.

        """
        event = Denied(
            **_next_event(head),
            decided_by=decided_by,
            decision_reason=reason,
            decision_id=decision_id,
            error_code=ErrorCode.APPROVAL_DENIED,
            superseded_by=UNSET if superseded_by is None else superseded_by,
        )
        return await self.append(event, run_id=head.run_id, tool_call_id=head.tool_call_id)

    async def expire_approval(self, head: Head) -> Head:
        """Record that an undispatched call's approval expired: ERROR APPROVAL_EXPIRED.

        Raises:
            Refused: ILLEGAL_TRANSITION (decided or dispatched), VERSION_CONFLICT.
            RecordExpired, StoreUnavailable: as for any append.

        """
        event = ApprovalExpired(**_next_event(head), error_code=ErrorCode.APPROVAL_EXPIRED)
        return await self.append(event, run_id=head.run_id, tool_call_id=head.tool_call_id)

    async def dispatch(self, head: Head, request_sha256: str) -> Head:
        """Take an approved call's one dispatch permit (Dispatched): it is attempted now.

        ``request_sha256`` is the digest of the request as read back before the tool runs.

        Raises:
            Refused: ILLEGAL_TRANSITION (not approved, or dispatched already),
                VERSION_CONFLICT (another resumer took it first), APPROVAL_EXPIRED,
                EXECUTION_PAUSED or RUN_PAUSED.
            RecordExpired, StoreUnavailable: as for any append.

        """
        event = Dispatched(**_next_event(head), dispatched_request_sha256=request_sha256)
        return await self.append(event, run_id=head.run_id, tool_call_id=head.tool_call_id)

    async def record_refusal(
        self, run_id: str, tool: object, tool_call_id: object, code: ErrorCode
    ) -> bool:
        """Put a call refused before any script (preflight) on its run's refusal log.

        One script call: one entry (time, tool, tool call id, code) and one more count of
        ``code`` in the run hash, only while the run exists. A tool name that is not one is
        left out; a tool call id this layout would not hold is recorded by its UTF-8 size
        only, never stored. Returns False (nothing written) when ``run_id`` is not a run id
        or the run does not exist.

        Raises:
            StoreUnavailable: Redis failed or timed out.

        """
        if not is_run_id(run_id):
            return False
        kept_id = tool_call_id if isinstance(tool_call_id, str) else ""
        if not self._keys.accepts_tool_call_id(kept_id):
            kept_id = ""  # recorded by its size only
        return await self._scripts.refuse(
            RefuseScript.arguments(
                RefuseKeys(run=self._keys.run(run_id), refusals=self._keys.refusals(run_id)),
                RefuseArgv(
                    tool=tool if isinstance(tool, str) and is_tool_name(tool) else "",
                    tool_call_id=kept_id,
                    tool_call_id_bytes=_utf8_bytes(tool_call_id),
                    code=code.value,
                    refusals_kept=self._refusals_kept,
                ),
            )
        )

    async def start_projecting(self, head: Head, raw: bytes) -> Head:
        """Store the executor's complete raw response (ProjectingStarted)."""
        event = ProjectingStarted(
            **_next_event(head),
            raw_sha256=payload_digest(raw),
            raw_bytes=len(raw),
        )
        return await self.append(event, raw, run_id=head.run_id, tool_call_id=head.tool_call_id)

    async def complete(
        self, head: Head, result: bytes, evidence_status: EvidenceStatus, scope: str
    ) -> Head:
        """Store the bounded agent result and make the record READY (Completed)."""
        event = Completed(
            **_next_event(head),
            result_sha256=payload_digest(result),
            result_bytes=len(result),
            evidence_status=evidence_status,
            scope=scope,
        )
        return await self.append(event, result, run_id=head.run_id, tool_call_id=head.tool_call_id)

    async def fail(
        self,
        head: Head,
        error_code: ErrorCode,
        rejected_bytes: int | None = None,
        failure_detail: bytes | None = None,
        result: bytes | None = None,
    ) -> Head:
        """Make the record ERROR with a stable code (Failed).

        ``failure_detail`` (:mod:`machine.failure_detail`), when given, is stored in the
        record's ``failure_detail`` field in the same script call, its digest and size in
        the event. So is ``result``, the agent result the agent was shown instead of the
        code's fixed message (the tool's own error text as JSON), in the ``result`` field.
        """
        event = Failed(
            **_next_event(head),
            error_code=error_code,
            rejected_bytes=rejected_bytes,
            failure_detail_sha256=UNSET
            if failure_detail is None
            else payload_digest(failure_detail),
            failure_detail_bytes=UNSET if failure_detail is None else len(failure_detail),
            result_sha256=UNSET if result is None else payload_digest(result),
            result_bytes=UNSET if result is None else len(result),
        )
        payload: bytes | dict[str, bytes] | None = failure_detail
        if result is not None:
            # Two payloads, by record field; a failure without an agent result (the usual
            # one) keeps the one-payload path.
            payload = {"result": result}
            if failure_detail is not None:
                payload["failure_detail"] = failure_detail
        return await self.append(
            event,
            payload,
            run_id=head.run_id,
            tool_call_id=head.tool_call_id,
        )
