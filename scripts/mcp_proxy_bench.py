"""What ``canon mcp-proxy`` costs a host: 200 sequential calls of a trivial tool, three ways.

``python scripts/mcp_proxy_bench.py [--calls N] [--redis-url URL]`` times ``tools/call``
of ``test_simple_text`` (tests/support/mcp_everything_server.py on stdio), as the SDK's
client sees it:

* direct: the host talks to the server;
* hop: through a pass-through process that forwards each line and does nothing else
  (this script with ``--hop``): what any stdio proxy costs, an extra process and two pipes;
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

ROOT = Path(__file__).resolve().parents[1]
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

    async def up() -> None:
        async for line in reader:
            child.stdin.write(line)
            await child.stdin.drain()
        child.stdin.close()

    async def down() -> None:
        async for line in child.stdout:
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()

    await asyncio.gather(up(), down())
    await child.wait()


async def time_calls(argv: list[str], calls: int, quiet: TextIO) -> list[float]:
    """Milliseconds of each of ``calls`` sequential tools/call, after a warm-up."""
    from mcp import ClientSession, StdioServerParameters, stdio_client

    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    parameters = StdioServerParameters(command=argv[0], args=argv[1:], env=environment)
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


def p95(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.95) - 1)]


async def bench(calls: int, redis_url: str | None) -> None:
    proxy = [sys.executable, "-m", "canon.cli", "mcp-proxy"]
    with tempfile.TemporaryDirectory() as data:
        proxy += [f"--redis-url={redis_url}"] if redis_url else [f"--data-dir={data}"]
        modes = {
            "direct": SERVER,
            "hop": [sys.executable, __file__, "--hop", "--", *SERVER],
            "proxy": [*proxy, "--namespace=bench-mcp", "--", *SERVER],
        }
        medians = {}
        print(f"{calls} sequential tools/call of a trivial tool (ms)")
        for mode, argv in modes.items():
            with open(os.devnull, "w") as quiet:  # noqa: ASYNC230  (a benchmark's set-up)
                timings = await time_calls(argv, calls, quiet)
            medians[mode] = statistics.median(timings)
            print(f"  {mode:<7} median {medians[mode]:6.3f}   p95 {p95(timings):6.3f}")
    print(f"  hop cost (hop - direct):             {medians['hop'] - medians['direct']:6.3f}")
    print(f"  recording's share (proxy - hop):     {medians['proxy'] - medians['hop']:6.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL"))
    parser.add_argument("--hop", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hop:
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        asyncio.run(hop(command))
    else:
        asyncio.run(bench(args.calls, args.redis_url))


if __name__ == "__main__":
    main()
