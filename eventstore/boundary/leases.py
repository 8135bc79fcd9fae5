"""Keeping the lease of the calls a boundary is running, so that no one takes them over.

A call in flight is held by a lease its writer got with the event that let it run
(Preflighted, Dispatched, TakenOver or Reconciled: :mod:`eventstore.wire.scripts`
``lease.lua``). While the boundary runs the call's tool and projector, :class:`Leases`
renews it every third of its length, so a slow tool keeps its call; once the process dies
nobody renews it and, past its end, a retry takes an ungoverned call over and a reconcile
or an operator settles a governed one.

A call that ends within a third of the lease costs no round trip: holding it is one dict
entry, kept by one timer for every call of the boundary (as :mod:`eventstore.wire.deadlines`
keeps time limits) that runs only while some call is held. A renewal that fails (Redis
unavailable) is tried again at the next tick; one that finds the call no longer this
holder's (ended, or taken over since its lease lapsed) stops and is logged.
"""

from __future__ import annotations

import asyncio
from typing import Final

from eventstore.errors import CanonError
from eventstore.logs import get_logger
from eventstore.writer import Head, Writer

log = get_logger("canon.boundary")

#: A held call: its run, its call id and the version of the event that granted its lease.
Held = tuple[str, str, int]
#: How many checks for due renewals per renewal interval.
_TICKS_PER_INTERVAL: Final = 4


class Leases:
    """The leases a boundary holds for the calls it runs: ``hold`` when it starts, ``release``.

    Args:
        writer: renews a lease (``lease.lua``).
        lease_ms: the store's lease; renewed every third of it.

    """

    def __init__(self, writer: Writer, lease_ms: int) -> None:
        self._writer = writer
        self._interval_s = lease_ms / 3000
        # Held call -> when its next renewal is due, on its loop's clock.
        self._held: dict[Held, float] = {}
        self._ticker: asyncio.TimerHandle | None = None
        self._ticker_loop: asyncio.AbstractEventLoop | None = None
        # Renewals under way, referenced until they end (the loop keeps weak ones only).
        self._renewing: set[asyncio.Task[None]] = set()

    def hold(self, head: Head) -> Held:
        """Keep the lease ``head``'s event granted while its call runs; returns the handle."""
        held = (head.run_id, head.tool_call_id, head.version)
        loop = asyncio.get_running_loop()
        self._held[held] = loop.time() + self._interval_s
        if self._ticker is None or self._ticker_loop is not loop:
            self._ticker = loop.call_later(self._interval_s / _TICKS_PER_INTERVAL, self._tick)
            self._ticker_loop = loop
        return held

    def release(self, held: Held) -> None:
        """Stop renewing: the call ended (or its holder gave it up)."""
        self._held.pop(held, None)

    def _tick(self) -> None:
        loop = self._ticker_loop
        self._ticker = None
        if not self._held or loop is None:
            return
        now = loop.time()
        for held, due in list(self._held.items()):
            if due <= now:
                self._held[held] = now + self._interval_s
                task = loop.create_task(self._renew(held))
                self._renewing.add(task)
                task.add_done_callback(self._renewing.discard)
        self._ticker = loop.call_later(self._interval_s / _TICKS_PER_INTERVAL, self._tick)

    async def _renew(self, held: Held) -> None:
        run_id, tool_call_id, version = held
        try:
            until = await self._writer.renew_lease(run_id, tool_call_id, version)
        except CanonError as exc:
            # Tried again at the next interval; past the lease a retry may take the call.
            log.warning("lease_renewal_failed", run_id=run_id, error_type=type(exc).__name__)
            return
        if until is None and held in self._held:
            del self._held[held]
            log.warning("lease_lost", run_id=run_id, lease_version=version)
