"""An application that runs a receipt worker in its own process, logging left untouched.

``python -m tests.support.outage_app`` starts a private Redis, runs a ``ReceiptWorker`` of
a store on it, kills the server under it, waits for the worker's outage to be logged
(``worker_read_failed``), stops the worker and exits. structlog and the stdlib's logging
are left as Python starts them, as in an application that configured nothing: the
parent checks what reached standard output (nothing) and standard error (the warning).
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from eventstore import Store
from eventstore.server import EmbeddedRedis
from projections import ReceiptWorker
from projections.worker import outage
from tests.support.waiting import wait_for


async def _reading(store: Store) -> bool:
    """Whether some client of the server waits in XREADGROUP (the worker reading)."""
    clients = await store.client.client_list()
    return any(client.get("cmd") == "xreadgroup" for client in clients)


async def main() -> None:
    """Run the worker through a Redis outage until the outage is logged."""
    logged = asyncio.Event()
    failed = outage.Outage.failed

    def noting(self: outage.Outage, error: str, **fields: Any) -> float:
        pause = failed(self, error, **fields)
        logged.set()
        return pause

    outage.Outage.failed = noting  # type: ignore[method-assign]
    with EmbeddedRedis() as server:
        async with Store.from_url(server.url, namespace="outage-app", durability="off") as store:
            worker = ReceiptWorker(store, block_ms=50)
            running = asyncio.create_task(worker.run())
            # Killed once the worker reads (blocked in XREADGROUP), not while it starts.
            await wait_for(lambda: _reading(store), 30)
            os.kill(server.pid, signal.SIGKILL)
            await asyncio.wait_for(logged.wait(), 30)
            worker.stop()
            await asyncio.wait_for(running, 30)


if __name__ == "__main__":
    asyncio.run(main())
