"""What ``canon mcp-proxy`` costs a host: 200 sequential calls of a trivial tool, three ways.

``python scripts/bench.py mcp-proxy [--calls N] [--redis-url URL] [--protocol P]`` times
``tools/call`` of ``test_simple_text`` (tests/support/mcp_everything_server.py on stdio,
so it runs from a checkout) as the SDK's client sees it, at each protocol: ``2025-11-25``
(the ``initialize`` handshake, ``ClientSession``) and ``2026-07-28`` (per-request
``_meta``, the official ``Client`` pinned to that version); ``--protocol both`` (the
default) runs each:

* direct: the host talks to the server;
* hop: through a pass-through process that forwards each line and does nothing else
  (this module's file with ``--hop``): what any stdio proxy costs, an extra process and two pipes;
* proxy: through ``canon mcp-proxy`` recording every call in Redis.

It prints the median and p95 of each, and the recording's own share (proxy minus hop).
Without ``--redis-url`` (or ``REDIS_URL``) the proxy starts its embedded Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

#: The checkout this module sits in (canon/bench/ -> the root): the timed server is there.
ROOT = Path(__file__).resolve().parents[2]
SERVER = [sys.executable, str(ROOT / "tests" / "support" / "mcp_everything_server.py")]


async def hop(command: list[str]) -> None:
    """Forward stdin to ``command`` and its stdout back, line by line, nothing else."""
    child = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=1 << 24
    )
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    assert child.stdin is not None and child.stdout is not None
    # Bound here: a closure does not keep the narrowing of the assert above.
    to_child, from_child = child.stdin, child.stdout

    async def up() -> None:
        async for line in reader:
            to_child.write(line)
            await to_child.drain()
        to_child.close()

    async def down() -> None:
        async for line in from_child:
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()

    await asyncio.gather(up(), down())
    await child.wait()


MODERN = "2026-07-28"
LEGACY = "2025-11-25"


async def time_calls(argv: list[str], calls: int, quiet: TextIO, protocol: str) -> list[float]:
    """Milliseconds of each of ``calls`` sequential tools/call, after a warm-up."""
    from mcp import ClientSession, StdioServerParameters, stdio_client

    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    parameters = StdioServerParameters(command=argv[0], args=argv[1:], env=environment)
    if protocol == MODERN:
        return await time_modern_calls(parameters, calls, quiet)
    # The servers' logs go to ``quiet`` (the null device): only the figures are printed.
    async with (
        stdio_client(parameters, errlog=quiet) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        for _ in range(20):
            await session.call_tool("test_simple_text", {})
        timings = []
        for _ in range(calls):
            started = time.perf_counter()
            result = await session.call_tool("test_simple_text", {})
            timings.append((time.perf_counter() - started) * 1000)
            assert not result.is_error
    return timings


async def time_modern_calls(parameters: object, calls: int, quiet: TextIO) -> list[float]:
    """As :func:`time_calls`, with the official ``Client`` at 2026-07-28 (no handshake)."""
    from mcp.client.client import Client
    from mcp.client.stdio import stdio_client

    async with Client(stdio_client(parameters, errlog=quiet), mode=MODERN) as client:  # type: ignore[arg-type]
        for _ in range(20):
            await client.call_tool("test_simple_text", {})
        timings = []
        for _ in range(calls):
            started = time.perf_counter()
            result = await client.call_tool("test_simple_text", {})
            timings.append((time.perf_counter() - started) * 1000)
            assert not result.is_error
    return timings


def p95(values: list[float]) -> float:
    """The 95th percentile of ``values`` (nearest rank, rounded down)."""
    return sorted(values)[max(0, int(len(values) * 0.95) - 1)]


async def bench(calls: int, redis_url: str | None, protocol: str) -> None:
    """Time the three ways at each protocol asked for and print the figures."""
    proxy = [sys.executable, "-m", "canon.cli", "mcp-proxy"]
    with tempfile.TemporaryDirectory() as data:
        proxy += [f"--redis-url={redis_url}"] if redis_url else [f"--data-dir={data}"]
        modes = {
            "direct": SERVER,
            # -P: this file's folder (canon/bench/) stays off the hop's import path.
            "hop": [sys.executable, "-P", __file__, "--hop", "--", *SERVER],
            "proxy": [*proxy, "--namespace=bench-mcp", "--", *SERVER],
        }
        for version in (LEGACY, MODERN) if protocol == "both" else (protocol,):
            medians = {}
            print(f"{calls} sequential tools/call of a trivial tool at {version} (ms)")
            for mode, argv in modes.items():
                with open(os.devnull, "w") as quiet:  # noqa: ASYNC230  (a benchmark's set-up)
                    timings = await time_calls(argv, calls, quiet, version)
                medians[mode] = statistics.median(timings)
                print(f"  {mode:<7} median {medians[mode]:6.3f}   p95 {p95(timings):6.3f}")
            hop_cost = medians["hop"] - medians["direct"]
            print(f"  hop cost (hop - direct):             {hop_cost:6.3f}")
            print(
                f"  recording's share (proxy - hop):     {medians['proxy'] - medians['hop']:6.3f}"
            )


def main(argv: list[str] | None = None) -> int:
    """Run the measurement (or, with ``--hop``, the pass-through); 0 when done."""
    parser = argparse.ArgumentParser(
        prog="scripts/bench.py mcp-proxy", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL"))
    parser.add_argument("--protocol", choices=(LEGACY, MODERN, "both"), default="both")
    parser.add_argument("--hop", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.hop:
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        asyncio.run(hop(command))
    elif not Path(SERVER[1]).is_file():
        print("scripts/bench.py mcp-proxy: runs from a checkout (it times tests/support's server)")
        return 1
    else:
        asyncio.run(bench(args.calls, args.redis_url, args.protocol))
    return 0


if __name__ == "__main__":
    sys.exit(main())
