"""Which generation of a projection readers and workers use, and the names that follow.

A projection's output can be rebuilt from the records into a new *generation* beside the
current one (``canon rebuild``). The namespace metadata hash names the current generation
of each projection (``generation:<projection>``, 1 when absent); switching it is one
HSET, so every reader moves at once. Generation 1 keeps the plain names (group
``receipts``, keys ``receipt:``); generation N > 1 uses group ``receipts.gN`` and keys
``receipt.gN:`` (:func:`eventstore.wire.keys.generation_kind`).
"""

from __future__ import annotations

from typing import Final, Protocol, Self, cast, runtime_checkable

from eventstore.errors import InvalidArgument, redis_errors
from eventstore.store import Store

#: Metadata field naming a projection's current generation.
GENERATION_FIELD: Final = "generation:"
#: Metadata field holding the claim of a rebuild in progress (``<generation>:<token>``).
REBUILD_FIELD: Final = "rebuilding:"


@runtime_checkable
class Generational(Protocol):
    """A projection that can write any generation of its output."""

    @property
    def family(self) -> str:
        """The projection's name before any generation suffix (``receipts``)."""

    @property
    def generation(self) -> int:
        """The generation this instance writes."""

    def at_generation(self, generation: int) -> Self:
        """Return a fresh instance writing ``generation``."""


def group_name(projection: str, generation: int) -> str:
    """Return the consumer group (and position) name of ``projection`` at ``generation``."""
    if generation < 1:
        raise InvalidArgument("generation must be at least 1")
    return projection if generation == 1 else f"{projection}.g{generation}"


async def current_generation(store: Store, projection: str) -> int:
    """Return the generation of ``projection`` that readers use (1 when never rebuilt).

    Raises:
        StoreUnavailable: Redis failed or timed out.

    """
    async with redis_errors():
        value = cast(
            bytes | None, await store.client.hget(store.keys.meta(), GENERATION_FIELD + projection)
        )
    return int(value) if value is not None else 1
