"""The invocation events: frozen, tagged msgspec Structs and their one stored encoding.

Every call has ``Preflighted``, ``ProjectingStarted``, ``Completed`` and ``Failed``; a
governed call (a side-effecting tool that needs an operator's approval) starts with
``ApprovalRequested`` instead of ``Preflighted`` and has ``Approved``, ``Denied``,
``ApprovalExpired`` and ``Dispatched`` (its one dispatch permit) before the rest, and
``ApprovalAdded`` for each approval but the last of a call that needs several.

A call whose process died while it was in flight (its lease lapsed) is ended or taken on
by one of three events, each written only once the lease has lapsed: ``TakenOver`` (a
retry of an ungoverned call runs its read-only tool again), ``Reconciled`` (a tool's
reconcile hook found that an attempted call ran: its raw response is recorded next) and
``Settled`` (the call ends ERROR with a code saying how: found not to have run, run with
its result unknown, or abandoned).

Events carry digests and UTF-8 sizes of payloads, never payload bytes; the canonical
record is the one place that holds the bytes. Each event names the hash of the event
before it, so an invocation's stream is a tamper-evident chain.

Tags are explicit and permanent: renaming a class never changes what is stored.

The Structs are the one declaration of each event's fields: which are hex, which are a
payload's digest and size, and their compact order. The compact codec, the record fields
the fold sets and every payload map (:data:`PAYLOADS_OF`, :data:`PAYLOAD_FIELDS`) are
derived from them.

Events are stored in the compact encoding of schema 2 (:mod:`machine.compact`): one
MessagePack array with every field, hex as bytes. Events of schemas 0 and 1 were JSON
objects; they are read, upcast (:mod:`machine.upcasting`) and hashed as stored, never
rewritten.
"""

from __future__ import annotations

import hashlib
import typing
from typing import Annotated, Final, NamedTuple

import msgspec
from msgspec import UNSET, UnsetType

from machine.codes import ErrorCode, EvidenceStatus
from machine.compact import ChainHash, CompactCodec, Hex, OptionalHex, is_compact
from machine.upcasting import JSONObject, upcast

#: ``prev_hash`` of the first event of every invocation.
GENESIS_HASH: Final = "0" * 64

#: Schema version written into every event of the current shape.
SCHEMA_VERSION: Final = 2


class Digest(NamedTuple):
    """Marks a field as the SHA-256 of a payload; ``payload`` is the record field of its bytes."""

    payload: str


class Size(NamedTuple):
    """Marks a field as a payload's UTF-8 size (``payload`` None: a refused, unstored one)."""

    payload: str | None


