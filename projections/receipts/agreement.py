"""Does a record still agree with its journal? The cheap check made on every receipt read.

A full audit re-folds every event (:func:`eventstore.audit.verify_fields`). A receipt is
read far more often than it is audited, and a materialized receipt was built from the
record as it was then, so every read of one re-checks, without folding, what a record
and a journal that disagree always show:

============================ ==============================================================
reason                       what disagrees
============================ ==============================================================
``record_without_stream``    the record exists, its event stream does not
``stream_without_record``    the stream exists, its record does not
``unknown_stage``            the record's ``stage`` or ``status`` is not a stored lifecycle
                             value
``stream_length``            the stream holds more or fewer events than the record's
                             ``version`` (or more than a lifecycle can have)
``undecodable_event``        the last event does not decode
``version_mismatch``         the last event does not carry the record's ``version``
``last_hash_mismatch``       the last event's bytes do not hash to the record's ``last_hash``
``stage_mismatch``           the record's status is not its stage's, or the last event's
                             type is not the one that stage follows
``result_digest_mismatch``   the stored result (or its recorded digest or size) is not the
                             one the terminal event names: READY's ``Completed`` event, or
                             ERROR's ``Failed`` event (which names one only when the agent
                             was shown the tool's own error text, and then none may be
                             recorded without it)
``outcome_mismatch``         the record's evidence status or error code is not the one its
                             terminal event names
============================ ==============================================================

The last event and the record's ``last_hash`` pin the whole chain: a change to an earlier
event breaks the chain at the next one, which the full audit (and ``canon verify``) finds;
this check answers for the record, the stream's end and the one payload a receipt shows.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from msgspec import UNSET, UnsetType

from eventstore.reader import StoredEvent
from eventstore.sealing import is_sealed, sealed_size_matches
from machine.codes import Status
from machine.events import (
    EVENT_CLASSES,
    ApprovalExpired,
    Completed,
    Denied,
    Event,
    Failed,
    payload_digest,
)
from machine.lifecycle import STATUS_OF, TRANSITIONS
from machine.phases import MAX_JOURNAL_EVENTS

#: Events a stream may hold at most (a call's journal is bounded: see
#: :data:`machine.phases.MAX_JOURNAL_EVENTS`); a read of the stream asks for one more, so
#: a longer (tampered) stream shows as too long without being read whole.
MAX_EVENTS: Final = MAX_JOURNAL_EVENTS
STREAM_READ_COUNT: Final = MAX_EVENTS + 1

_STATUS_VALUES: Final = frozenset(status.value for status in Status)
#: The public status each stage shows (``NEW`` is never stored).
_STATUS_OF: Final = {stage.value: status.value for stage, status in STATUS_OF.items()}
_CLASS_OF: Final = {str(cls.__struct_config__.tag): cls for cls in EVENT_CLASSES}
#: The event types each stage is reached by (EXECUTING: Preflighted, or a governed call's
#: Dispatched; ERROR: Failed, Denied or ApprovalExpired).
_LAST_EVENT: Final[dict[str, tuple[type[Event], ...]]] = {
    stage.value: tuple(_CLASS_OF[kind] for (_, kind), dest in TRANSITIONS.items() if dest is stage)
    for stage in STATUS_OF
}


def _text(fields: Mapping[str, bytes], name: str) -> str | None:
    value = fields.get(name)
    return None if value is None else value.decode("utf-8", "replace")


def _result_disagreement(
    fields: Mapping[str, bytes],
    digest: str | UnsetType,
    size: int | UnsetType,
    *,
    stored_result: bool,
) -> str | None:
    """The agent result the terminal event names (``UNSET``: none) against the record's."""
    recorded = (_text(fields, "result_sha256"), _text(fields, "result_bytes"))
    result = fields.get("result")
    if isinstance(digest, UnsetType) or isinstance(size, UnsetType):
        # A Failed event that names no result: the record keeps none (the fixed message).
        if recorded != (None, None) or (stored_result and result is not None):
            return "result_digest_mismatch"
        return None
    if recorded != (digest, str(size)):
        return "result_digest_mismatch"
    if stored_result and result is not None and is_sealed(result):
        # Encrypted at rest: a receipt never opens it; its size is what can be checked.
        return None if sealed_size_matches(result, size) else "result_digest_mismatch"
    if stored_result and (
        result is None or len(result) != size or payload_digest(result) != digest
    ):
        return "result_digest_mismatch"
    return None


def _outcome_disagreement(
    fields: Mapping[str, bytes], event: Event, *, stored_result: bool
) -> str | None:
    """The terminal event's outcome against the record's, its agent result included."""
    if isinstance(event, Completed):
        if _text(fields, "evidence_status") != event.evidence_status.value:
            return "outcome_mismatch"
        return _result_disagreement(
            fields, event.result_sha256, event.result_bytes, stored_result=stored_result
        )
    if isinstance(event, Failed):
        if _text(fields, "error_code") != event.error_code.value:
            return "outcome_mismatch"
        return _result_disagreement(
            fields, event.result_sha256, event.result_bytes, stored_result=stored_result
        )
    if isinstance(event, Denied | ApprovalExpired):
        # Refused before its dispatch: the code it names, and no result.
        if _text(fields, "error_code") != event.error_code.value:
            return "outcome_mismatch"
        return _result_disagreement(fields, UNSET, UNSET, stored_result=stored_result)
    return None


def disagreement(
    fields: Mapping[str, bytes], events: Sequence[StoredEvent], *, stored_result: bool = True
) -> str | None:
    """Return the first reason the record and its journal disagree, or None when they agree.

    Args:
        fields: the record's fields (names as text; {} when the record is absent).
        events: the stream's events in order, possibly only its first
            :data:`STREAM_READ_COUNT` ([] when the stream is absent).
        stored_result: whether the stored result bytes are checked against the
            ``Completed`` event (False: only the record's recorded digest and size are),
            which tells a malformed stored result from a record that disagrees otherwise.

    """
    if not events:
        return "record_without_stream" if fields else None
    if not fields:
        return "stream_without_record"
    stage, status = _text(fields, "stage"), _text(fields, "status")
    if stage not in _LAST_EVENT or status not in _STATUS_VALUES:
        return "unknown_stage"
    if _STATUS_OF[stage] != status:
        return "stage_mismatch"
    version = _text(fields, "version")
    if len(events) > MAX_EVENTS or version != str(len(events)):
        return "stream_length"
    last = events[-1]
    if last.event is None:
        return "undecodable_event"
    if last.event.version != len(events):
        return "version_mismatch"
    if last.computed_hash != _text(fields, "last_hash"):
        return "last_hash_mismatch"
    if not isinstance(last.event, _LAST_EVENT[stage]):
        return "stage_mismatch"
    return _outcome_disagreement(fields, last.event, stored_result=stored_result)
