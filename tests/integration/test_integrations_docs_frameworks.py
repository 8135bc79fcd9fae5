"""docs/integrations.md: the LangGraph and Pydantic AI loops run as written, each as a
script in a fresh interpreter, against a scripted model, on a real store."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from eventstore import SyncStore
from machine.codes import Status
from tests.support.agent_tools import DOC_CALL

ROOT = pathlib.Path(__file__).parents[2]
DOC = ROOT / "docs" / "integrations.md"


def block(section: str) -> str:
    """The first python block of ``section`` (a level-2 heading) in the document."""
    match = re.search(
        rf"^## {re.escape(section)}\n(.*?)```python\n(.*?)```", DOC.read_text(), re.S | re.M
    )
    assert match is not None, section
    return match.group(2)


def canon_lines(code: str) -> list[str]:
    """The block's statements that name canon (imports aside)."""
    return [
        line
        for line in code.splitlines()
        if re.search(r"SyncBoundary\(|as_tools\(|tool_node\(|BoundaryToolset\(", line)
    ]


PRELUDE = """\
import json, os
from eventstore import SyncStore
from tests.support.agent_tools import DOC_CALL, CountingSearch, titles
store = SyncStore.from_url(os.environ["DOC_REDIS_URL"], namespace=os.environ["DOC_NAMESPACE"])
search = CountingSearch()
"""


def run_as_script(code: str, redis_url: str, namespace: str, tmp_path: pathlib.Path) -> Any:
    """Run the doc's block in a fresh interpreter after a prelude that builds what it takes
    (``model``, ``store``, the tool's ``search`` and ``titles``) and an epilogue that
    reports what the model saw.

    Returns the script's stdout and the report.
    """
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
        env={
            **os.environ,
            "DOC_REDIS_URL": redis_url,
            "DOC_NAMESPACE": namespace,
            "DOC_REPORT": str(report),
        },
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, json.loads(report.read_text())


@pytest.fixture
def store(redis_url: str, namespace: str) -> Iterator[SyncStore]:
    """A SyncStore with the docs' runs open."""
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        for run_id in ("thread-1", "run-1"):
            store.open_run(run_id, deadline=timedelta(minutes=5))
        yield store


def test_the_langgraph_loop_runs_as_written(
    store: SyncStore, redis_url: str, namespace: str, tmp_path: pathlib.Path
) -> None:
    """As a script: the model's tool call goes through canon, the next turn sees its
    ToolMessage, and stdout holds the block's own line only."""
    code = block("LangGraph and LangChain")
    assert len(canon_lines(code)) <= 3
    script = (
        PRELUDE
        + "from tests.support.chat_models import ScriptedChatModel\n"
        + "model = ScriptedChatModel(calls=[DOC_CALL])\n"
        + code
        + "seen = [(m.tool_call_id, m.status, m.content) for m in model.tool_results_seen()]\n"
        + "report = {'seen': seen, 'runs': search.runs, 'bound': model.bound}\n"
        + "json.dump(report, open(os.environ['DOC_REPORT'], 'w'))\n"
        + "store.close()\n"
    )
    stdout, report = run_as_script(script, redis_url, namespace, tmp_path)
    assert stdout == "1 tool results\n"
    [(call_id, status, content)] = report["seen"]
    assert (call_id, status) == (DOC_CALL[0], "success")
    assert json.loads(content) == {"titles": ["refund policy"]}
    assert report["runs"] == 1
    [bound] = report["bound"]
    assert bound["function"]["description"] == "Search the knowledge base."
    assert bound["function"]["parameters"]["required"] == ["q"]
    record = store.get("thread-1", DOC_CALL[0])
    assert record is not None and record.state.status is Status.READY


def test_the_pydantic_ai_loop_runs_as_written(
    store: SyncStore, redis_url: str, namespace: str, tmp_path: pathlib.Path
) -> None:
    """As a script, with run_sync: the call goes through canon and the model sees the
    tool return; stdout holds the block's own line only."""
    code = block("Pydantic AI")
    assert len(canon_lines(code)) <= 3
    script = (
        PRELUDE
        + "from pydantic_ai.models.function import FunctionModel\n"
        + "from tests.support.agent_models import ScriptedModel\n"
        + "scripted = ScriptedModel([DOC_CALL])\n"
        + "model = FunctionModel(scripted)\n"
        + code
        + "seen = [(p.tool_call_id, p.outcome, p.content) for p in scripted.returns_seen()]\n"
        + "json.dump({'seen': seen, 'runs': search.runs}, open(os.environ['DOC_REPORT'], 'w'))\n"
        + "store.close()\n"
    )
    stdout, report = run_as_script(script, redis_url, namespace, tmp_path)
    assert stdout == "answered\n"
    [(call_id, outcome, content)] = report["seen"]
    assert (call_id, outcome, content) == (DOC_CALL[0], "success", {"titles": ["refund policy"]})
    assert report["runs"] == 1
    record = store.get("run-1", DOC_CALL[0])
    assert record is not None and record.state.status is Status.READY
