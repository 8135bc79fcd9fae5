"""How fast the operator console answers its pages on a run of 3,000 calls.

One namespace holds :data:`RUNS` runs; the last one opened has :data:`CALLS` calls, one in
:data:`FAIL_EVERY` of them failed (raising one of :data:`EXCEPTIONS` in turn, its failure
detail a traceback of about 1.5 KB, as the boundary keeps it), the others READY. Each page
an operator opens while hunting a bad call (the runs list, filtered and not, a call
search, the big run's page with its failures grouped by type, its failed calls, one type
of them, a lookup by the start of a call id, its last page, one failed call opened from
its list) is asked for ``repeats`` times in rounds, each page once per round, through the
console's ASGI app in this process: the time is the console's own work and its reads, not
a network's. The report gives each page's median and worst time in milliseconds and its
size in bytes.
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
import time
from datetime import timedelta
from typing import Any, Final

import httpx
import msgspec

from eventstore.store import Store
from machine.codes import ErrorCode, EvidenceStatus
from machine.ids import invocation_id

CALLS: Final = 3_000
RUNS: Final = 40
FAIL_EVERY: Final = 50
BIG_RUN: Final = "bench-big-run"
#: What the failed calls raise, in turn.
EXCEPTIONS: Final = ("billing.CardDeclined", "TimeoutError", "KeyError", "httpx.ReadError")
_BATCH: Final = 200
_FRAMES: Final = "".join(
    f'  File "/srv/agent/tools/billing.py", line {line}, in charge\n'
    "    response = client.post(...)\n"
    for line in range(100, 115)
)


def _detail(index: int) -> bytes:
    """The failure detail of the ``index``-th call, as the boundary keeps one."""
    kind = EXCEPTIONS[index // FAIL_EVERY % len(EXCEPTIONS)]
    message = f"call {index} failed: upstream answered 502 Bad Gateway"
    traceback = f"Traceback (most recent call last):\n{_FRAMES}{kind}: {message}\n"
    return msgspec.json.encode({"type": kind, "message": message, "traceback": traceback})


async def _call(store: Store, run: str, index: int) -> None:
    head = await store.writer.create(run, f"call-{index:05d}", "search", b'{"q":"bench"}')
    if index % FAIL_EVERY == FAIL_EVERY - 1:
        await store.writer.fail(head, ErrorCode.EXECUTION_FAILED, failure_detail=_detail(index))
        return
    head = await store.writer.start_projecting(head, b'{"rows":[1,2,3]}')
    await store.writer.complete(head, b'{"count":3}', EvidenceStatus.EVIDENCE_FOUND, "bench")


async def _populate(store: Store) -> None:
    for number in range(RUNS - 1):
        run = f"bench-run-{number:03d}"
        await store.open_run(run, deadline=timedelta(minutes=10))
        await asyncio.gather(*(_call(store, run, index) for index in range(10)))
    await store.open_run(BIG_RUN, deadline=timedelta(minutes=10))
    for start in range(0, CALLS, _BATCH):
        await asyncio.gather(*(_call(store, BIG_RUN, i) for i in range(start, start + _BATCH)))


def _pages() -> dict[str, str]:
    failed = invocation_id(BIG_RUN, f"call-{FAIL_EVERY - 1:05d}")
    kind = EXCEPTIONS[0]
    return {
        "runs": "/console/",
        "runs with errors": "/console/?status=errors",
        "search by code": "/console/search?code=EXECUTION_FAILED",
        "run page": f"/console/runs/{BIG_RUN}",
        "run, failed calls": f"/console/runs/{BIG_RUN}?status=ERROR",
        "run, one exception type": f"/console/runs/{BIG_RUN}?status=ERROR&type={kind}",
        "run, call id lookup": f"/console/runs/{BIG_RUN}?q=call-01",
        "run, last page": f"/console/runs/{BIG_RUN}?page={CALLS // 100}",
        "failed call": f"/console/runs/{BIG_RUN}/invocations/{failed}",
        "failed call, in its list": f"/console/runs/{BIG_RUN}/invocations/{failed}"
        f"?status=ERROR&type={kind}",
    }


async def measure_console(url: str, repeats: int) -> dict[str, Any]:
    """Time each console page ``repeats`` times on a fresh namespace of ``url``."""
    from projections.console import Console, OperatorAuth

    store = Store.from_url(url, namespace="console" + secrets.token_hex(4), shards=4)
    token = secrets.token_urlsafe(24)
    app = Console(store, OperatorAuth(token))
    try:
        await _populate(store)
        pages = _pages()
        times: dict[str, list[float]] = {name: [] for name in pages}
        sizes: dict[str, int] = {}
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://console.bench",
            headers={"Authorization": f"Bearer {token}"},
        ) as client:
            for path in pages.values():  # templates compiled, scripts loaded
                (await client.get(path)).raise_for_status()
            for _ in range(repeats):
                for name, path in pages.items():
                    started = time.perf_counter()
                    answer = await client.get(path)
                    times[name].append((time.perf_counter() - started) * 1000)
                    answer.raise_for_status()
                    sizes[name] = len(answer.content)
    finally:
        await store.aclose()
    return {
        "measured": True,
        "calls": CALLS,
        "runs": RUNS,
        "repeats": repeats,
        "pages": {
            name: {
                "path": pages[name],
                "median_ms": round(statistics.median(samples), 1),
                "max_ms": round(max(samples), 1),
                "bytes": sizes[name],
            }
            for name, samples in times.items()
        },
    }
