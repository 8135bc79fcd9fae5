"""A process that dies inside the projector leaves the record holding the raw response.

ProjectingStarted is written before the projector runs and answered only with the outcome
(one wait fewer for a lone agent), so what a crash there leaves is this module's question:
Redis runs a command it received even when its client dies next, and the boundary lets the
projector start only once the raw response has left the process whole.
"""

from __future__ import annotations

import asyncio
import signal
from datetime import timedelta
from typing import Any

import msgspec
import pytest

from eventstore import Store
from eventstore.audit import verify_against_events
from machine.codes import Stage, Status
from tests.helpers import record_fields
from tests.support import projector_crash_process
from tests.support.waiting import wait_for

pytestmark = pytest.mark.backends("single")

RUN = "run-crash"


async def test_a_process_killed_in_the_projector_leaves_the_raw_response_recorded(
    store: Store, redis_url: str, namespace: str, spawn_module: Any
) -> None:
    """SIGKILL while the projector blocks the process: the record is PROJECTING with the
    complete raw response and its ProjectingStarted, and it is what its journal folds to."""
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    process = await spawn_module("tests.support.projector_crash_process", redis_url, namespace, RUN)
    line = await asyncio.wait_for(process.stdout.readline(), 30)
    assert line == b"projecting\n"

    process.send_signal(signal.SIGKILL)
    await process.wait()

    async def raw_recorded() -> bool:
        record = await store.get(RUN, "crash")
        return record is not None and record.raw is not None

    await wait_for(raw_recorded)
    record = await store.get(RUN, "crash")
    assert record is not None
    assert (record.state.status, record.state.stage) == (Status.PROJECTING, Stage.PROJECTING)
    assert msgspec.json.decode(record.raw) == projector_crash_process.RAW
    events = await store.events(RUN, "crash")
    assert [type(e.event).__name__ for e in events] == ["Preflighted", "ProjectingStarted"]
    assert verify_against_events(await record_fields(store, RUN, "crash"), events) == []
