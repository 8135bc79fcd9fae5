"""A ``canon workers`` process whose Redis goes away and comes back: while it is gone the
workers back off (a few log lines, not one per half second), and once it is back each
worker says so once and goes on reading."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

#: How long Redis stays down (the old retry loop logged about 6 lines per worker in it).
OUTAGE_S = 4.0
#: Longest wait for any expected log line: a backstop only (the backoff's cap is 5 s; a
#: loaded machine restarts the server and reconnects much slower than an idle one).
LINE_WAIT_S = 60.0
PROJECTIONS = {"receipts", "progress"}
UNAVAILABLE = {"worker_read_failed", "worker_still_unavailable"}


def events(log_path: Path) -> list[dict[str, Any]]:
    """The JSON log lines written so far (a line being written is left for the next look)."""
    found = []
    for line in log_path.read_text().splitlines():
        try:
            found.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return found


def wait_for_each(log_path: Path, event: str, process: Any) -> list[dict[str, Any]]:
    """Wait until both projections logged ``event``; fail after LINE_WAIT_S."""
    deadline = time.monotonic() + LINE_WAIT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, log_path.read_text()[-2000:]
        seen = [e for e in events(log_path) if e.get("event") == event]
        if {e.get("projection") for e in seen} >= PROJECTIONS:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"no {event} from both workers: {log_path.read_text()[-2000:]}")


def test_workers_back_off_while_redis_is_down_and_log_their_recovery(
    newest_server: Any, spawn_workers: Any, namespace: str
) -> None:
    """Four seconds without Redis cost at most two 'unavailable' lines per worker (the old
    loop wrote one every 0.65 s); after the restart each worker logs redis_recovered."""
    server = newest_server()
    process, log_path = spawn_workers(
        f"--redis-url={server.url}", f"--namespace={namespace}", "--block-ms=100"
    )
    wait_for_each(log_path, "worker_started", process)

    server.kill()
    wait_for_each(log_path, "worker_read_failed", process)
    # The outage is timed from when both workers have seen it, not from the kill: on a
    # loaded machine the first failed read can come seconds after the kill, and each
    # worker's down_s counts from its own first failure.
    down_at = time.monotonic()
    while time.monotonic() - down_at < OUTAGE_S:  # the outage is a span of time
        assert process.poll() is None
        time.sleep(0.1)
    during = [e for e in events(log_path) if e.get("event") in UNAVAILABLE]
    server.start()

    recovered = wait_for_each(log_path, "redis_recovered", process)
    for projection in PROJECTIONS:
        lines = [e for e in during if e["projection"] == projection]
        assert 1 <= len(lines) <= 2, lines
    assert all(e["level"] == "info" and e["failures"] >= 2 for e in recovered), recovered
    assert all(e["down_s"] >= OUTAGE_S for e in recovered), recovered
    text = log_path.read_text()
    assert "Traceback" not in text and server.url not in text
