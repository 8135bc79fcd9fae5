"""``canon demo --serve``: keep the embedded Redis and the console running after the demo.

The listening socket is bound before the demo starts (a port in use is one line, exit 2).
Once the tables are printed, the console serves the demo's store at the printed URL and
an operator token is printed: the configured one is never printed (``CANON_OPERATOR_TOKEN``
or ``--operator-token-file``: the operator has it), else a fresh one made for this
process. While it serves, the demo's harness waits for an operator's decision on the
refund that waits for approval (its console URL is printed), and resumes it once decided:
approved, the refund runs once and its page shows READY with who approved it and why.
SIGINT or SIGTERM stops the console, then the embedded Redis; the demo exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import socket

from rich.console import Console

from canon.command_errors import bind_errors
from canon.demo.look import Where, print_look, shown_url
from canon.demo.tools import demo_tools
from canon.operator_credentials import operator_token
from eventstore.boundary.contracts import RunContext, reply_status
from eventstore.boundary.tool_boundary import ToolBoundary
from eventstore.store import Store
from machine.codes import Stage
from machine.ids import invocation_id
from projections import create_app
from projections.console import Console as OperatorConsole
from projections.console import OperatorAuth
from projections.worker.supervisor import ReceiptServer

HOST = "127.0.0.1"
#: How often the demo's harness looks whether its waiting call was decided.
DECISION_POLL_S = 0.5


def listen(port: int) -> socket.socket:
    """Bind the console's loopback socket now, before the demo writes anything."""
    with bind_errors("--port", HOST, port):
        return socket.create_server((HOST, port), reuse_port=False)


def demo_token(args: argparse.Namespace) -> tuple[str, bool]:
    """The operator token, and whether it was made here (only then is it printed)."""
    configured = operator_token(args, dict(os.environ))
    if configured is not None:
        return configured, False
    return secrets.token_urlsafe(24), True


async def resume_when_decided(
    store: Store, run_id: str, tool_call_id: str, console: Console
) -> None:
    """The demo harness's side of a governed call: once decided, resume it (runs it once)."""
    while True:
        record = await store.get(run_id, tool_call_id)
        if record is None or record.state.stage is not Stage.AWAITING_APPROVAL:
            break
        await asyncio.sleep(DECISION_POLL_S)
    reply = await ToolBoundary(store, demo_tools()).resume(RunContext(run_id), tool_call_id)
    console.print(f"the harness resumed {tool_call_id}: {reply_status(reply)}", highlight=False)
    console.file.flush()


async def keep_serving(
    store: Store,
    where: Where,
    console: Console,
    listener: socket.socket,
    token: tuple[str, bool],
) -> None:
    """Print where to look, then serve the console until SIGINT or SIGTERM."""
    where.kept_running = True
    print_look(console, where)
    operator_console = OperatorConsole(store, OperatorAuth(token[0]))  # one operator
    server = ReceiptServer(
        create_app(store, console=operator_console, operator=operator_console.gate)
    )
    port = int(listener.getsockname()[1])
    url = f"http://{HOST}:{port}/console/"
    console.rule("the console")
    console.print(f"console: {url}", highlight=False, soft_wrap=True)
    redis_url = where.embedded_url or where.redis_url
    if redis_url:
        console.print(f"redis: {shown_url(redis_url)}", highlight=False, soft_wrap=True)
    if where.run_id:
        run_url = f"{url}runs/{where.run_id}"
        console.print(f"the first run: {run_url}", highlight=False, soft_wrap=True)
        if where.failed_call:
            failed = invocation_id(where.run_id, where.failed_call)
            console.print(
                f"its failed call: {run_url}/invocations/{failed}", highlight=False, soft_wrap=True
            )
        if where.waiting_call:
            waiting = invocation_id(where.run_id, where.waiting_call)
            console.print(
                f"a refund waiting for your approval: {run_url}/invocations/{waiting}",
                highlight=False,
                soft_wrap=True,
            )
    if token[1]:
        console.print(f"operator token: {token[0]}", highlight=False, soft_wrap=True)
    else:
        console.print("operator token: the one you configured", highlight=False)
    console.print(
        "Log in with the token, open a run, click the red bar (EXECUTION_FAILED); approve "
        "the waiting refund on its page or under Approvals. "
        "Ctrl-C (or SIGTERM) stops the console and the embedded Redis.",
        highlight=False,
    )
    console.file.flush()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, server.stop)
    harness = (
        asyncio.create_task(resume_when_decided(store, where.run_id, where.waiting_call, console))
        if where.waiting_call
        else None
    )
    try:
        await server.serve(sockets=[listener])
    finally:
        if harness is not None:
            harness.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await harness
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    console.print("console stopped", highlight=False)
