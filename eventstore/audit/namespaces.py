"""Which other namespaces of the server hold runs, for a read that found nothing in its own.

An operator who forgets ``--namespace`` (the demo writes to ``demo``, the default is
``canon``) is told where the runs are instead of only that there are none. No key lists a
server's namespaces: a registry would be one key outside every namespace, which a Redis
user allowed only its own namespace's keys could neither write nor read. So this is a
SCAN whose MATCH keeps only run hashes and run indexes
(:data:`~eventstore.wire.keys.RUNS_OF_ANY_NAMESPACE`), and it is bounded: at most
:data:`MAX_SCAN_CALLS` calls of :data:`SCAN_COUNT` keys each (on a cluster, shared by its
primaries), so a large keyspace makes it stop early and say so, never take long. It reads
key names only, never a key of another namespace, so an ACL user limited to its own
keys meets no denial; and it runs only when a command has already found nothing, never
on a call's path.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Final, cast

from eventstore.errors import redis_errors
from eventstore.store import Store
from eventstore.wire.keys import RUNS_OF_ANY_NAMESPACE, run_key_of_any_namespace

#: Most SCAN calls one search makes (on a cluster, over all its primaries together).
MAX_SCAN_CALLS: Final = 100
#: Keys each SCAN call examines (its COUNT hint).
SCAN_COUNT: Final = 1000


@dataclass(frozen=True, slots=True)
class OtherNamespaces:
    """What a search of the other namespaces found (each tuple sorted by name).

    Attributes:
        holding_run: namespaces that hold the run searched for.
        with_runs: namespaces that hold any run.
        complete: the whole keyspace was searched; False when the bound stopped it.
        keys_bound: about how many keys the bound lets a search examine.

    """

    holding_run: tuple[str, ...]
    with_runs: tuple[str, ...]
    complete: bool
    keys_bound: int


class _Search:
    """One bounded SCAN over a single server or every primary of a cluster."""

    def __init__(self, store: Store, max_calls: int, count: int) -> None:
        self._store = store
        self._calls_left = max_calls
        self._count = count
        self.complete = True

    async def keys(self) -> AsyncIterator[bytes]:
        """Each matching key name; ``complete`` is False afterwards if the bound stopped it."""
        cluster = self._store.cluster
        nodes: list[Any] = cluster.get_primaries() if cluster is not None else [None]
        for node in nodes:
            cursor = 0
            while True:
                if self._calls_left <= 0:
                    self.complete = False
                    return
                self._calls_left -= 1
                cursor, found = await self._scan(cursor, node)
                for key in found:
                    yield key
                if cursor == 0:
                    break

    async def _scan(self, cursor: int, node: Any) -> tuple[int, list[bytes]]:
        async with redis_errors():
            if node is None:
                next_cursor, keys = await self._store.client.scan(
                    cursor, match=RUNS_OF_ANY_NAMESPACE, count=self._count
                )
                return int(next_cursor), cast(list[bytes], keys)
            cluster = self._store.cluster
            assert cluster is not None
            # One primary at a time: its own cursor, so the budget can stop between calls.
            reply = await cluster.scan(
                cursor, match=RUNS_OF_ANY_NAMESPACE, count=self._count, target_nodes=node
            )
            # redis-py answers a cluster SCAN with each node's cursor by its name.
            cursors, found = cast(tuple[dict[str, int], list[bytes]], reply)
            return int(cursors[node.name]), found


async def other_namespaces(
    store: Store,
    run_id: str | None = None,
    *,
    max_calls: int = MAX_SCAN_CALLS,
    count: int = SCAN_COUNT,
) -> OtherNamespaces:
    """Search the server for namespaces other than ``store``'s that hold runs.

    Args:
        store: the store whose namespace is left out.
        run_id: also say which of them hold this run.
        max_calls: most SCAN calls (see the module's bound).
        count: keys each SCAN call examines.

    Raises:
        StoreUnavailable: Redis failed (AccessDenied: the user may not SCAN).

    """
    own = store.keys.namespace
    holding: set[str] = set()
    with_runs: set[str] = set()
    search = _Search(store, max_calls, count)
    async for key in search.keys():
        found = run_key_of_any_namespace(key)
        if found is None or found[0] == own:
            continue
        namespace, found_run = found
        with_runs.add(namespace)
        if run_id is not None and found_run == run_id:
            holding.add(namespace)
    return OtherNamespaces(
        holding_run=tuple(sorted(holding)),
        with_runs=tuple(sorted(with_runs)),
        complete=search.complete,
        keys_bound=max_calls * count,
    )
