"""Namespace health at a glance: records by status, feeds, consumer lag, dead letters, memory.

Records are counted by status and by stage (:mod:`machine.phases`: where a call stands,
a governed call waiting, a call left by a process that died ...); the paused runs among
the latest ones are listed with who paused them, why and since when, and the namespace's
own pause is said. Everything is read: SCAN + HMGET for the counts, the run index (a
bounded page) for the paused runs, XLEN and XINFO GROUPS per shard feed, XLEN per dead-
letter stream, INFO memory and INFO persistence for the settings this store relies on
(``noeviction``; append-only persistence; CONFIG GET when INFO lacks them) and CONFIG
GET for the cost settings. When CONFIG GET is refused (the documented read-only ACL user
may not run it, see docs/acl.md) those settings are ``unknown`` and one warning says
why; the report is still made.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Final, cast

import msgspec
import redis.exceptions

from eventstore.audit.run_index import paused_runs
from eventstore.errors import redis_errors
from eventstore.runs import RunPause
from eventstore.server.config_checks import (
    COST_SETTINGS,
    REFUSED_UNANSWERED,
    cost_settings,
    inspect_server_settings,
    server_settings_warnings,
    unreadable_settings_warning,
)
from eventstore.store import Store
from eventstore.wire.replies import reply_text
from eventstore.writer import now_ms
from machine.codes import Stage
from machine.phases import phase_of

#: Most feed entries read to estimate a group's lag on servers without XINFO ``lag`` (6.2).
LAG_SCAN_CAP: Final = 10_000
SCAN_BATCH: Final = 500
#: How many of the latest runs are looked at for the paused ones.
PAUSED_RUNS_EXAMINED: Final = 200
#: The record fields a count by status and stage reads.
_COUNTED: Final = (
    "status",
    "stage",
    "approval_id",
    "settled_by",
    "lease_until_ms",
    "updated_at_ms",
)


class GroupLag(msgspec.Struct, frozen=True, kw_only=True):
    """One consumer group (projection) on one shard feed.

    ``lag`` is the number of feed entries not yet delivered to the group; ``lag_capped``
    says it is at least that many (counted up to :data:`LAG_SCAN_CAP` on Redis 6.2).
    """

    shard: int
    group: str
    consumers: int
    pending: int
    lag: int | None
    lag_capped: bool = False


class PausedRun(msgspec.Struct, frozen=True, kw_only=True):
    """A paused run: who paused it, why and since when."""

    run_id: str
    pause: RunPause


class NamespaceStatus(msgspec.Struct, frozen=True, kw_only=True):
    """Health figures of one namespace and the server under it.

    ``server_settings`` holds the cost settings of :data:`COST_SETTINGS` by their 7.x
    names, each ``unknown`` when it could not be read. ``records_by_stage`` counts the
    records by where they stand (:class:`machine.phases.Phase`), ``paused_runs`` the
    paused runs among the latest :data:`PAUSED_RUNS_EXAMINED`, and ``execution_paused``
    says whether the whole namespace is paused.
    """

    namespace: str
    shards: int
    records_by_status: dict[str, int]
    records: int
    feed_entries: int
    groups: list[GroupLag]
    dead_letters: int
    used_memory_human: str
    maxmemory_policy: str
    appendonly: str
    server_settings: dict[str, str] = msgspec.field(default_factory=dict)
    warnings: list[str]
    records_by_stage: dict[str, int] = msgspec.field(default_factory=dict)
    paused_runs: list[PausedRun] = msgspec.field(default_factory=list)
    execution_paused: bool = False


def _shown(value: object) -> str:
    return reply_text(value, "replace")


async def _config(store: Store, name: str) -> str:
    """A setting by CONFIG GET, or ``unknown`` when CONFIG is refused."""
    try:
        reply = cast(dict[Any, Any], await store.client.config_get(name))
    except redis.exceptions.ResponseError:  # CONFIG is often disabled on managed servers
        return "unknown"
    for key, value in reply.items():
        if _shown(key) == name:
            return _shown(value)
    return "unknown"


def _stage_of(values: list[bytes | None], at_ms: int) -> str:
    """A record's phase from its :data:`_COUNTED` fields (its stage as stored if unknown)."""
    _, stage, approval, settled, lease, updated = values
    shown = _shown(stage) if stage is not None else "?"
    try:
        known = Stage(shown)
    except ValueError:
        return shown
    return phase_of(
        known,
        governed=approval is not None,
        settled=settled is not None,
        lease_until_ms=int(lease) if lease is not None and lease.isdigit() else None,
        updated_at_ms=int(updated) if updated is not None and updated.isdigit() else None,
        now_ms=at_ms,
    ).value


