"""Live runs against their archived copies: a rewrite of Redis after archiving shows.

A chain proves a record matches its journal, but someone who can write to Redis can
rewrite both consistently (the writer's documented limit). The archive kept what Redis
held when each call finished, so :func:`compare_live` reads every run still in Redis
(from the shards' run indexes) and compares each archived invocation with its live one:
the archived events must be exactly the first events of the live stream (same bytes,
so the same hashes), and a record at the archived version must hold the same fields
and payloads (a run erased on either side is compared without its payloads).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, cast

import msgspec

from eventstore.audit.readonly import read_snapshot
from eventstore.erasure import ERASED_FIELD
from eventstore.errors import redis_errors
from eventstore.store import Store
from machine.events import PAYLOAD_FIELDS
from projections.archive.store import Archive

#: Record fields that may differ between Redis and the archive without a rewrite.
_UNCOMPARED: Final = frozenset({ERASED_FIELD.encode(), *(f.encode() for f in PAYLOAD_FIELDS)})


class Mismatch(msgspec.Struct, frozen=True, kw_only=True):
    """One live invocation that differs from its archived copy, and how.

    Reasons: ``archive_mismatch:<v>`` (event ``v`` is not the archived one),
    ``archive_ahead:<v>`` (the archive holds event ``v``, Redis does not),
    ``archive_record_mismatch:<field>`` (the record at the archived version differs).
    """

    invocation_id: str
    run_id: str
    tool_call_id: str
    reason: str


class Comparison(msgspec.Struct, frozen=True, kw_only=True):
    """What comparing Redis with the archive found.

    ``compared`` invocations were in both; ``not_archived`` only in Redis (in flight, or
    the worker has not reached them yet).
    """

    runs: int
    compared: int
    not_archived: int
    mismatches: int


def _differences(live: dict[bytes, bytes], archived: dict[bytes, bytes]) -> list[str]:
    """The record fields that differ, payloads left out when either side was erased."""
    erased = ERASED_FIELD.encode() in live or ERASED_FIELD.encode() in archived
    names = (live.keys() | archived.keys()) - (_UNCOMPARED if erased else {ERASED_FIELD.encode()})
    return sorted(
        name.decode("utf-8", "replace") for name in names if live.get(name) != archived.get(name)
    )


async def compare_live(
    store: Store, archive: Archive, *, on_mismatch: Callable[[Mismatch], None] | None = None
) -> Comparison:
    """Compare every run in Redis with its archived copy; report each difference.

    Raises:
        StoreUnavailable: Redis failed or timed out.
        ArchiveUnavailable: the archive failed.

    """
    keys = store.keys
    runs = compared = not_archived = mismatches = 0
    for shard in range(keys.shards):
        async with redis_errors():
            members = cast(list[bytes], await store.client.zrange(keys.run_index(shard), 0, -1))
        for member in members:
            run_id = member.decode()
            runs += 1
            for call in await archive.tool_call_ids(run_id):
                archived = await archive.invocation(run_id, call)
                if archived is None or not keys.accepts_tool_call_id(call):
                    continue
                live = await read_snapshot(store, run_id, call)
                if not live.exists:
                    continue  # expired from Redis: nothing left to compare
                compared += 1
                reasons = []
                for position, kept in enumerate(archived.events, start=1):
                    if position > len(live.events):
                        reasons.append(f"archive_ahead:{position}")
                        break
                    if live.events[position - 1].data != kept.data:
                        reasons.append(f"archive_mismatch:{position}")
                        break
                if live.fields.get(b"version") == archived.fields.get(b"version"):
                    reasons += [
                        f"archive_record_mismatch:{name}"
                        for name in _differences(live.fields, archived.fields)
                    ]
                for reason in reasons:
                    mismatches += 1
                    if on_mismatch is not None:
                        on_mismatch(
                            Mismatch(
                                invocation_id=archived.invocation_id,
                                run_id=run_id,
                                tool_call_id=call,
                                reason=reason,
                            )
                        )
            live_calls = await _live_call_count(store, run_id)
            not_archived += max(live_calls - len(await archive.tool_call_ids(run_id)), 0)
    return Comparison(
        runs=runs, compared=compared, not_archived=not_archived, mismatches=mismatches
    )


async def _live_call_count(store: Store, run_id: str) -> int:
    """How many calls the run hash names."""
    async with redis_errors():
        fields = cast(list[bytes], await store.client.hkeys(store.keys.run(run_id)))
    return sum(1 for name in fields if name.startswith(b"inv:"))
