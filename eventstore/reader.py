"""Read-only access to canonical records and their event streams.

Only HGETALL, HGET, XRANGE and similar reads are issued: nothing here can set, extend or
refresh an expiry, so reading a record never changes when it expires.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import cast

import msgspec
from redis.asyncio import Redis

from eventstore.errors import CanonError, redis_errors
from eventstore.sealing import Seals
from eventstore.wire.keys import Keys
from machine.events import Event, decode_event, event_hash, payload_digest
from machine.fold import InvocationState, state_from_record
from machine.results import resolve_result

#: Event hashes by event bytes: a stream is hashed when read back and again when audited.
_hash_of = lru_cache(maxsize=4096)(event_hash)


class CorruptRecord(CanonError):
    """Raised when a stored record or event cannot be decoded into a valid shape."""


class InvocationRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One canonical record as stored: lifecycle state, payload bytes and expiry.

    ``raw`` is harness-only data; it must never be handed to an agent.
    """

    state: InvocationState
    invocation_id: str
    expires_at_ms: int
    request: bytes
    raw: bytes | None = None
    result: bytes | None = None
    #: When the run's payloads were erased (``request`` is then empty), else None.
    erased_at_ms: int | None = None


class StoredEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One event as read back from an invocation stream.

    Entries written before schema 2 hold the event's hash beside it (field ``h``); later
    entries hold the event only, since its hash is named by the next event's
    ``prev_hash`` and, for the last one, by the record's ``last_hash``.

    Attributes:
        entry_id: the stream entry id.
        data: the event's stored bytes (what its chain hash covers).
        stored_hash: the hash written beside the event, or the hash of ``data`` when the
            entry holds none.
        event: the decoded event, or None when the bytes do not decode.

    """

    entry_id: str
    data: bytes
    stored_hash: str
    event: Event | None

    @property
    def computed_hash(self) -> str:
        """Hash recomputed from the stored bytes."""
        return _hash_of(self.data)


def _str_fields(raw: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode("utf-8", "replace") for k, v in raw.items()}


def record_from_hash(raw: dict[bytes, bytes]) -> InvocationRecord:
    """Build an :class:`InvocationRecord` from HGETALL output.

    Raises:
        CorruptRecord: the hash does not hold a valid record.

    """
    fields = _str_fields(raw)
    erased = fields.get("erased_at_ms")
    try:
        return InvocationRecord(
            state=state_from_record(fields),
            invocation_id=fields["invocation_id"],
            expires_at_ms=int(fields["expires_at_ms"]),
            # An erased record has no payload left (eventstore.erasure).
            request=raw.get(b"request", b"") if erased is not None else raw[b"request"],
            raw=raw.get(b"raw"),
            result=resolve_result(raw.get(b"result"), raw.get(b"raw")),
            erased_at_ms=int(erased) if erased is not None else None,
        )
    except (KeyError, ValueError, msgspec.ValidationError) as exc:
        raise CorruptRecord(type(exc).__name__) from None


def stored_events(entries: list[tuple[bytes, dict[bytes, bytes]]]) -> list[StoredEvent]:
    """Turn XRANGE entries of an invocation stream into :class:`StoredEvent` values.

    An entry whose bytes do not decode keeps ``event=None``: audit tools report it instead
    of failing on it.
    """
    events: list[StoredEvent] = []
    for entry_id, fields in entries:
        data = fields.get(b"e", b"")
        try:
            event: Event | None = decode_event(data)
        except msgspec.DecodeError:
            event = None
        stored_hash = fields.get(b"h")
        events.append(
            StoredEvent(
                entry_id=entry_id.decode(),
                data=data,
                stored_hash=_hash_of(data)
                if stored_hash is None
                else stored_hash.decode("utf-8", "replace"),
                event=event,
            )
        )
    return events


class Reader:
    """Reads records and streams of one namespace.

    With ``seals`` (a keyring), :meth:`get` and :meth:`select` hand back payloads opened
    (:mod:`eventstore.sealing`); without, sealed payloads are returned as stored.
    """

    def __init__(self, client: Redis, keys: Keys, seals: Seals | None = None) -> None:
        self._client = client
        self._keys = keys
        self._seals = seals

    async def digest_of(self, run_id: str) -> Callable[[bytes], str]:
        """How a run's payload digests are taken (a keyring: keyed, else SHA-256).

        Keyed by the run's data key when this reader has a keyring and the run has one
        (:meth:`eventstore.sealing.Seals.digest_for`).

        Raises:
            UnknownKey, KeyringError: the run's data key does not open with the keyring.
            StoreUnavailable: Redis failed or timed out.

        """
        if self._seals is None:
            return payload_digest
        return await self._seals.digest_for(run_id)

    async def fields(self, run_id: str, tool_call_id: str) -> dict[bytes, bytes]:
        """Return the record's raw hash fields ({} when absent or expired)."""
        async with redis_errors():
            result = await self._client.hgetall(self._keys.record(run_id, tool_call_id))
        return cast(dict[bytes, bytes], result)

    async def select(
        self, run_id: str, tool_call_id: str, names: tuple[str, ...]
    ) -> dict[str, bytes]:
        """Return the named record fields that are set ({} when the record is absent).

        One HMGET: the large payloads that :meth:`fields` would carry stay in Redis.
        With a keyring, the payload fields named are opened.

        Raises:
            SealBroken, KeyErased, UnknownKey, KeyringError: (with a keyring) a sealed
                payload does not open.
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            values = cast(
                list[bytes | None],
                await self._client.hmget(self._keys.record(run_id, tool_call_id), names),
            )
        found = {
            name: value for name, value in zip(names, values, strict=True) if value is not None
        }
        if self._seals is not None:
            return await self._seals.open_fields(run_id, tool_call_id, found)
        return found

    async def get(self, run_id: str, tool_call_id: str) -> InvocationRecord | None:
        """Return the canonical record, or None when it is absent or expired.

        Raises:
            CorruptRecord: the stored hash is not a valid record.
            SealBroken, KeyErased, UnknownKey, KeyringError: (with a keyring) a sealed
                payload does not open.
            StoreUnavailable: Redis failed or timed out.

        """
        raw = await self.fields(run_id, tool_call_id)
        if not raw:
            return None
        if self._seals is not None:
            raw = await self._seals.open_fields(run_id, tool_call_id, raw)
        return record_from_hash(raw)

    async def events(self, run_id: str, tool_call_id: str) -> list[StoredEvent]:
        """Return the invocation's events in order ([] when the stream is absent)."""
        async with redis_errors():
            entries = cast(
                list[tuple[bytes, dict[bytes, bytes]]],
                await self._client.xrange(self._keys.stream(run_id, tool_call_id)),
            )
        return stored_events(entries)
