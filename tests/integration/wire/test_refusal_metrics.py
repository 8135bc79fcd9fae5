"""Prometheus counts a boundary's refusals per code (``canon_refusals_total{boundary, code}``),
as a scrape of the served ``/metrics`` reads them; calls that are not refused count nothing."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from eventstore import RunContext, Store, SyncBoundary, SyncStore, ToolBoundary
from machine.codes import PREFLIGHT_CODES, ErrorCode
from projections.metrics import Metrics, metrics_server
from tests.support.calls import RUN, TOOL, envelope, open_run, outcome
from tests.support.tools import FakeTool

pytestmark = pytest.mark.backends("single", "cluster")


async def scraped(metrics: Metrics) -> dict[tuple[str, str], float]:
    """``canon_refusals_total`` as served over HTTP: (boundary, code) -> count."""
    with metrics_server(metrics, 0) as port:
        async with httpx.AsyncClient() as client:
            text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    counts = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "canon_refusals_total":
                counts[(sample.labels["boundary"], sample.labels["code"])] = sample.value
    return counts


def boundary_of(store: Store) -> ToolBoundary:
    """A boundary with a tool that runs, one that raises and one that is not read-only."""
    return ToolBoundary(
        store,
        {
            TOOL: FakeTool().spec(),
            "broken": FakeTool(raise_in_executor=RuntimeError("down")).spec(),
            "writer": FakeTool().spec(read_only=False),
        },
    )


async def test_refusals_are_served_per_code_for_each_watched_boundary(store: Store) -> None:
    """Each refusal adds one to its code, whichever step decided it (preflight, the creation
    script's budget and duplicate checks); every preflight code is served from the start,
    at 0 until it happens."""
    await open_run(store, budget=2)
    boundary = boundary_of(store)
    metrics = Metrics()
    metrics.watch_boundary(boundary, "harness")
    assert set((await scraped(metrics)).values()) == {0.0}

    calls = [
        envelope("c1"),
        envelope("c1"),  # the same id again
        envelope("c2", tool="writer"),
        envelope("c3", tool="nowhere"),
        envelope("c4", tool="nowhere"),
        envelope("c5"),
        envelope("c6"),  # the run's budget of 2 is spent
    ]
    replies = [await boundary.invoke(RunContext(RUN), call) for call in calls]

    assert [outcome(reply) for reply in replies] == [
        "READY",
        "DUPLICATE_TOOL_CALL",
        "NOT_READ_ONLY",
        "UNKNOWN_TOOL",
        "UNKNOWN_TOOL",
        "READY",
        "RUN_BUDGET_EXHAUSTED",
    ]
    counts = await scraped(metrics)
    refused = {"DUPLICATE_TOOL_CALL": 1, "NOT_READ_ONLY": 1, "UNKNOWN_TOOL": 2}
    refused["RUN_BUDGET_EXHAUSTED"] = 1
    assert counts == {
        ("harness", code.value): float(refused.get(code.value, 0)) for code in PREFLIGHT_CODES
    }
    assert boundary.refusals[ErrorCode.UNKNOWN_TOOL] == 2


async def test_calls_that_are_not_refused_count_nothing(store: Store) -> None:
    """A READY call and a call whose tool failed (an invocation on record, no refusal) leave
    every count at 0, and no code outside the refusals ever becomes a label."""
    await open_run(store)
    boundary = boundary_of(store)
    metrics = Metrics()
    metrics.watch_boundary(boundary)

    replies = [
        await boundary.invoke(RunContext(RUN), envelope("c1")),
        await boundary.invoke(RunContext(RUN), envelope("c2", tool="broken")),
    ]

    assert [outcome(reply) for reply in replies] == ["READY", "EXECUTION_FAILED"]
    counts = await scraped(metrics)
    assert set(counts.values()) == {0.0}
    assert {code for _, code in counts} == {code.value for code in PREFLIGHT_CODES}
    assert set(boundary.refusals.values()) == {0}


async def test_a_replay_view_and_a_sync_boundary_count_into_what_is_watched(
    store: Store, redis_url: str, namespace: str
) -> None:
    """A view answering duplicates counts into its boundary's counts; a SyncBoundary serves
    its own, each under its name."""
    await open_run(store)
    boundary = boundary_of(store)
    view = boundary.answering_duplicates("replay")
    metrics = Metrics()
    metrics.watch_boundary(boundary, "async")
    await view.invoke(RunContext(RUN), envelope("c1"))
    other = await view.invoke(RunContext(RUN), envelope("c1", arguments={"q": 2}))
    assert outcome(other) == "DUPLICATE_TOOL_CALL"

    with SyncStore.from_url(redis_url, namespace=namespace) as sync_store:
        sync_boundary = SyncBoundary(sync_store, {TOOL: FakeTool().spec()})
        metrics.watch_boundary(sync_boundary, "sync")
        sync_boundary.invoke(RunContext(RUN), envelope("c9", tool="nowhere"))
        counts = await scraped(metrics)

    assert counts[("async", "DUPLICATE_TOOL_CALL")] == 1
    assert counts[("sync", "UNKNOWN_TOOL")] == 1
    assert counts[("async", "UNKNOWN_TOOL")] == counts[("sync", "DUPLICATE_TOOL_CALL")] == 0