class _Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Fields every event carries."""

    event_id: Hex
    version: int
    at_ms: int
    prev_hash: ChainHash
    schema: int = SCHEMA_VERSION


# The Structs below are the one declaration of every event's fields: their names and types,
# which are payload digests and sizes (Digest, Size), which are hex (Hex; digests are),
# and, in this order, their compact order (machine.compact). New fields go last, declared
# ``T | UnsetType = UNSET`` (appended: events without them keep their bytes). The codec,
# the fold's record fields, the payload maps and the audit derive from it.


class Preflighted(_Event, frozen=True, tag="Preflighted"):
    """The call passed preflight; the record is created with the complete request."""

    run_id: str
    tool_call_id: str
    tool: str
    request_sha256: Annotated[Hex, Digest("request")]
    request_bytes: Annotated[int, Size("request")]


class ProjectingStarted(_Event, frozen=True, tag="ProjectingStarted"):
    """The executor returned; its raw response is stored complete."""

    raw_sha256: Annotated[Hex, Digest("raw")]
    raw_bytes: Annotated[int, Size("raw")]


class Completed(_Event, frozen=True, tag="Completed"):
    """The projector returned a bounded agent result; the record becomes READY."""

    result_sha256: Annotated[Hex, Digest("result")]
    result_bytes: Annotated[int, Size("result")]
    evidence_status: EvidenceStatus
    scope: str = ""


class Failed(_Event, frozen=True, tag="Failed"):
    """The invocation ended in ERROR with a stable code.

    ``rejected_bytes`` records the size of a payload refused for its size, for audit;
    the payload itself is never stored. ``failure_detail_sha256`` and
    ``failure_detail_bytes`` are the digest and size of the harness-only failure detail
    stored with the event (:mod:`machine.failure_detail`); ``UNSET`` when none was kept.
    ``result_sha256`` and ``result_bytes`` are those of the agent result stored with the
    event: the tool's own error text, bounded and scrubbed, that the agent was shown
    instead of the code's fixed message (a ``ToolSpec``'s ``error_result``); ``UNSET``
    when the agent was shown the fixed message.
    """

    error_code: ErrorCode
    rejected_bytes: Annotated[int | None, Size(None)] = None
    failure_detail_sha256: Annotated[OptionalHex, Digest("failure_detail")] = UNSET
    failure_detail_bytes: Annotated[int | UnsetType, Size("failure_detail")] = UNSET
    result_sha256: Annotated[OptionalHex, Digest("result")] = UNSET
    result_bytes: Annotated[int | UnsetType, Size("result")] = UNSET


class ApprovalRequested(_Event, frozen=True, tag="ApprovalRequested"):
    """A governed call passed preflight: its record is created, its request frozen.

    It waits for an operator's decision; the tool has not run.

    ``approval_id`` names this approval wherever it is shown; ``approval_expires_at_ms``
    is when it expires undecided (never past the record's expiry). ``supersedes`` is the
    tool call id of the call an operator edited into this one (``UNSET`` for a call the
    agent made): an edit is no approval, so this call waits for its own.

    The policy the call was requested under is frozen here too: ``requested_by`` is the
    identity that requested it (the harness's requester, else the run's own identity,
    ``run:<run id>``), who may never approve it; ``approvals_required`` how many distinct
    operators must approve it (``UNSET``: one).

    ``retry_of`` is the tool call id of a call settled as not executed that an operator,
    ``retried_by``, requested again as this one (``UNSET`` otherwise): the same tool and
    request, under the original's policy, waiting for its own approval.
    """

    run_id: str
    tool_call_id: str
    tool: str
    request_sha256: Annotated[Hex, Digest("request")]
    request_bytes: Annotated[int, Size("request")]
    approval_id: str
    approval_expires_at_ms: int
    supersedes: str | UnsetType = UNSET
    requested_by: str | UnsetType = UNSET
    approvals_required: int | UnsetType = UNSET
    retry_of: str | UnsetType = UNSET
    retried_by: str | UnsetType = UNSET


class ApprovalAdded(_Event, frozen=True, tag="ApprovalAdded"):
    """One operator's approval of a call that needs more than one: it still waits.

    A tool's policy may ask for several distinct operators (``approvals_required``);
    each approval but the last is this event, the last is :class:`Approved`.
    ``approval_count`` is how many approvals the call holds with this one.
    """

    decided_by: str
    decision_reason: str
    decision_id: str
    approval_count: int


class Approved(_Event, frozen=True, tag="Approved"):
    """An operator approved the call: it may be dispatched once, with its frozen request.

    ``decision_id`` is the decision's own id (one decision may cover several calls).
    For a call that needs several approvals this is the last one, and ``approval_count``
    how many it holds (``UNSET``: one, the only one asked for).
    """

    decided_by: str
    decision_reason: str
    decision_id: str
    approval_count: int | UnsetType = UNSET


class Denied(_Event, frozen=True, tag="Denied"):
    """An operator denied the call: it ends ERROR (APPROVAL_DENIED) and never runs.

    ``superseded_by`` is the tool call id of the edited call that replaces it, when the
    denial is an edit (``UNSET`` otherwise).
    """

    decided_by: str
    decision_reason: str
    decision_id: str
    error_code: ErrorCode
    superseded_by: str | UnsetType = UNSET


class ApprovalExpired(_Event, frozen=True, tag="ApprovalExpired"):
    """The approval expired before the call was dispatched: ERROR (APPROVAL_EXPIRED)."""

    error_code: ErrorCode


class Dispatched(_Event, frozen=True, tag="Dispatched"):
    """The one dispatch permit of an approved call: from here on it was attempted.

    ``dispatched_request_sha256`` is the digest of the request as read back from the
    record before the tool ran, checked against the approved one.
    """

    dispatched_request_sha256: Hex


class TakenOver(_Event, frozen=True, tag="TakenOver"):
    """An ungoverned call whose holder's lease lapsed, taken over by a retry of its id.

    The read-only tool runs again from here (EXECUTING), under the new holder's lease;
    the call keeps its one record and will have one outcome. ``lapsed_at_ms`` is when the
    lease it found had ended (the server's clock); ``attempt`` which run of the tool
    starts here (2 for the first takeover). A governed call is never taken over.
    """

    lapsed_at_ms: int
    attempt: int


class Reconciled(_Event, frozen=True, tag="Reconciled"):
    """An attempted call found to have run, after its process died: its outcome is taken on.

    Written by a reconciler once the call's lease lapsed: the tool's reconcile hook
    answered that the call ran (with its raw response), or the raw response was already
    recorded. The call is EXECUTING again under the reconciler's lease, which records the
    raw response (ProjectingStarted) and projects it as usual; the tool does not run.
    ``settled_by`` names who found it (``hook:<tool>``, or ``journal`` for a recorded
    raw response); the evidence text is stored beside, its digest and size here.
    """

    settled_by: str
    settlement_evidence_sha256: Annotated[Hex, Digest("settlement_evidence")]
    settlement_evidence_bytes: Annotated[int, Size("settlement_evidence")]


class Settled(_Event, frozen=True, tag="Settled"):
    """An in-flight call whose process died, ended ERROR with a code that says how.

    Written once the call's lease lapsed, by a tool's reconcile hook or an operator
    (RECONCILED_NOT_EXECUTED: it did not run; RECONCILED_EXECUTED: it ran, its result is
    not recorded) or by the sweep of abandoned ungoverned calls (ABANDONED).
    ``settled_by`` is the operator's name, ``hook:<tool>`` or ``sweep``; the evidence
    text is stored beside, its digest and size here.
    """

    settled_by: str
    error_code: ErrorCode
    settlement_evidence_sha256: Annotated[Hex, Digest("settlement_evidence")]
    settlement_evidence_bytes: Annotated[int, Size("settlement_evidence")]


Event = (
    Preflighted
    | ProjectingStarted
    | Completed
    | Failed
    | ApprovalRequested
    | ApprovalAdded
    | Approved
    | Denied
    | ApprovalExpired
    | Dispatched
    | TakenOver
    | Reconciled
    | Settled
)

#: Fields every event carries (its identity, place in the chain and schema), not its type's.
COMMON_FIELDS: Final = frozenset(_Event.__struct_fields__)
#: The event Structs in lifecycle order (the governed call's after the four of every call,
#: then those that end or take on a call whose process died).
EVENT_CLASSES: Final = (
    Preflighted,
    ProjectingStarted,
    Completed,
    Failed,
    ApprovalRequested,
    ApprovalAdded,
    Approved,
    Denied,
    ApprovalExpired,
    Dispatched,
    TakenOver,
    Reconciled,
    Settled,
)
#: The event types that create a record.
CREATING_EVENTS: Final = frozenset({"Preflighted", "ApprovalRequested"})
#: The event types written only once the call's lease has lapsed (its process is gone).
LAPSED_EVENTS: Final = frozenset({"TakenOver", "Reconciled", "Settled"})
#: Event type names (the permanent tags), in lifecycle order.
EVENT_TYPES: Final = tuple(str(event.__struct_config__.tag) for event in EVENT_CLASSES)


class PayloadFields(NamedTuple):
    """Where one payload of an event type lives: its record field, digest and size fields.

    ``rejected`` names the field holding the size of a payload refused for its size,
    never stored (``Failed`` only). A ``Failed`` event's own payloads, the failure detail
    and the agent result, are optional: their digest and size fields are ``UNSET`` when
    none was kept.
    """

    payload: str | None
    digest: str | None
    size: str | None
    rejected: str | None = None


def _payload_fields(event: type[msgspec.Struct]) -> tuple[PayloadFields, ...]:
    """Every payload ``event`` declares, in declaration order (one entry when it has none)."""
    digests: dict[str, str] = {}
    sizes: dict[str | None, str] = {}
    for name, hint in typing.get_type_hints(event, include_extras=True).items():
        for mark in getattr(hint, "__metadata__", ()):
            if isinstance(mark, Digest):
                digests[mark.payload] = name
            elif isinstance(mark, Size):
                sizes[mark.payload] = name
    assert set(digests) == set(sizes) - {None}, "every stored payload has a digest and a size"
    rejected = sizes.get(None)
    if not digests:
        return (PayloadFields(None, None, None, rejected),)
    return tuple(
        PayloadFields(payload, digest, sizes[payload], rejected)
        for payload, digest in digests.items()
    )


#: Per event type, every payload it may carry, in declaration order (a Failed event: the
#: failure detail, then the agent result).
PAYLOADS_OF: Final = {
    event.__struct_config__.tag: _payload_fields(event) for event in EVENT_CLASSES
}
#: Per event type, its first payload's record field, digest field and size field.
PAYLOAD_OF: Final = {kind: payloads[0] for kind, payloads in PAYLOADS_OF.items()}
#: Record fields holding payload bytes, in lifecycle order, with their digest and size fields.
PAYLOAD_FIELDS: Final = {
    fields.payload: (fields.digest, fields.size)
    for payloads in PAYLOADS_OF.values()
    for fields in payloads
    if fields.payload is not None and fields.digest is not None and fields.size is not None
}
# A payload two event types carry (the agent result: Completed and Failed) is one record
# field, so both must name the same digest and size fields.
assert all(
    PAYLOAD_FIELDS[fields.payload] == (fields.digest, fields.size)
    for payloads in PAYLOADS_OF.values()
    for fields in payloads
    if fields.payload is not None
), "a payload's digest and size fields are the same in every event that carries it"

_json_decoder = msgspec.json.Decoder(Event)
_codec: Final = CompactCodec(EVENT_CLASSES, genesis_hash=GENESIS_HASH, schema=SCHEMA_VERSION)
#: Per event type, its fields in compact order after the schema (see machine.compact).
COMPACT_LAYOUT: Final = _codec.layout
_compact_decoder: Final = _codec.decoder
_from_compact: Final = _codec.from_compact


def encode_event(event: Event) -> bytes:
    """Return the stored bytes of ``event``: its compact encoding (:mod:`machine.compact`)."""
    return _codec.encode(event)


def stored_document(data: bytes | str) -> JSONObject:
    """Return a stored event as a JSON object of its fields, as stored (not upcast).

    Digests, hashes and ids are given as hex strings and codes as their names, so the
    document reads the same whichever encoding the event was stored in.

    Raises:
        msgspec.DecodeError: the bytes are not an event in a known encoding.

    """
    if isinstance(data, bytes) and is_compact(data):
        return _codec.document(data, newest_schema=SCHEMA_VERSION)
    obj = msgspec.json.decode(data)
    if not isinstance(obj, dict):
        raise msgspec.ValidationError("an event must be a JSON object")
    return obj


def decode_event(data: bytes | str) -> Event:
    """Decode one stored event, upcast to the current schema; raises ``msgspec.DecodeError``.

    Compact events as writers store them, and JSON events of the current shape, take a
    typed fast path; anything else is decoded to a dict (:func:`stored_document`), upcast
    by :mod:`machine.upcasting` and converted. Hash the stored bytes, not the result.
    """
    event: Event | None
    try:
        if isinstance(data, bytes) and is_compact(data):
            wire = _compact_decoder.decode(data)
            event = _from_compact[type(wire)](wire)
        else:
            event = _json_decoder.decode(data)
            if event.schema != SCHEMA_VERSION:
                event = None
    except msgspec.ValidationError:
        event = None
    if event is not None:
        return event
    upcast_event: Event = msgspec.convert(upcast(stored_document(data), SCHEMA_VERSION), Event)
    return upcast_event


def event_type(event: Event) -> str:
    """Return the permanent tag of ``event``."""
    tag = type(event).__struct_config__.tag
    assert isinstance(tag, str)
    return tag


def event_hash(encoded: bytes) -> str:
    """Return the chain hash of one encoded event: SHA-256 hex of its stored bytes."""
    return hashlib.sha256(encoded).hexdigest()


def payload_digest(payload: bytes) -> str:
    """Return the SHA-256 hex digest of a payload's UTF-8 bytes."""
    return hashlib.sha256(payload).hexdigest()
