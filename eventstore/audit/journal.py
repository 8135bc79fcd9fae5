"""Audit one invocation: does its canonical record match the history its events tell?

The events are re-folded from nothing and the result is compared with the record, field
by field, together with the hash chain and the payload digests. The verdict is a list of
problems from a fixed vocabulary (empty when record and history agree), so replay
tooling can count and report them without ever quoting a payload or a key:

================================ =========================================================
reason                           meaning
================================ =========================================================
``record_without_stream``        the record exists, its event stream does not
``stream_without_record``        the event stream exists, its record does not
``undecodable_event:<v>``        the event at position ``v`` is not a valid event
``hash_mismatch:<v>``            the hash stored beside event ``v`` is not its bytes' hash
                                 (entries before schema 2 store one; later entries are
                                 checked by the chain and the record's ``last_hash``)
``broken_chain:<v>``             event ``v`` does not name version ``v`` and the hash of
                                 the event before it (genesis for the first)
``illegal_transition:<v>``       the lifecycle does not allow event ``v`` where it stands
``tampered_field:<name>``        the record's field differs from what the events say
``payload_digest_mismatch:<f>``  payload ``f`` (request, raw, result, failure_detail)
                                 does not have the SHA-256 and size its event recorded
================================ =========================================================

A record marked ``erased_at_ms`` (its run's payloads were erased, :mod:`eventstore.erasure`)
may lack its payloads: their events still hold the digests, and a payload that is there
is still checked. A payload encrypted at rest (:mod:`eventstore.sealing`) and read without
its key is checked by its size only; read through a keyring it is opened first (GCM
authenticates it) and checked as any other.

``<v>`` is the 1-based position of the event in its stream: the version it must carry.
Folding stops at an undecodable event or an illegal transition, and the record is then
not compared (there is no trustworthy state to compare it with).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final

import msgspec

from eventstore.reader import StoredEvent
from eventstore.sealing import is_sealed, sealed_size_matches
from machine.events import GENESIS_HASH, PAYLOAD_FIELDS, payload_digest
from machine.fold import FoldError, InvocationState, fold
from machine.ids import invocation_id
from machine.results import resolve_result

#: Record fields the events cannot vouch for: set by the store at creation, an erasure's
#: mark (eventstore.erasure), and the lease of a call in flight (who holds it, until
#: when), renewed without an event.
_UNCHECKED: Final = frozenset({"expires_at_ms", "erased_at_ms", "lease_version", "lease_until_ms"})
_NOT_FOLDED: Final = frozenset(PAYLOAD_FIELDS) | _UNCHECKED


def _is_event_id_field(name: str) -> bool:
    """Tell whether ``name`` is ``e1``, ``e2``, ... (``e`` and a number without a leading 0)."""
    digits = name[1:]
    return name[:1] == "e" and digits[:1] != "0" and digits.isascii() and digits.isdigit()


def _normalized(
    record_fields: Mapping[bytes, bytes] | Mapping[str, str] | Mapping[str, bytes],
) -> dict[str, bytes]:
    normalized: dict[str, bytes] = {}
    for name, value in record_fields.items():
        key = name.decode("utf-8", "replace") if isinstance(name, bytes) else name
        normalized[key] = value if isinstance(value, bytes) else value.encode()
    return normalized


def _as_record(state: InvocationState) -> dict[str, bytes]:
    """The record fields a state is stored as: strings of ints and enum values."""
    fields = msgspec.to_builtins(state)
    assert isinstance(fields, dict)
    return {name: str(value).encode() for name, value in fields.items() if value is not None}


def _refold(stored_events: Sequence[StoredEvent]) -> tuple[list[str], InvocationState | None]:
    """Check the chain and fold; return the problems and the state (None if folding stopped)."""
    problems: list[str] = []
    state: InvocationState | None = None
    folding = True
    prev_hash = GENESIS_HASH
    for position, stored in enumerate(stored_events, start=1):
        computed = stored.computed_hash
        if stored.stored_hash != computed:
            problems.append(f"hash_mismatch:{position}")
        event = stored.event
        if event is None:
            problems.append(f"undecodable_event:{position}")
            folding = False
        else:
            if event.version != position or event.prev_hash != prev_hash:
                problems.append(f"broken_chain:{position}")
            if folding:
                # The broken link is reported above; relinking lets the fold go on judging
                # the transitions and the record instead of stopping at the first gap.
                version = state.version + 1 if state else 1
                last_hash = state.last_hash if state else GENESIS_HASH
                linked = (
                    event
                    if (event.version, event.prev_hash) == (version, last_hash)
                    else msgspec.structs.replace(event, version=version, prev_hash=last_hash)
                )
                try:
                    state = fold(state, linked, computed)
                except FoldError:
                    problems.append(f"illegal_transition:{position}")
                    folding = False
        prev_hash = computed
    return problems, state if folding else None


def _compare_record(
    record: Mapping[str, bytes],
    state: InvocationState,
    stored_events: Sequence[StoredEvent],
    digest_of: Callable[[bytes], str],
) -> list[str]:
    expected = _as_record(state)
    expected["invocation_id"] = invocation_id(state.run_id, state.tool_call_id).encode()
    for position, stored in enumerate(stored_events, start=1):
        if stored.event is not None:
            expected[f"e{position}"] = stored.event.event_id.encode()
    if _agrees(record, expected):
        problems: list[str] = []
    else:
        problems = _tampered_fields(record, expected)
    erased = "erased_at_ms" in record
    for field, (digest_name, size_name) in PAYLOAD_FIELDS.items():
        digest, size = getattr(state, digest_name), getattr(state, size_name)
        payload = record.get(field)
        if field == "result":
            # A result stored once, as the raw response, is checked as the result it is.
            payload = resolve_result(payload, record.get("raw"))
        if payload is None and erased:
            sound = True  # erased: the event keeps the digest of the bytes that were there
        elif payload is not None and digest is not None and is_sealed(payload):
            # Encrypted at rest, read without the key: only its size can be checked here
            # (GCM authenticates the bytes whenever a keyring opens them).
            sound = sealed_size_matches(payload, size)
        elif payload is None or digest is None:
            sound = payload is None and digest is None
        else:
            sound = (digest_of(payload), len(payload)) == (digest, size)
        if not sound:
            problems.append(f"payload_digest_mismatch:{field}")
    return problems


def _agrees(record: Mapping[str, bytes], expected: dict[str, bytes]) -> bool:
    """Whether every field but the payloads and the expiry is exactly as expected."""
    if any(name not in expected for name in record.keys() - _NOT_FOLDED):
        return False
    return all(record.get(name) == value for name, value in expected.items())


def _tampered_fields(record: Mapping[str, bytes], expected: dict[str, bytes]) -> list[str]:
    """One ``tampered_field`` reason per differing field: state, ids, events, then others."""
    names = [*InvocationState.__struct_fields__, "invocation_id"]
    names += sorted(
        {name for name in (*record, *expected) if _is_event_id_field(name)},
        key=lambda name: int(name[1:]),
    )
    known = set(names) | set(PAYLOAD_FIELDS) | _UNCHECKED
    names += sorted(name for name in record if name not in known)
    return [f"tampered_field:{n}" for n in names if record.get(n) != expected.get(n)]


def verify_against_events(
    record_fields: Mapping[bytes, bytes] | Mapping[str, str] | Mapping[str, bytes],
    stored_events: Sequence[StoredEvent],
    digest_of: Callable[[bytes], str] = payload_digest,
) -> list[str]:
    """Re-fold an invocation's stored events and list where the record disagrees.

    Args:
        record_fields: the record hash as HGETALL returns it ({} when absent), or its
            fields with names decoded.
        stored_events: the invocation's stream in order (:meth:`Reader.events`); read it
            in the same MULTI as the record, or with no writer active, to audit one instant.
        digest_of: how the run's payload digests are taken (SHA-256; keyed, for payloads
            encrypted at rest and opened: :meth:`eventstore.reader.Reader.digest_of`).

    Returns:
        Problem reasons from the vocabulary in the module docstring, in the order found;
        empty when the record is exactly what its events fold to.

    """
    return verify_fields(_normalized(record_fields), stored_events, digest_of)


def verify_fields(
    record: Mapping[str, bytes],
    stored_events: Sequence[StoredEvent],
    digest_of: Callable[[bytes], str] = payload_digest,
) -> list[str]:
    """:func:`verify_against_events` for a record whose field names are already text."""
    if not stored_events:
        return ["record_without_stream"] if record else []
    if not record:
        return ["stream_without_record"]
    problems, state = _refold(stored_events)
    if state is not None:
        problems += _compare_record(record, state, stored_events, digest_of)
    return problems
