"""``StoreSettings``: everything a :class:`~eventstore.store.Store` is configured with.

``Store(client, settings)`` and ``Store.from_url(url, settings)`` both take one frozen
:class:`StoreSettings`; the keyword arguments they also accept (``namespace=...``,
``ttl=...``, ``limits=...``; :class:`StoreOptions`) are the fields of the settings,
applied on top of ``settings`` (or of the defaults) by :meth:`StoreSettings.with_options`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final, TypedDict, Unpack

from eventstore.errors import InvalidArgument
from eventstore.server.durability import DurabilityMode
from eventstore.wire.keys import DEFAULT_NAMESPACE, DEFAULT_SHARDS
from eventstore.wire.replication import DEFAULT_REPLICA_TIMEOUT_MS
from machine.limits import Limits
from machine.phases import DEFAULT_LEASE_MS
from machine.scrub import Scrub, scrub_secrets, scrubber

DEFAULT_TTL: Final = timedelta(days=1)
#: Feed entries are kept this long past the record TTL before age trimming removes them.
FEED_GRACE: Final = timedelta(hours=1)


def milliseconds(value: timedelta) -> int:
    """Return ``value`` in whole milliseconds."""
    return int(value.total_seconds() * 1000)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreSettings:
    """The settings of one store: its namespace, record TTL, limits and timeouts.

    Attributes:
        namespace: key namespace (a safe id of at most 32 characters).
        shards: shard count of the namespace, fixed once the namespace exists. None (the
            default): an existing namespace's recorded count, adopted on entering the
            store; :data:`~eventstore.wire.keys.DEFAULT_SHARDS` for a new one. A count
            given that differs from the recorded one is refused, never remapped.
        ttl: record TTL of new records, set once at creation, never extended.
        limits: byte limits of requests, responses, results and facts.
        timeout_s: bound of every Redis command (and of waiting for a connection).
        durability: what entering the store does about a server that could lose or
            evict records: ``warn``, ``strict`` or ``off`` (:mod:`eventstore.server.durability`).
        replicas: replicas that must have an append before it is acknowledged.
        replica_timeout_ms: longest wait for those replicas.
        read_only: a store for processes that only read (``canon serve`` without
            workers, a reader ACL user): entering it writes nothing, not even the
            namespace metadata, and runs no durability preflight (a reader commits
            nothing to lose).
        scrub: what replaces the secrets in a failed call's failure detail before it is
            stored (:mod:`machine.scrub`). As an option of ``Store``: None (the default
            scrubber), a list of regular expressions (the default plus these), or a
            callable ``str -> str`` (which replaces the default).
        refusals_kept: how many entries each run's refusal log keeps (the newest; see
            :meth:`~eventstore.store.Store.refusals`).
        lease: how long a call in flight is held by the process running it without a
            word from it (default 30 seconds). The process renews it every third of it
            while the tool runs; once it has passed, by the server's clock, the process
            is taken to be gone: a retry of an ungoverned call takes it over, a reconcile
            or an operator settles a governed one, and the sweep ends what nobody retries.

    Raises:
        InvalidArgument: ``ttl`` is not positive, ``refusals_kept`` is below 1, or
            ``lease`` is under 100 ms.

    """

    namespace: str = DEFAULT_NAMESPACE
    shards: int | None = None
    ttl: timedelta = DEFAULT_TTL
    limits: Limits = field(default_factory=Limits)
    timeout_s: float = 2.0
    durability: DurabilityMode = "warn"
    replicas: int = 0
    replica_timeout_ms: int = DEFAULT_REPLICA_TIMEOUT_MS
    read_only: bool = False
    scrub: Scrub = scrub_secrets
    refusals_kept: int = 1000
    lease: timedelta = timedelta(milliseconds=DEFAULT_LEASE_MS)

    def __post_init__(self) -> None:
        if self.ttl <= timedelta(0):
            raise InvalidArgument("ttl must be positive")
        if type(self.refusals_kept) is not int or self.refusals_kept < 1:
            raise InvalidArgument("refusals_kept must be a whole number of at least 1")
        if not isinstance(self.lease, timedelta) or self.lease < timedelta(milliseconds=100):
            raise InvalidArgument("lease must be a timedelta of at least 100 ms")

    @property
    def shard_count(self) -> int:
        """The shard count a new namespace gets (the one given, else the default)."""
        return DEFAULT_SHARDS if self.shards is None else self.shards

    @property
    def ttl_ms(self) -> int:
        """The record TTL in milliseconds."""
        return milliseconds(self.ttl)

    @property
    def lease_ms(self) -> int:
        """The lease of a call in flight, in milliseconds."""
        return milliseconds(self.lease)

    @property
    def feed_retention_ms(self) -> int:
        """How long feed entries are kept: the record TTL plus :data:`FEED_GRACE`."""
        return self.ttl_ms + milliseconds(FEED_GRACE)

    def with_options(self, **options: Unpack[StoreOptions]) -> StoreSettings:
        """Return these settings with ``options`` applied (``limits=None`` keeps the limits)."""
        changes: dict[str, Any] = dict(options)
        if changes.get("limits", self) is None:
            del changes["limits"]
        if "scrub" in changes:
            changes["scrub"] = scrubber(changes["scrub"])
        return dataclasses.replace(self, **changes) if changes else self


class StoreOptions(TypedDict, total=False):
    """The fields of :class:`StoreSettings`, as keyword arguments of ``Store``.

    ``limits`` may also be None (the default limits), as it always could; ``scrub`` a
    list of patterns or None (:func:`machine.scrub.scrubber`).
    """

    namespace: str
    shards: int | None
    ttl: timedelta
    limits: Limits | None
    timeout_s: float
    durability: DurabilityMode
    replicas: int
    replica_timeout_ms: int
    read_only: bool
    scrub: Scrub | Iterable[str] | None
    refusals_kept: int
    lease: timedelta
