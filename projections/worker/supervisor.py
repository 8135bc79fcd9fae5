"""Running workers and the receipt server inside one asyncio program that owns its signals.

On SIGTERM or SIGINT every worker finishes and acknowledges the batch it holds, then
returns, so the process exits 0 with nothing of its own left half-done. uvicorn normally
installs its own handlers and re-raises the signal after shutting down; the
:class:`ReceiptServer` here leaves that to its owner (``canon serve``, a test), so workers
in the same process can settle their batches first.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator, Sequence

import uvicorn
from starlette.types import ASGIApp

from eventstore.logs import get_logger
from projections.connections import ConnectionLimits, ServedApp, guarded_protocol
from projections.worker.runtime import Worker

log = get_logger("canon.projections")

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def stop_on_signals(workers: Sequence[Worker]) -> Iterator[None]:
    """Stop ``workers`` on SIGTERM/SIGINT while the block runs (main thread only)."""
    loop = asyncio.get_running_loop()

    def stop(signum: signal.Signals) -> None:
        log.info("shutdown_requested", signal=signum.name)
        for worker in workers:
            worker.stop()

    for signum in _SIGNALS:
        loop.add_signal_handler(signum, stop, signum)
    try:
        yield
    finally:
        for signum in _SIGNALS:
            loop.remove_signal_handler(signum)


async def run_workers(
    workers: Sequence[Worker], *, burst: bool = False, handle_signals: bool = True
) -> None:
    """Run ``workers`` together until all return (``burst``) or all are stopped."""
    with stop_on_signals(workers) if handle_signals else contextlib.nullcontext():
        async with asyncio.TaskGroup() as group:
            for worker in workers:
                group.create_task(worker.run(burst=burst))


class ReceiptServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to its owner.

    Its connections are bounded by ``limits`` and every answer says ``no-store``
    (:mod:`projections.connections`).

    Stop it with :meth:`stop`; ``await server.serve()`` returns once it has shut down.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: ConnectionLimits | None = None,
    ) -> None:
        limits = limits or ConnectionLimits()
        super().__init__(
            uvicorn.Config(
                ServedApp(app),
                host=host,
                port=port,
                # Bounded connections, and no-store on the answers the HTTP layer makes
                # itself (see projections.connections).
                http=guarded_protocol(limits),
                # The access log would print request lines; a query string may hold anything.
                access_log=False,
                log_config=None,
                lifespan="off",
                server_header=False,
            )
        )

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Install nothing: the owner of the event loop handles signals."""
        yield

    def stop(self) -> None:
        """Ask the server to finish its requests and shut down."""
        self.should_exit = True

    @property
    def port(self) -> int:
        """The port actually bound (useful after asking for port 0)."""
        sockets = self.servers[0].sockets
        return int(sockets[0].getsockname()[1])
