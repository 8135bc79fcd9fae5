"""``canon runs``: a real process lists the runs newest first, pages with the printed cursor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from typing import Any

from eventstore.store import Store
from eventstore.writer import now_ms
from tests.support.waiting import wait_for


def canon_runs(redis_url: str, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "canon.cli",
            "runs",
            "--redis-url",
            redis_url,
            "--namespace",
            namespace,
            "--shards",
            "3",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COLUMNS": "80"},
    )


async def test_canon_runs_lists_and_pages(make_store: Any, redis_url: str, namespace: str) -> None:
    """Newest first with status and counts; ``--limit 2`` prints the cursor of the next
    page, which lists the rest; ``--json`` is the same page as one document."""
    store: Store = make_store(shards=3)
    for name in ("run-a", "run-b", "run-c"):
        opened = await store.open_run(name, deadline=timedelta(minutes=5), budget=4)
        # The deadline is 5 min after the open: wait a millisecond, so open times differ.
        await wait_for(lambda opened=opened: now_ms() > opened.deadline_ms - 300_000 + 1)
    await store.writer.create("run-c", "c1", "search", b"{}")
    await store.close_run("run-a")
    first = canon_runs(redis_url, namespace, "--limit", "2")
    assert first.returncode == 0, first.stderr
    out = first.stdout
    assert out.index("run-c") < out.index("run-b") and "run-a" not in out
    assert "active" in out and "1/4" in out
    cursor_line = next(line for line in out.splitlines() if "--cursor" in line)
    cursor = cursor_line.split("--cursor ", 1)[1].strip()
    second = canon_runs(redis_url, namespace, "--limit", "2", "--cursor", cursor)
    assert second.returncode == 0 and "run-a" in second.stdout and "closed" in second.stdout
    assert "--cursor" not in second.stdout
    document = json.loads(canon_runs(redis_url, namespace, "--json").stdout)
    assert [run["run_id"] for run in document["runs"]] == ["run-c", "run-b", "run-a"]
    assert document["runs"][0]["calls"] == {"PROJECTING": 1, "READY": 0, "ERROR": 0}
