"""What a governed call's dispatch permit costs, beside an ordinary append.

``python scripts/bench.py governed [--calls 400] [--rounds 5] [--reason-chars 40]``
starts a private ``redis-server``, records ``--calls`` governed calls waiting for
approval, approves them (an ``Approved`` append each: the ordinary script, for
comparison), then takes each one's dispatch permit (``permit.lua``: it reads the call's
journal and checks its chain with SHA-256 in Lua). It reports, per call, the Redis CPU of
each kind of script call (``INFO commandstats``: EVALSHA and EVAL, before and after) and
the wall time of one sequential call, median (min, max) over ``--rounds`` rounds. The
approvals' reason is ``--reason-chars`` long: the permit hashes every event, so a long
reason costs it more. A measurement, not a test (docs/performance.md).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import time
from datetime import timedelta
from typing import Any


def _evalsha_usec(info: dict[str, Any]) -> tuple[int, float]:
    """Script calls so far and their Redis CPU (EVALSHA, and EVAL for a first load)."""
    calls, usec = 0, 0.0
    for name in ("cmdstat_evalsha", "cmdstat_eval"):
        stat = info.get(name, {"calls": 0, "usec": 0})
        calls, usec = calls + int(stat["calls"]), usec + float(stat["usec"])
    return calls, usec


async def _round(url: str, calls: int, reason_chars: int) -> dict[str, float]:
    from redis.asyncio import Redis

    from eventstore.store import Store
    from eventstore.writer import head_of, now_ms

    namespace = "g" + secrets.token_hex(4)
    run = "run-bench"
    request = b'{"amount":125,"to":"acct-9"}'
    raw = Redis.from_url(url)
    async with Store.from_url(url, namespace=namespace) as store:
        await store.open_run(run, deadline=timedelta(minutes=30), budget=calls + 1)
        for n in range(calls):
            await store.writer.request_approval(
                run,
                f"c{n}",
                "refund",
                request,
                approval_id=secrets.token_hex(16),
                approval_expires_at_ms=now_ms() + 600_000,
                requested_by="agent",
            )
        heads = []
        for n in range(calls):
            record = await store.reader.get(run, f"c{n}")
            assert record is not None
            heads.append(head_of(record.state, record.expires_at_ms))
        reason = "r" * reason_chars
        before = _evalsha_usec(await raw.info("commandstats"))
        started = time.perf_counter()
        approved = [
            await store.writer.approve(head, "ops", reason, secrets.token_hex(16)) for head in heads
        ]
        approve_wall = time.perf_counter() - started
        middle = _evalsha_usec(await raw.info("commandstats"))
        started = time.perf_counter()
        for head in approved:
            await store.writer.dispatch(head, "refund", _digest(request))
        permit_wall = time.perf_counter() - started
        after = _evalsha_usec(await raw.info("commandstats"))
    await raw.aclose()
    # A script's first call may be answered NOSCRIPT and sent again: one more call each.
    assert calls <= middle[0] - before[0] <= calls + 1
    assert calls <= after[0] - middle[0] <= calls + 1
    return {
        "approve_redis_us": (middle[1] - before[1]) / calls,
        "permit_redis_us": (after[1] - middle[1]) / calls,
        "approve_wall_us": approve_wall / calls * 1e6,
        "permit_wall_us": permit_wall / calls * 1e6,
    }


def _digest(request: bytes) -> str:
    from machine.events import payload_digest

    return payload_digest(request)


async def _main(args: argparse.Namespace) -> None:
    from eventstore.server import EmbeddedRedis

    with EmbeddedRedis() as server:
        rounds = [
            await _round(server.url, args.calls, args.reason_chars) for _ in range(args.rounds)
        ]
    for name in rounds[0]:
        values = [measured[name] for measured in rounds]
        print(
            f"{name:18} {statistics.median(values):8.1f} us "
            f"({min(values):.1f} .. {max(values):.1f})"
        )


def main(argv: list[str] | None = None) -> int:
    """Run the measurement and print its figures; 0 when done."""
    parser = argparse.ArgumentParser(
        prog="scripts/bench.py governed", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reason-chars", type=int, default=40)
    asyncio.run(_main(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
