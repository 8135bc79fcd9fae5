"""Erasing a run's payloads: gone from Redis, its lifecycle, digests and chain kept.

:func:`erase_run` is the one place a run is erased. Its steps, in order:

1. read which calls the run names (its registry's ``inv:`` fields);
2. one script on the run's shard (``erase.lua``, atomic): close the run, delete the
   payload fields (request, raw response, agent result, failure detail) of every record,
   mark each record ``erased_at_ms``, leave the tombstone on the run hash
   (``erased_at_ms``, ``erased_by``, ``erased_reason``) and delete the run's wrapped data
   key (``data_key``, when payloads are encrypted at rest: :mod:`eventstore.sealing`), so
   that every copy of its payloads, in an AOF file, a backup or the archive, stays
   ciphertext nobody can open; the script refuses while a call is still running (it
   might write a payload after), and step 1 is read again when a call was created
   meanwhile.

The archive's copy is erased by its own step (``projections.archive``), which
``canon erase`` runs next.

Events are never touched: each still names its payload's digest and size, so replay and
verify judge an erased record intact, saying ``erased``; a governed call of an erased run
never runs (its frozen request is gone): it is answered ``RUN_ERASED``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final, cast

import msgspec
from redis.asyncio import Redis

from eventstore.errors import CanonError, InvalidArgument, redis_errors
from eventstore.wire.keys import Keys, registered_call_id
from eventstore.wire.lua import flat
from eventstore.wire.scripts import EraseArgv, EraseKeys, EraseScript, Scripts
from machine.events import PAYLOAD_FIELDS
from machine.ids import is_run_id

#: The record field that marks an erased record (its run's erasure time).
ERASED_FIELD: Final = "erased_at_ms"
#: The run hash fields of an erasure's tombstone.
TOMBSTONE_FIELDS: Final = ("erased_at_ms", "erased_by", "erased_reason")
#: Longest ``by`` and ``reason`` kept (characters).
MAX_BY_CHARS: Final = 200
MAX_REASON_CHARS: Final = 1000


class Erasure(msgspec.Struct, frozen=True, kw_only=True):
    """A run's tombstone: its payloads were erased by ``by`` at ``at_ms`` for ``reason``.

    ``records`` is how many records this erasure emptied (0 when read back).
    """

    run_id: str
    by: str
    at_ms: int
    reason: str
    records: int = 0


class RunNotFound(CanonError):
    """Raised when the run to erase is not in Redis (never opened, or expired)."""


class CallsInFlight(CanonError):
    """Raised when a call of the run is still running after the wait (nothing was erased)."""


def checked_text(value: str, name: str, limit: int) -> str:
    """``value`` when it is 1 to ``limit`` printable characters on one line.

    Raises:
        InvalidArgument: empty, too long, or not printable.

    """
    if not value or len(value) > limit or not value.isprintable():
        raise InvalidArgument(f"{name} must be 1 to {limit} printable characters")
    return value


def erasure_of(run_id: str, fields: dict[str, str]) -> Erasure | None:
    """The tombstone a run hash (fields as text) holds, or None."""
    at = fields.get("erased_at_ms")
    if at is None or not at.isdigit():
        return None
    return Erasure(
        run_id=run_id,
        by=fields.get("erased_by", ""),
        at_ms=int(at),
        reason=fields.get("erased_reason", ""),
    )


async def erase_run(
    client: Redis,
    keys: Keys,
    scripts: Scripts,
    run_id: str,
    *,
    by: str,
    reason: str,
    wait_s: float = 30.0,
    force: bool = False,
) -> Erasure:
    """Erase a run's payloads from Redis, atomically, leaving its tombstone.

    Args:
        client: the store's Redis client.
        keys: the namespace's key layout.
        scripts: the store's scripts.
        run_id: the run.
        by: who erases (recorded).
        reason: why (recorded).
        wait_s: how long to wait for calls still running to end.
        force: erase calls still running too (one may then write its response after).

    Raises:
        InvalidArgument: an unsafe run id, or ``by``/``reason`` empty or too long.
        RunNotFound: the run is not in Redis.
        CallsInFlight: a call was still running after ``wait_s`` (the run is closed).
        StoreUnavailable: Redis failed or timed out.

    """
    if not is_run_id(run_id):
        raise InvalidArgument("run id is not a safe id")
    by = checked_text(by, "by", MAX_BY_CHARS)
    reason = checked_text(reason, "reason", MAX_REASON_CHARS)
    at_ms = time.time_ns() // 1_000_000
    deadline = time.monotonic() + wait_s
    delay = 0.01
    while True:
        async with redis_errors():
            fields = cast(dict[bytes, bytes], await client.hgetall(keys.run(run_id)))
        calls = [
            registered_call_id(value) for name, value in fields.items() if name.startswith(b"inv:")
        ]
        reply = await scripts.erase(
            EraseScript.arguments(
                EraseKeys(run=keys.run(run_id)),
                EraseArgv(
                    by=by, reason=reason, at_ms=at_ms, calls=len(calls), force=str(int(force))
                ),
                group_keys=[keys.record(run_id, call) for call in calls],
                group_args=flat((name,) for name in PAYLOAD_FIELDS),
            )
        )
        if reply.code is None:
            return Erasure(
                run_id=run_id,
                by=by,
                at_ms=reply.erased_at_ms,
                reason=reason,
                records=reply.records,
            )
        if reply.code == "RUN_NOT_FOUND":
            raise RunNotFound(f"run {run_id} is not in Redis (never opened, or expired)")
        if reply.code == "CALLS_IN_FLIGHT" and time.monotonic() >= deadline:
            raise CallsInFlight(
                "a call of the run is still running: nothing was erased (the run is closed)"
            )
        # A call created meanwhile (read the run again), or one still running (wait).
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)
