"""Client and Redis CPU per Writer invocation on a 3-master cluster and on a single server.

``python scripts/bench.py cluster-write [--rounds 6] [--invocations 3000] [--tasks 64]
[--tree DIR ...] [--split]`` starts one private cluster and one private single server,
then takes turns (a rotating order, one fresh process per measurement) between every
tree given (default: this one; pass an older checkout, e.g. from ``git archive``, to
compare) and both backends. With ``--split``, a third backend: three plain servers (no
cluster), each with its own store, the tasks spread over them; it tells what splitting
the same load over three servers costs on this machine, cluster or not. Each
measurement opens a store (per server) in a fresh namespace with 16 runs, warms up, and
times ``--invocations`` lifecycles (create, start_projecting, complete) made by
``--tasks`` tasks: client CPU (``time.process_time``) and Redis CPU (``used_cpu_user +
used_cpu_sys`` summed over the servers) per invocation, invocations/s, and script calls
per round trip. It prints each measurement, then the median (min, max) of each. A
measurement, not a test (docs/perf-log/2026-12-cluster-pipelining.md).

Each measurement runs this module's file in a process whose import path is the tree
measured, so it imports nothing of ``canon`` (an older tree's may lack it) and no tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import pathlib
import secrets
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

#: The tree this module sits in (canon/bench/ -> the root): the default one measured.
_ROOT = pathlib.Path(__file__).resolve().parents[2]
#: The tool and payloads of every lifecycle (those of tests/helpers.py, byte for byte).
_TOOL = "lookup"
_REQUEST = b'{"q":"request-bytes"}'
_RAW = b'{"raw":"response-bytes"}'
_RESULT = b'{"result":"agent-bytes"}'


def _redis_cpu_s(ports: list[int]) -> float:
    from redis import Redis as SyncRedis

    total = 0.0
    for port in ports:
        with SyncRedis(port=port) as client:
            info: dict[str, Any] = client.info("cpu")
        total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


async def _measure(
    urls: list[str], ports: list[int], invocations: int, tasks: int
) -> dict[str, float]:
    from eventstore.store import Store
    from machine.codes import EvidenceStatus

    namespace = "b" + secrets.token_hex(4)
    stores = [Store.from_url(url, namespace=namespace) for url in urls]
    async with contextlib.AsyncExitStack() as opened:
        for store in stores:
            await opened.enter_async_context(store)
        runs = [f"run-{i}" for i in range(16)]
        for store in stores:
            for run_id in runs:
                await store.open_run(run_id, deadline=timedelta(minutes=30), tools={_TOOL: None})

        async def lifecycles(task: int, count: int, tag: str) -> None:
            writer = stores[task % len(stores)].writer  # split servers: tasks spread evenly
            for i in range(count):
                head = await writer.create(
                    runs[(task + i) % 16], f"{tag}-{task}-{i}", _TOOL, _REQUEST
                )
                head = await writer.start_projecting(head, _RAW)
                await writer.complete(head, _RESULT, EvidenceStatus.EVIDENCE_FOUND, "scope")

        await asyncio.gather(*(lifecycles(k, 300 // tasks + 1, "warm") for k in range(tasks)))
        gc.collect()
        calls = sum(store.batch_stats.calls for store in stores)
        round_trips = sum(store.batch_stats.round_trips for store in stores)
        redis_before = _redis_cpu_s(ports)
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(lifecycles(k, invocations // tasks, "m") for k in range(tasks)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        redis_s = _redis_cpu_s(ports) - redis_before
        done = invocations // tasks * tasks
        sent = sum(store.batch_stats.round_trips for store in stores) - round_trips
        calls = sum(store.batch_stats.calls for store in stores) - calls
        return {
            "client_us": cpu / done * 1e6,
            "redis_us": redis_s / done * 1e6,
            "per_s": done / wall,
            "calls_per_round_trip": calls / sent if sent else 1.0,
        }


def _measure_in(
    tree: str, urls: list[str], ports: list[int], args: argparse.Namespace
) -> dict[str, float]:
    # -P: this file's folder (canon/bench/) stays off the import path; the tree is on it.
    command = [sys.executable, "-P", str(pathlib.Path(__file__).resolve()), "--measure", *urls]
    command += ["--ports", ",".join(map(str, ports)), "--invocations", str(args.invocations)]
    command += ["--tasks", str(args.tasks)]
    out = subprocess.run(  # noqa: S603 - this interpreter and this file, no shell
        command, env={**os.environ, "PYTHONPATH": tree}, cwd=tree, capture_output=True, text=True
    )
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the comparison (or, with ``--measure URL``, one measurement); 0 when done."""
    parser = argparse.ArgumentParser(
        prog="scripts/bench.py cluster-write", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--invocations", type=int, default=3000)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--tree", action="append", help="a checkout to measure (repeatable)")
    parser.add_argument("--split", action="store_true", help="also three plain servers")
    parser.add_argument("--measure", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        ports = [int(port) for port in args.ports.split(",")]
        result = asyncio.run(_measure(args.measure, ports, args.invocations, args.tasks))
        print(json.dumps(result))
        return 0
    from canon.bench.embedded_cluster import EmbeddedCluster
    from eventstore.server.binaries import choose_redis_server
    from eventstore.server.embedded import EmbeddedRedis

    trees = args.tree or [str(_ROOT)]
    binary = choose_redis_server(minimum=(7, 0, 0))
    if binary is None:
        raise SystemExit("scripts/bench.py cluster-write: needs a Redis 7 redis-server")
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    with contextlib.ExitStack() as started:
        cluster = started.enter_context(EmbeddedCluster(binary))
        single = started.enter_context(EmbeddedRedis(binary))
        backends = {
            "cluster": ([cluster.url + "?cluster=1"], [node.port for node in cluster.nodes]),
            "single": ([single.url], [_port(single.url)]),
        }
        if args.split:
            servers = [started.enter_context(EmbeddedRedis(binary)) for _ in range(3)]
            urls = [server.url for server in servers]
            backends["split"] = (urls, [_port(url) for url in urls])
        order = [(tree, backend) for tree in trees for backend in backends]
        for round_no in range(args.rounds):
            shift = round_no % len(order)
            for tree, backend in order[shift:] + order[:shift]:
                urls, ports = backends[backend]
                result = _measure_in(tree, urls, ports, args)
                results.setdefault((tree, backend), []).append(result)
                shown = {name: round(value, 1) for name, value in result.items()}
                print(round_no, tree, backend, shown, flush=True)
    for (tree, backend), measured in results.items():
        summary = {
            name: tuple(
                round(f([m[name] for m in measured]), 1) for f in (statistics.median, min, max)
            )
            for name in measured[0]
        }
        print("median (min, max)", tree, backend, summary)
    return 0


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


if __name__ == "__main__":
    sys.exit(main())
