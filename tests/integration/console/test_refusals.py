"""The console shows what a run refused: counts on the runs list and the run page, and the
latest refusals on the run page, newest first, an unsafe id by its size only."""

from __future__ import annotations

import html
from typing import Any

import httpx
import pytest

from eventstore import RunContext, Store, ToolBoundary
from tests.support.calls import RUN, TOOL, envelope, open_run, outcome
from tests.support.console_run import OPERATOR_TOKEN, serving
from tests.support.tools import FakeTool

pytestmark = pytest.mark.backends("single", "cluster")

BEARER = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


async def test_the_run_page_lists_its_refusals_and_the_runs_list_counts_them(
    make_store: Any,
) -> None:
    """Two budget refusals and an unknown tool: the runs list says 3, the run page says 3
    with its counts per code and lists the three, newest first."""
    store: Store = make_store()
    await open_run(store, budget=1)
    boundary = ToolBoundary(store, {TOOL: FakeTool().spec()})
    assert outcome(await boundary.invoke(RunContext(RUN), envelope("ok-1"))) == "READY"
    for call in ("over-1", "over-2"):
        await boundary.invoke(RunContext(RUN), envelope(call))
    await boundary.invoke(RunContext(RUN), envelope("nope-1", tool="nope"))

    async with serving(store) as base, httpx.AsyncClient(base_url=base, headers=BEARER) as client:
        runs = html.unescape((await client.get("/console/")).text)
        assert '<td class="n">3</td>' in runs
        page = await client.get(f"/console/runs/{RUN}")
        assert page.status_code == 200
        text = html.unescape(page.text)
        assert '<span id="refused">refused 3</span>' in text
        assert "RUN_BUDGET_EXHAUSTED 2, UNKNOWN_TOOL 1" in text
        table = text.split('<table id="refusals">', 1)[1].split("</table>", 1)[0]
        assert table.index("nope-1") < table.index("over-2") < table.index("over-1")


async def test_a_run_without_refusals_shows_none(make_store: Any) -> None:
    """No refusal: the run page says refused 0 and has no refusal table."""
    store: Store = make_store()
    await open_run(store)
    await ToolBoundary(store, {TOOL: FakeTool().spec()}).invoke(RunContext(RUN), envelope("c1"))
    async with serving(store) as base, httpx.AsyncClient(base_url=base, headers=BEARER) as client:
        text = html.unescape((await client.get(f"/console/runs/{RUN}")).text)
        assert '<span id="refused">refused 0</span>' in text
        assert 'id="refusals"' not in text
