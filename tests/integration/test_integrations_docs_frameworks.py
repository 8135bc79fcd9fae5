"""docs/integrations.md: the LangGraph and Pydantic AI loops run as written, against a
scripted model, on a real store."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import pathlib
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from pydantic_ai.models.function import FunctionModel

from eventstore import Projection, SyncStore, ToolCall, ToolSpec
from machine.codes import Status
from tests.support.agent_models import ScriptedModel
from tests.support.chat_models import ScriptedChatModel

DOC = pathlib.Path(__file__).parents[2] / "docs" / "integrations.md"
CALL = ("call_Rf3kQ9xZ1mN7pW2s", "search", {"q": "refund"})


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


class Search:
    """The search tool's executor, counting its runs."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, arguments: dict[str, Any], call: ToolCall) -> dict[str, Any]:
        self.runs += 1
        return {"hits": [f"{arguments['q']} policy"], "internal": "raw row 42"}


def titles(raw: Any, call: ToolCall) -> Projection:
    """The bounded result."""
    return Projection(result={"titles": raw["hits"]}, evidence_status="EVIDENCE_FOUND", scope="kb")


def run_block(code: str, names: dict[str, Any]) -> str:
    """Execute ``code`` in a plain thread (as a script runs it) and return its stdout.

    Pydantic AI's run_sync leaves the loop it made for the thread open: close it there.
    """

    def run() -> str:
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(code, str(DOC), "exec"), names)
        finally:
            with contextlib.suppress(RuntimeError):
                asyncio.get_event_loop_policy().get_event_loop().close()
            asyncio.set_event_loop(None)
        return out.getvalue()

    with ThreadPoolExecutor(1) as thread:
        return thread.submit(run).result(timeout=60)


@pytest.fixture
def store(redis_url: str, namespace: str) -> Iterator[SyncStore]:
    """A SyncStore with the docs' runs open."""
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        for run_id in ("thread-1", "run-1"):
            store.open_run(run_id, deadline=timedelta(minutes=5))
        yield store


def test_the_langgraph_loop_runs_as_written(store: SyncStore) -> None:
    """The model's tool call goes through canon and the next turn sees its ToolMessage."""
    code = block("LangGraph and LangChain")
    assert len(canon_lines(code)) <= 3
    model, search = ScriptedChatModel(calls=[CALL]), Search()
    names = {"model": model, "store": store, "SEARCH": ToolSpec(executor=search, projector=titles)}
    assert run_block(code, names) == "1 tool results\n"
    [seen] = [m for m in model.requests[-1] if isinstance(m, ToolMessage)]
    assert (seen.tool_call_id, seen.status) == (CALL[0], "success")
    assert json.loads(seen.content) == {"titles": ["refund policy"]}  # type: ignore[arg-type]
    record = store.get("thread-1", CALL[0])
    assert record is not None and record.state.status is Status.READY and search.runs == 1


def test_the_pydantic_ai_loop_runs_as_written(store: SyncStore) -> None:
    """run_sync: the call goes through canon and the model sees the tool return."""
    code = block("Pydantic AI")
    assert len(canon_lines(code)) <= 3
    script, search = ScriptedModel([CALL]), Search()
    names = {
        "model": FunctionModel(script),
        "store": store,
        "SEARCH": ToolSpec(executor=search, projector=titles),
    }
    assert run_block(code, names) == "answered\n"
    [seen] = script.returns_seen()
    assert (seen.tool_call_id, seen.outcome) == (CALL[0], "success")
    assert seen.content == {"titles": ["refund policy"]}
    record = store.get("run-1", CALL[0])
    assert record is not None and record.state.status is Status.READY and search.runs == 1
