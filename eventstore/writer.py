"""The Writer: appends events and folds them into the canonical record, atomically.

Each call is one script execution, so an event, its fold, its feed entry (the outbox) and,
for a creation, the run's budget reservation either all happen or none does. Every event
carries a fresh event id; re-sending the same event after a lost reply is answered as
already applied, which is what makes client-side retries safe.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from msgspec import UNSET
from redis.asyncio import Redis
from redis.exceptions import RedisError

from eventstore.errors import InvalidArgument, store_error
from eventstore.keyring import KeyringError, UnknownKey
from eventstore.sealing import KeyErased, RunSeal, SealBroken, Seals
from eventstore.wire import faults
from eventstore.wire.batching import SentCall
from eventstore.wire.keys import InvocationKeys, Keys
from eventstore.wire.lua import KeysAndArgs
from eventstore.wire.scripts import (
    AppendArgv,
    AppendKeys,
    AppendScript,
    Committed,
    CreateArgv,
    CreateKeys,
    CreateScript,
    LapsedArgv,
    LapsedKeys,
    LapsedScript,
    LeaseArgv,
    LeaseKeys,
    LeaseScript,
    PermitArgv,
    PermitKeys,
    PermitScript,
    RefusalLogging,
    RefuseArgv,
    RefuseKeys,
    RefuseScript,
    Scripts,
    SupersedeArgv,
    SupersedeKeys,
    SupersedeScript,
    committed,
)
from machine.codes import ErrorCode, EvidenceStatus
from machine.events import (
    GENESIS_HASH,
    PAYLOAD_OF,
    PAYLOADS_OF,
    ApprovalAdded,
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
    Reconciled,
    Settled,
    TakenOver,
    encode_event,
    event_hash,
    event_type,
    payload_digest,
)
from machine.fold import InvocationState, record_pairs
from machine.ids import invocation_id, is_run_id, is_tool_name
from machine.phases import DEFAULT_LEASE_MS
from machine.results import SAME_AS_RAW, stored_result


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


@dataclass(frozen=True, slots=True)
class Permit:
    """A governed call's dispatch permit, held by the one caller that took it.

    Attributes:
        head: where the call stands after its Dispatched (EXECUTING).
        request: the stored request, read in the step that granted the permit (None when
            the record holds none); the caller runs it only if it has the journal's
            digest.

    """

    head: Head
    request: bytes | None


class Pending:
    """An event written ahead of its answer (:meth:`Writer.send_projecting`).

    Attributes:
        before: the head it follows: where the call stands if it is refused.
        head: the head it leads to once committed (its feed entry id still unknown): what
            the event after it follows.
        sent: the written call, until its answer is read (None: answered already).
        committed: its head as answered, once read (None until then, or refused).

    """

    __slots__ = ("before", "committed", "head", "sent")

    def __init__(
        self, before: Head, head: Head, sent: SentCall | None, committed: Head | None = None
    ) -> None:
        self.before = before
        self.head = head
        self.sent = sent
        self.committed = committed


def _committed_head(head: Head, committed: Committed, last_hash: str | None = None) -> Head:
    """The head after an event of ``head``'s invocation that its script committed.

    ``last_hash``: the event's own hash (default: ``head``'s, when ``head`` already is
    the head the event leads to).
    """
    return Head(
        run_id=head.run_id,
        tool_call_id=head.tool_call_id,
        version=committed.version,
        last_hash=head.last_hash if last_hash is None else last_hash,
        entry_id=committed.entry_id,
        expires_at_ms=committed.expires_at_ms,
    )


def _record_and_payload_pairs(
    event: Event,
    kind: str,
    payload: bytes | Mapping[str, bytes] | None,
    seal: RunSeal | None = None,
    invocation: str = "",
) -> list[Any]:
    """The record's field/value pairs an event sets, its payload's field(s) after them.

    With ``seal`` (a keyring), each payload value is sealed for its field and
    ``invocation``; the marker of a result stored once as the raw response is no payload
    and stays as it is.
    """
    pairs: list[Any] = record_pairs(event)
    if isinstance(payload, bytes):
        field = PAYLOAD_OF[kind].payload
        if field is not None:
            if seal is not None and payload != SAME_AS_RAW:
                payload = seal.seal(field, invocation, payload)
            pairs += (field, payload)
    elif payload is not None:
        for fields in PAYLOADS_OF[kind]:
            name = fields.payload
            value = payload.get(name) if name is not None else None
            if name is not None and value is not None:
                if seal is not None and value != SAME_AS_RAW:
                    value = seal.seal(name, invocation, value)
                pairs += (name, value)
    return pairs


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


def preflighted(
    run_id: str,
    tool_call_id: str,
    tool: str,
    request: bytes,
    request_sha256: str | None = None,
) -> Preflighted:
    """Return a new invocation's first event, for :meth:`Writer.append` of ``request``.

    Built apart from the append so that a caller who loses the reply (a cancellation
    mid-flight) can send the very same event again: it is answered as applied if the
    first one landed, and creates the record if it did not, never both.
    ``request_sha256``: the request's keyed digest when payloads are encrypted
    (:meth:`Writer.digest_for`); None: its SHA-256.
    """
    return Preflighted(**_first_event(run_id, tool_call_id, tool, request, request_sha256))


def approval_requested(
    run_id: str,
    tool_call_id: str,
    tool: str,
    request: bytes,
    *,
    approval_id: str,
    approval_expires_at_ms: int,
    requested_by: str,
    approvals_required: int = 1,
    supersedes: str | None = None,
    retry_of: str | None = None,
    retried_by: str | None = None,
    request_sha256: str | None = None,
) -> ApprovalRequested:
    """Return a governed call's first event, its request and its policy frozen in it.

    ``approvals_required`` of 1 is left out of the event (its absence means one), so a
    call that needs one approval is stored as before the field existed. ``retry_of`` and
    ``retried_by`` name the call settled as not executed that an operator requested
    again as this one.
    """
    return ApprovalRequested(
        **_first_event(run_id, tool_call_id, tool, request, request_sha256),
        approval_id=approval_id,
        approval_expires_at_ms=approval_expires_at_ms,
        supersedes=UNSET if supersedes is None else supersedes,
        requested_by=requested_by,
        approvals_required=UNSET if approvals_required == 1 else approvals_required,
        retry_of=UNSET if retry_of is None else retry_of,
        retried_by=UNSET if retried_by is None else retried_by,
    )


def _first_event(
    run_id: str, tool_call_id: str, tool: str, request: bytes, request_sha256: str | None
) -> dict[str, Any]:
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
        "request_sha256": payload_digest(request) if request_sha256 is None else request_sha256,
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
        lease_ms: int = DEFAULT_LEASE_MS,
        seals: Seals | None = None,
    ) -> None:
        """Write through ``scripts`` on ``client`` (they carry the batcher, if any).

        ``lease_ms`` is the lease a call in flight gets from the event that lets its
        writer run it (Preflighted, Dispatched, TakenOver, Reconciled). With ``seals``
        (a keyring), every payload is sealed with its run's data key before it is sent
        (:mod:`eventstore.sealing`); the events' digests and sizes stay the plaintext's.

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
        self._lease_ms = lease_ms
        self._seals = seals

    @property
    def lease_ms(self) -> int:
        """The lease a call in flight gets, in milliseconds (renew it within a third)."""
        return self._lease_ms

    def _digest_now(self, run_id: str) -> Callable[[bytes], str] | None:
        """:meth:`digest_for` when no Redis call is needed (no keyring, or a known run)."""
        seals = self._seals
        if seals is None:
            return payload_digest
        seal = seals.cached(run_id)
        return None if seal is None else seal.digest

    async def digest_for(self, run_id: str) -> Callable[[bytes], str]:
        """How this writer digests a run's payloads (a keyring: keyed, else SHA-256).

        HMAC-SHA-256 keyed by the run's data key when payloads are encrypted (the key
        made if need be).
        """
        seals = self._seals
        if seals is None:
            return payload_digest
        return (seals.cached(run_id) or await seals.for_writing(run_id)).digest

    async def _seal_of(self, run_id: str, payload: object) -> RunSeal | None:
        """The run's seal when payloads are sealed and ``payload`` is one, else None."""
        if self._seals is None or payload is None:
            return None
        return await self._seals.for_writing(run_id)

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
            RecordExpired: an update found the record gone, or a creation resent by the
                client's retry found its record expired; nothing was created.
            StoreUnavailable: Redis failed or timed out.

        """
        # Checked before anything is encoded or sent: an unsafe id is refused, never rewritten.
        keys = self._keys.invocation(run_id, tool_call_id)
        if isinstance(event, Preflighted | ApprovalRequested) and not is_tool_name(event.tool):
            raise InvalidArgument("tool name is not allowed")
        encoded = encode_event(event)
        hash_ = event_hash(encoded)
        kind = event_type(event)
        if self._seals is not None and payload is not None:
            seal = self._seals.cached(run_id) or await self._seals.for_writing(run_id)
            pairs = _record_and_payload_pairs(
                event, kind, payload, seal, invocation_id(run_id, tool_call_id)
            )
        else:
            pairs = _record_and_payload_pairs(event, kind, payload)
        if faults.ARMED:
            faults.reached(f"before:{kind}")
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
                        lease_ms=self._lease_ms,
                    ),
                    group_args=pairs,
                )
            )
        else:
            committed = await self._scripts.append(
                self._append_arguments(
                    keys, run_id, tool_call_id, event, kind, encoded, hash_, pairs
                )
            )
        if faults.ARMED:
            faults.reached(f"after:{kind}")
        return Head(
            run_id=run_id,
            tool_call_id=tool_call_id,
            version=committed.version,
            last_hash=hash_,
            entry_id=committed.entry_id,
            expires_at_ms=committed.expires_at_ms,
        )

    def _append_arguments(
        self,
        keys: InvocationKeys,
        run_id: str,
        tool_call_id: str,
        event: Event,
        kind: str,
        encoded: bytes,
        hash_: str,
        pairs: list[Any],
    ) -> KeysAndArgs:
        """``append.lua``'s KEYS and ARGV for ``event`` (already encoded and hashed)."""
        return AppendScript.arguments(
            AppendKeys(keys.record, keys.stream, keys.feed, keys.progress, keys.run),
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

    def _prepared(
        self,
        head: Head,
        event: Event,
        payload: bytes | Mapping[str, bytes] | None,
        seal: RunSeal | None,
    ) -> tuple[KeysAndArgs, str]:
        """An event after ``head``, ready to send: ``append.lua``'s arguments and its hash.

        ``seal``: the run's (:meth:`_seal_of`), when payloads are sealed.
        """
        keys = self._keys.invocation(head.run_id, head.tool_call_id)
        encoded = encode_event(event)
        hash_ = event_hash(encoded)
        kind = event_type(event)
        pairs = _record_and_payload_pairs(
            event, kind, payload, seal, invocation_id(head.run_id, head.tool_call_id)
        )
        arguments = self._append_arguments(
            keys, head.run_id, head.tool_call_id, event, kind, encoded, hash_, pairs
        )
        return arguments, hash_

    async def _follow(
        self, pending: Pending, event: Event, payload: bytes | Mapping[str, bytes] | None
    ) -> Head:
        """Append ``event`` right behind ``pending``'s event; both answers read together.

        ``pending``'s refusal is raised first: the event written after it is then refused
        too (its version follows one that never landed).
        """
        sent = pending.sent
        if sent is None:  # answered when it was sent: an append as any other
            return await self.append(
                event, payload, run_id=pending.head.run_id, tool_call_id=pending.head.tool_call_id
            )
        # The seal is taken before the pending answer is claimed: a store failure here
        # leaves that answer for the caller's answer().
        seals = self._seals
        seal = (
            None
            if seals is None
            else seals.cached(pending.head.run_id) or await seals.for_writing(pending.head.run_id)
        )
        pending.sent = None
        (keys, args), hash_ = self._prepared(pending.head, event, payload, seal)
        kind = event_type(event)
        if faults.ARMED:
            faults.reached(f"before:{kind}")
        script = self._scripts.append.script
        try:
            first, second = await sent.then(script, keys, args)
        except (RedisError, OSError) as exc:
            raise store_error(exc) from None
        if faults.ARMED:
            faults.reached(f"after:{kind}")
        pending.committed = _committed_head(pending.head, committed(first))
        return _committed_head(pending.head, committed(second), hash_)

    async def answer(self, pending: Pending) -> Head:
        """Wait for the answer of ``pending``'s event alone (no event will follow it).

        Raises:
            RecordExpired: the record is gone; the event was not written.
            Refused: the script refused the event (its ``code`` says why).
            StoreUnavailable: Redis failed or timed out.

        """
        sent, pending.sent = pending.sent, None
        if sent is not None:
            try:
                reply = await sent.answer()
            except (RedisError, OSError) as exc:
                raise store_error(exc) from None
            pending.committed = _committed_head(pending.head, committed(reply))
        if pending.committed is None:
            raise RuntimeError("a pending event is answered once")
        return pending.committed

    async def create(self, run_id: str, tool_call_id: str, tool: str, request: bytes) -> Head:
        """Create the invocation: Preflighted with the complete request (status PROJECTING).

        Raises:
            InvalidArgument: an unsafe run id or tool call id, or a tool name that is not
                allowed; nothing is sent and nothing is created.
            Refused: with a preflight code (RUN_INACTIVE, DUPLICATE_TOOL_CALL, budgets...).
            StoreUnavailable: Redis failed or timed out.

        """
        digest = None if self._seals is None else (await self.digest_for(run_id))(request)
        event = preflighted(run_id, tool_call_id, tool, request, digest)
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
        requested_by: str,
        approvals_required: int = 1,
        retry_of: str | None = None,
        retried_by: str | None = None,
    ) -> Head:
        """Create a governed call: ApprovalRequested with the complete request, frozen.

        The record waits in AWAITING_APPROVAL (status PROJECTING); the tool has not run.
        The same preflight as :meth:`create` (run, budgets, duplicate, pauses) decides in
        the same script, and logs its refusals as ``log_refusals`` says (see
        :meth:`append`). The policy it waits under is frozen with it: ``requested_by``,
        who may never approve it, and ``approvals_required``, how many distinct operators
        must. ``retry_of`` and ``retried_by``: the call an operator requested again.

        Raises:
            InvalidArgument: an unsafe run id or tool call id, or a tool name that is not
                allowed; nothing is sent and nothing is created.
            Refused: with a preflight code (RUN_INACTIVE, RUN_PAUSED, DUPLICATE_TOOL_CALL...).
            StoreUnavailable: Redis failed or timed out.

        """
        event = approval_requested(
            run_id,
            tool_call_id,
            tool,
            request,
            approval_id=approval_id,
            approval_expires_at_ms=approval_expires_at_ms,
            requested_by=requested_by,
            approvals_required=approvals_required,
            retry_of=retry_of,
            retried_by=retried_by,
            request_sha256=None
            if self._seals is None
            else (await self.digest_for(run_id))(request),
        )
        return await self.append(
            event, request, run_id=run_id, tool_call_id=tool_call_id, log_refusals=log_refusals
        )

    async def approve(
        self,
        head: Head,
        decided_by: str,
        reason: str,
        decision_id: str,
        *,
        approval_count: int = 1,
        approvals_required: int = 1,
    ) -> Head:
        """Record one operator's approval of a call awaiting approval.

        ``approval_count`` is how many approvals the call holds with this one. When it
        reaches ``approvals_required`` this is Approved: the call may now be dispatched
        once; before, ApprovalAdded: the call still waits.

        Raises:
            Refused: ILLEGAL_TRANSITION (not awaiting approval), VERSION_CONFLICT (another
                decision came first), APPROVAL_EXPIRED (past the approval's expiry).
            RecordExpired, StoreUnavailable: as for any append.

        """
        event: Approved | ApprovalAdded
        if approval_count < approvals_required:
            event = ApprovalAdded(
                **_next_event(head),
                decided_by=decided_by,
                decision_reason=reason,
                decision_id=decision_id,
                approval_count=approval_count,
            )
        else:
            event = Approved(
                **_next_event(head),
                decided_by=decided_by,
                decision_reason=reason,
                decision_id=decision_id,
                approval_count=UNSET if approvals_required == 1 else approval_count,
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

    async def supersede(
        self,
        head: Head,
        edited: ApprovalRequested,
        edited_request: bytes,
        *,
        decided_by: str,
        reason: str,
        decision_id: str,
    ) -> tuple[Head, Head]:
        """Deny a call awaiting approval as superseded by ``edited``, and record ``edited``.

        One script (``supersede.lua``): both are written, or, when the original moved on
        first (decided, expired, gone) or the edited call is refused, nothing is. The
        denial's reason is ``reason`` as given; ``edited`` is the edited call's
        ApprovalRequested (:func:`approval_requested`, its ``supersedes`` the original),
        holding ``edited_request``. Returns the original's head and the edited call's.

        Raises:
            Refused: nothing was written; its code says why (VERSION_CONFLICT,
                ILLEGAL_TRANSITION or CHAIN_BROKEN: the original moved on;
                APPROVAL_EXPIRED; RUN_INACTIVE, UNAUTHORIZED, RUN_DEADLINE_EXPIRED;
                DUPLICATE_TOOL_CALL: the edited call's id is taken).
            RecordExpired: the original's record is gone.
            StoreUnavailable: Redis failed or timed out.

        """
        denied = Denied(
            **_next_event(head),
            decided_by=decided_by,
            decision_reason=reason,
            decision_id=decision_id,
            error_code=ErrorCode.APPROVAL_DENIED,
            superseded_by=edited.tool_call_id,
        )
        if not is_tool_name(edited.tool):
            raise InvalidArgument("tool name is not allowed")
        keys = self._keys.invocation(head.run_id, head.tool_call_id)
        edited_keys = self._keys.invocation(edited.run_id, edited.tool_call_id)
        encoded, edited_encoded = encode_event(denied), encode_event(edited)
        hash_, edited_hash = event_hash(encoded), event_hash(edited_encoded)
        denied_pairs: list[Any] = record_pairs(denied)
        seal = await self._seal_of(edited.run_id, edited_request)
        if seal is not None:
            edited_request = seal.seal(
                "request", invocation_id(edited.run_id, edited.tool_call_id), edited_request
            )
        edited_pairs: list[Any] = [*record_pairs(edited), "request", edited_request]
        written = await self._scripts.supersede(
            SupersedeScript.arguments(
                SupersedeKeys(
                    keys.record,
                    keys.stream,
                    edited_keys.record,
                    edited_keys.stream,
                    keys.feed,
                    keys.progress,
                    keys.run,
                ),
                SupersedeArgv(
                    run_id=head.run_id,
                    tool_call_id=head.tool_call_id,
                    tool=edited.tool,
                    version=denied.version,
                    event_id=denied.event_id,
                    prev_hash=denied.prev_hash,
                    event_hash=hash_,
                    event=encoded,
                    edited_call_id=edited.tool_call_id,
                    edited_invocation_id=invocation_id(edited.run_id, edited.tool_call_id),
                    edited_event_id=edited.event_id,
                    edited_event_hash=edited_hash,
                    edited_event=edited_encoded,
                    at_ms=denied.at_ms,
                    ttl_ms=self._ttl_ms,
                    retention_ms=self._feed_retention_ms,
                    denied_fields=len(denied_pairs),
                ),
                group_args=[*denied_pairs, *edited_pairs],
            )
        )
        original = Head(
            run_id=head.run_id,
            tool_call_id=head.tool_call_id,
            version=written.version,
            last_hash=hash_,
            entry_id="",
            expires_at_ms=written.expires_at_ms,
        )
        created = Head(
            run_id=edited.run_id,
            tool_call_id=edited.tool_call_id,
            version=1,
            last_hash=edited_hash,
            entry_id="",
            expires_at_ms=written.edited_expires_at_ms,
        )
        return original, created

    async def expire_approval(self, head: Head) -> Head:
        """Record that an undispatched call's approval expired: ERROR APPROVAL_EXPIRED.

        Raises:
            Refused: ILLEGAL_TRANSITION (decided or dispatched), VERSION_CONFLICT.
            RecordExpired, StoreUnavailable: as for any append.

        """
        event = ApprovalExpired(**_next_event(head), error_code=ErrorCode.APPROVAL_EXPIRED)
        return await self.append(event, run_id=head.run_id, tool_call_id=head.tool_call_id)

    async def dispatch(self, head: Head, tool: str, request_sha256: str) -> Permit:
        """Take an approved call's one dispatch permit (Dispatched): it is attempted now.

        ``tool`` and ``request_sha256`` are what the caller would run: the tool and the
        digest of the request it read. The permit script grants the permit only when the
        call's journal approves exactly that (``permit.lua`` lists what it checks) and
        hands back the stored request, read in the same step: the caller runs it only if
        its bytes have the journal's digest.

        Raises:
            PermitRefused: the script refused; its ``code`` says why (ILLEGAL_TRANSITION
                or VERSION_CONFLICT: not approved, or another resumer took it first;
                JOURNAL_MISMATCH, APPROVED_REQUEST_CHANGED, APPROVAL_EXPIRED, RUN_ERASED,
                RUN_INACTIVE, UNAUTHORIZED, RUN_DEADLINE_EXPIRED, EXECUTION_PAUSED,
                RUN_PAUSED ...).
            RecordExpired: the record is gone.
            StoreUnavailable: Redis failed or timed out.

        """
        event = Dispatched(**_next_event(head), dispatched_request_sha256=request_sha256)
        keys = self._keys.invocation(head.run_id, head.tool_call_id)
        encoded = encode_event(event)
        hash_ = event_hash(encoded)
        if faults.ARMED:
            faults.reached("before:Dispatched")
        permitted = await self._scripts.permit(
            PermitScript.arguments(
                PermitKeys(keys.record, keys.stream, keys.feed, keys.run, keys.control),
                PermitArgv(
                    version=event.version,
                    event_id=event.event_id,
                    prev_hash=event.prev_hash,
                    event_hash=hash_,
                    event=encoded,
                    at_ms=event.at_ms,
                    retention_ms=self._feed_retention_ms,
                    run_id=head.run_id,
                    tool_call_id=head.tool_call_id,
                    tool=tool,
                    request_sha256=request_sha256,
                    lease_ms=self._lease_ms,
                ),
                group_args=record_pairs(event),
            )
        )
        if faults.ARMED:
            faults.reached("after:Dispatched")
        committed = permitted.committed
        request = permitted.request
        if request is not None and self._seals is not None:
            request = await self._opened_request(head, request)
        return Permit(
            head=Head(
                run_id=head.run_id,
                tool_call_id=head.tool_call_id,
                version=committed.version,
                last_hash=hash_,
                entry_id=committed.entry_id,
                expires_at_ms=committed.expires_at_ms,
            ),
            request=request,
        )

    async def _opened_request(self, head: Head, request: bytes) -> bytes | None:
        """The permit's stored request opened; None when it does not open.

        GCM authenticates the value for this call's ``request`` field: a request altered,
        or moved from another call, never opens, and the caller then runs nothing (it
        has no bytes with the journal's digest).
        """
        if self._seals is None:
            return request
        try:
            seal = await self._seals.for_reading(head.run_id)
            return seal.open("request", invocation_id(head.run_id, head.tool_call_id), request)
        except (SealBroken, KeyErased, UnknownKey, KeyringError):
            return None

    async def renew_lease(self, run_id: str, tool_call_id: str, lease_version: int) -> int | None:
        """Renew the lease of a call in flight this writer holds (granted at ``lease_version``).

        Returns the lease's new end (ms, the server's clock), or None when the call is no
        longer this holder's: ended, gone, or taken over since.

        Raises:
            InvalidArgument: an unsafe run id or tool call id.
            StoreUnavailable: Redis failed or timed out.

        """
        keys = self._keys.invocation(run_id, tool_call_id)
        return await self._scripts.lease(
            LeaseScript.arguments(
                LeaseKeys(keys.record),
                LeaseArgv(lease_version=lease_version, lease_ms=self._lease_ms),
            )
        )

    async def take_over(self, head: Head, *, attempt: int, lapsed_at_ms: int) -> Head:
        """Take over an ungoverned call whose holder's lease lapsed (TakenOver): run it again.

        The caller then holds the call's lease and runs its tool from EXECUTING, as a first
        call does, after ``head`` (the record as read, past its lease).

        Raises:
            LeaseHeld: the holder's lease has not lapsed (it is alive).
            Refused: VERSION_CONFLICT (another took it first), ILLEGAL_TRANSITION (not in
                flight, or a governed call), RUN_INACTIVE, UNAUTHORIZED,
                RUN_DEADLINE_EXPIRED, EXECUTION_PAUSED, RUN_PAUSED.
            RecordExpired, StoreUnavailable: as for any append.

        """
        event = TakenOver(**_next_event(head), lapsed_at_ms=lapsed_at_ms, attempt=attempt)
        return await self._lapsed(head, event, None, grace_ms=0)

    async def reconcile(
        self, head: Head, settled_by: str, evidence: bytes, *, grace_ms: int = 0
    ) -> Head:
        """Take on an attempted call found to have run (Reconciled), past its lease.

        The caller then holds the call's lease and records its raw response
        (:meth:`start_projecting`) and its outcome, as a call that ran does; the tool does
        not run. ``evidence`` (UTF-8 text) is stored beside the event, its digest in it.

        Raises:
            LeaseHeld: the holder's lease, or ``grace_ms`` after it, has not passed.
            Refused: VERSION_CONFLICT (another settled it first), ILLEGAL_TRANSITION.
            RecordExpired, StoreUnavailable: as for any append.

        """
        digest = self._digest_now(head.run_id) or await self.digest_for(head.run_id)
        event = Reconciled(
            **_next_event(head),
            settled_by=settled_by,
            settlement_evidence_sha256=digest(evidence),
            settlement_evidence_bytes=len(evidence),
        )
        return await self._lapsed(head, event, evidence, grace_ms=grace_ms)

    async def settle(
        self,
        head: Head,
        error_code: ErrorCode,
        settled_by: str,
        evidence: bytes,
        *,
        grace_ms: int = 0,
    ) -> Head:
        """End a call in flight past its lease with ``error_code`` (Settled): ERROR.

        ``evidence`` (UTF-8 text) is stored beside the event, its digest in it.

        Raises:
            LeaseHeld: the holder's lease, or ``grace_ms`` after it, has not passed.
            Refused: VERSION_CONFLICT (another settled it first), ILLEGAL_TRANSITION.
            RecordExpired, StoreUnavailable: as for any append.

        """
        digest = self._digest_now(head.run_id) or await self.digest_for(head.run_id)
        event = Settled(
            **_next_event(head),
            settled_by=settled_by,
            error_code=error_code,
            settlement_evidence_sha256=digest(evidence),
            settlement_evidence_bytes=len(evidence),
        )
        return await self._lapsed(head, event, evidence, grace_ms=grace_ms)

    async def _lapsed(
        self,
        head: Head,
        event: TakenOver | Reconciled | Settled,
        evidence: bytes | None,
        *,
        grace_ms: int,
    ) -> Head:
        """Write one of the events that take a call from a holder whose lease lapsed."""
        keys = self._keys.invocation(head.run_id, head.tool_call_id)
        encoded = encode_event(event)
        hash_ = event_hash(encoded)
        kind = event_type(event)
        seal = None if evidence is None else await self._seal_of(head.run_id, evidence)
        invocation = invocation_id(head.run_id, head.tool_call_id) if seal is not None else ""
        pairs = _record_and_payload_pairs(event, kind, evidence, seal, invocation)
        if faults.ARMED:
            faults.reached(f"before:{kind}")
        committed = await self._scripts.lapsed(
            LapsedScript.arguments(
                LapsedKeys(
                    keys.record, keys.stream, keys.feed, keys.progress, keys.run, keys.control
                ),
                LapsedArgv(
                    event_type=kind,
                    version=event.version,
                    event_id=event.event_id,
                    prev_hash=event.prev_hash,
                    event_hash=hash_,
                    event=encoded,
                    at_ms=event.at_ms,
                    retention_ms=self._feed_retention_ms,
                    run_id=head.run_id,
                    tool_call_id=head.tool_call_id,
                    lease_ms=self._lease_ms,
                    grace_ms=grace_ms,
                ),
                group_args=pairs,
            )
        )
        if faults.ARMED:
            faults.reached(f"after:{kind}")
        return Head(
            run_id=head.run_id,
            tool_call_id=head.tool_call_id,
            version=committed.version,
            last_hash=hash_,
            entry_id=committed.entry_id,
            expires_at_ms=committed.expires_at_ms,
        )

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
        digest = self._digest_now(head.run_id) or await self.digest_for(head.run_id)
        event = ProjectingStarted(
            **_next_event(head),
            raw_sha256=digest(raw),
            raw_bytes=len(raw),
        )
        return await self.append(event, raw, run_id=head.run_id, tool_call_id=head.tool_call_id)

    async def send_projecting(self, head: Head, raw: bytes) -> Pending:
        """Write ProjectingStarted with the complete raw response, its answer still to come.

        The event is in the kernel's hands when this returns (Redis runs it even if this
        process dies next) or, when it could not be written out at once, already
        answered (see :meth:`~eventstore.wire.batching.ScriptBatcher.send`). Its answer is
        read with the event that follows it (:meth:`complete` or :meth:`fail` with
        ``after``), or alone (:meth:`answer`): one of them must be called.

        Raises:
            RecordExpired, Refused: it was answered here, refused.
            StoreUnavailable: Redis failed or timed out.

        """
        digest = self._digest_now(head.run_id) or await self.digest_for(head.run_id)
        event = ProjectingStarted(
            **_next_event(head),
            raw_sha256=digest(raw),
            raw_bytes=len(raw),
        )
        send = self._scripts.send
        if send is None:
            done = await self.append(event, raw, run_id=head.run_id, tool_call_id=head.tool_call_id)
            return Pending(head, done, None, done)
        seals = self._seals  # no await at all on the hot path without a keyring
        seal = (
            None
            if seals is None
            else seals.cached(head.run_id) or await seals.for_writing(head.run_id)
        )
        (keys, args), hash_ = self._prepared(head, event, raw, seal)
        if faults.ARMED:
            faults.reached("before:ProjectingStarted")
        after = Head(
            run_id=head.run_id,
            tool_call_id=head.tool_call_id,
            version=event.version,
            last_hash=hash_,
            entry_id="",
            expires_at_ms=head.expires_at_ms,
        )
        try:
            sent = await send(self._scripts.append.script, keys, args)
        except (RedisError, OSError) as exc:
            raise store_error(exc) from None
        if faults.ARMED:
            faults.reached("after:ProjectingStarted")
        return Pending(head, after, sent)

    async def complete(
        self,
        head: Head,
        result: bytes,
        evidence_status: EvidenceStatus,
        scope: str,
        *,
        after: Pending | None = None,
        raw: bytes | None = None,
    ) -> Head:
        """Store the bounded agent result and make the record READY (Completed).

        ``after``: the ProjectingStarted written ahead of its answer (``head`` is its
        ``head``); both answers are read together, its refusal raised first. ``raw``, the
        raw response the record already holds: a large result equal to it is stored once
        (the ``result`` field keeps :data:`~machine.results.SAME_AS_RAW`, which every
        reader resolves); the event's digest and size are the result's either way.
        """
        digest = self._digest_now(head.run_id) or await self.digest_for(head.run_id)
        event = Completed(
            **_next_event(head),
            result_sha256=digest(result),
            result_bytes=len(result),
            evidence_status=evidence_status,
            scope=scope,
        )
        stored = stored_result(result, raw)
        if after is not None:
            return await self._follow(after, event, stored)
        return await self.append(event, stored, run_id=head.run_id, tool_call_id=head.tool_call_id)

    async def fail(
        self,
        head: Head,
        error_code: ErrorCode,
        rejected_bytes: int | None = None,
        failure_detail: bytes | None = None,
        result: bytes | None = None,
        *,
        after: Pending | None = None,
    ) -> Head:
        """Make the record ERROR with a stable code (Failed).

        ``failure_detail`` (:mod:`machine.failure_detail`), when given, is stored in the
        record's ``failure_detail`` field in the same script call, its digest and size in
        the event. So is ``result``, the agent result the agent was shown instead of the
        code's fixed message (the tool's own error text as JSON), in the ``result`` field.
        ``after``: as for :meth:`complete`.
        """
        digest: Callable[[bytes], str] = payload_digest
        if self._seals is not None and (failure_detail is not None or result is not None):
            digest = await self.digest_for(head.run_id)
        event = Failed(
            **_next_event(head),
            error_code=error_code,
            rejected_bytes=rejected_bytes,
            failure_detail_sha256=UNSET if failure_detail is None else digest(failure_detail),
            failure_detail_bytes=UNSET if failure_detail is None else len(failure_detail),
            result_sha256=UNSET if result is None else digest(result),
            result_bytes=UNSET if result is None else len(result),
        )
        payload: bytes | dict[str, bytes] | None = failure_detail
        if result is not None:
            # Two payloads, by record field; a failure without an agent result (the usual
            # one) keeps the one-payload path.
            payload = {"result": result}
            if failure_detail is not None:
                payload["failure_detail"] = failure_detail
        if after is not None:
            return await self._follow(after, event, payload)
        return await self.append(
            event,
            payload,
            run_id=head.run_id,
            tool_call_id=head.tool_call_id,
        )