async def _records_by_status(store: Store) -> tuple[Counter[str], Counter[str]]:
    counts: Counter[str] = Counter()
    stages: Counter[str] = Counter()
    at_ms = now_ms()
    cursor = 0
    while True:
        cursor, found = await store.client.scan(
            cursor, match=store.keys.scan_pattern("inv"), count=SCAN_BATCH
        )
        # In the legacy layout the pattern also matches streams; keys.py tells them apart.
        records = [
            key
            for key in cast(list[bytes], found)
            if (parsed := store.keys.parse_invocation_key(key)) is not None
            and parsed.kind == "record"
        ]
        if records:
            async with store.client.pipeline(transaction=False) as pipe:
                for key in records:
                    pipe.hmget(key, list(_COUNTED))
                rows = cast(list[list[bytes | None]], await pipe.execute())
            for values in rows:
                if values[0] is not None:
                    counts[_shown(values[0])] += 1
                    stages[_stage_of(values, at_ms)] += 1
        if int(cursor) == 0:
            return counts, stages


async def _groups(store: Store, shard: int) -> list[GroupLag]:
    feed = store.keys.feed(shard)
    try:
        infos: list[dict[str, Any]] = await store.client.xinfo_groups(feed)
    except redis.exceptions.NoPermissionError:
        raise  # an ACL denial is not "no groups"
    except redis.exceptions.ResponseError:  # no feed yet: "no such key"
        return []
    groups = []
    for info in infos:
        lag, capped = info.get("lag"), False
        if lag is None:
            entries = cast(
                list[object],
                await store.client.xrange(
                    feed, f"({_shown(info['last-delivered-id'])}", "+", count=LAG_SCAN_CAP
                ),
            )
            lag, capped = len(entries), len(entries) >= LAG_SCAN_CAP
        groups.append(
            GroupLag(
                shard=shard,
                group=_shown(info["name"]),
                consumers=int(info["consumers"]),
                pending=int(info["pending"]),
                lag=int(lag),
                lag_capped=capped,
            )
        )
    return groups


def health_warnings(status: NamespaceStatus) -> list[str]:
    """Return what an operator should act on, one sentence each."""
    warnings = []
    if status.maxmemory_policy != "noeviction":
        warnings.append(
            f"maxmemory-policy is {status.maxmemory_policy}, not noeviction: "
            "Redis may evict records and event history"
        )
    if status.appendonly != "yes":
        warnings.append(
            f"appendonly is {status.appendonly}: committed events may be lost on a restart"
        )
    if status.dead_letters:
        warnings.append(f"{status.dead_letters} dead-lettered feed entries need attention")
    return warnings


async def namespace_status(store: Store) -> NamespaceStatus:
    """Collect the namespace's health figures (read-only).

    Raises:
        StoreUnavailable: Redis failed or timed out.

    """
    keys = store.keys
    async with redis_errors():
        by_status, by_stage = await _records_by_status(store)
        paused = await paused_runs(store, examine=PAUSED_RUNS_EXAMINED)
        namespace_paused = await store.client.hget(keys.control(0), "paused") == b"1"
        async with store.client.pipeline(transaction=False) as pipe:
            for shard in range(keys.shards):
                pipe.xlen(keys.feed(shard))
                pipe.xlen(keys.dead_letters(shard))
            lengths = cast(list[int], await pipe.execute())
        groups = [group for shard in range(keys.shards) for group in await _groups(store, shard)]
        # INFO first: it holds both settings, and users denied CONFIG (it can read the
        # server's passwords) may read it.
        memory: dict[str, Any] = await store.client.info("memory")
        persistence: dict[str, Any] = await store.client.info("persistence")
        policy = (
            _shown(memory["maxmemory_policy"])
            if "maxmemory_policy" in memory
            else await _config(store, "maxmemory-policy")
        )
        appendonly = (
            ("yes" if int(persistence["aof_enabled"]) else "no")
            if "aof_enabled" in persistence
            else await _config(store, "appendonly")
        )
        values, refusal = await inspect_server_settings(store.client)
    settings = cost_settings(values)
    if values is None:
        refused = refusal or REFUSED_UNANSWERED
        cost_warnings = [unreadable_settings_warning(refused, list(COST_SETTINGS))]
    else:
        cost_warnings = server_settings_warnings(values)
    status = NamespaceStatus(
        namespace=keys.namespace,
        shards=keys.shards,
        records_by_status=dict(sorted(by_status.items())),
        records=sum(by_status.values()),
        feed_entries=sum(lengths[0::2]),
        groups=groups,
        dead_letters=sum(lengths[1::2]),
        used_memory_human=_shown(memory.get("used_memory_human", "unknown")),
        maxmemory_policy=policy,
        appendonly=appendonly,
        server_settings=settings,
        warnings=[],
        records_by_stage=dict(sorted(by_stage.items())),
        paused_runs=[PausedRun(run_id=run_id, pause=pause) for run_id, pause in paused],
        execution_paused=namespace_paused,
    )
    # The eviction warning of health_warnings already covers maxmemory-policy.
    extra = [w for w in cost_warnings if not w.startswith("maxmemory-policy is")]
    return msgspec.structs.replace(status, warnings=health_warnings(status) + extra)
