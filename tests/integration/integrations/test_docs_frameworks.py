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

ROOT = pathlib.Path(__file__).parents[3]
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
        if re.search(
            r"SyncBoundary\(|as_tools\(|tool_node\(|BoundaryToolset\(|keep_call_ids\(", line
        )
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


SCRIPTED_OPENAI = """\
import httpx2
from smolagents import OpenAIServerModel
from tests.support.openai_scripted import ScriptedOpenAI, chat_completion, function_call

def openai_model(endpoint):
    http = httpx2.Client(transport=httpx2.MockTransport(endpoint.handle))
    return OpenAIServerModel(
        model_id="gpt-4.1", api_key="sk-test", client_kwargs={"http_client": http, "max_retries": 0}
    )

def final(text):
    answer = json.dumps({"answer": text})
    return chat_completion([function_call("call_F1nAl0aNsWeR9xYz", "final_answer", answer)])
"""


def blocks_of(section: str) -> list[str]:
    """Every python block of ``section`` (a level-2 heading), in order."""
    text = DOC.read_text()
    match = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match is not None, section
    return re.findall(r"```python\n(.*?)```", match.group(1), re.S)


def test_the_smolagents_loop_runs_as_written(
    store: SyncStore, redis_url: str, namespace: str, tmp_path: pathlib.Path
) -> None:
    """As a script: the ToolCallingAgent's call goes through canon under the model's id,
    the model reads the result, and stdout ends with the block's own line (before it,
    smolagents' own step panels; no canon log)."""
    code = blocks_of("smolagents")[0]
    assert len(canon_lines(code)) <= 3
    script = (
        PRELUDE
        + SCRIPTED_OPENAI
        + "endpoint = ScriptedOpenAI(\n"
        + "    chat_completion([function_call(*DOC_CALL[:2], json.dumps(DOC_CALL[2]))]),\n"
        + "    final('Refunds within 30 days.'),\n"
        + ")\n"
        + "model = openai_model(endpoint)\n"
        + code
        + "report = {'runs': search.runs, 'sent': endpoint.requests[1]['messages']}\n"
        + "json.dump(report, open(os.environ['DOC_REPORT'], 'w'))\n"
        + "store.close()\n"
    )
    stdout, report = run_as_script(script, redis_url, namespace, tmp_path)
    # smolagents draws its own steps on stdout; canon writes nothing there.
    assert stdout.endswith("\nRefunds within 30 days.\n") and "invocation_" not in stdout
    assert report["runs"] == 1
    assert '{\\"titles\\":[\\"refund policy\\"]}' in json.dumps(report["sent"])
    record = store.get("run-1", DOC_CALL[0])
    assert record is not None and record.state.status is Status.READY


def test_the_smolagents_governed_loop_runs_as_written(
    store: SyncStore, redis_url: str, namespace: str, tmp_path: pathlib.Path
) -> None:
    """As a script: the refund waits (its observation says so), an operator approves it in
    canon meanwhile, resume_waiting runs it once and the agent's next run tells the
    model."""
    code = blocks_of("smolagents")[1]
    refund_id = "call_R3fUnd9Xy7Tn4Bm1Cd6Wq2L"
    script = (
        PRELUDE
        + SCRIPTED_OPENAI
        + "from eventstore import Projection, SyncBoundary, ToolSpec\n"
        + "from canon.integrations.smolagents import as_tools, keep_call_ids\n"
        + "from smolagents import ToolCallingAgent\n"
        + "done = []\n"
        + "def refund(arguments, call):\n"
        + "    done.append(arguments)\n"
        + "    return {'refunded': arguments['amount']}\n"
        + "TOOLS = {'refund': ToolSpec(executor=refund, read_only=False, approval=True,\n"
        + "    projector=lambda raw, call: Projection(\n"
        + "        result=raw, evidence_status='EVIDENCE_FOUND'),\n"
        + "    input_schema={'type': 'object', 'properties': {'amount': {'type': 'integer'}}})}\n"
        + "class Operator(ScriptedOpenAI):\n"
        + "    def handle(self, request):\n"
        + "        if len(self.requests) == 1:  # the model read the pending payload\n"
        + f"            store.decide('run-1', {refund_id!r}, approve=True, by='ops', reason='ok')\n"
        + "        return super().handle(request)\n"
        + "endpoint = Operator(\n"
        + f"    chat_completion([function_call({refund_id!r}, 'refund', '{{\"amount\": 125}}')]),\n"
        + "    final('It waits for approval.'),\n"
        + "    final('Refunded 125.'),\n"
        + ")\n"
        + "boundary = SyncBoundary(store, TOOLS, on_duplicate='replay')\n"
        + "agent = ToolCallingAgent(tools=as_tools(boundary, TOOLS, run='run-1'),\n"
        + "    model=keep_call_ids(openai_model(endpoint)))\n"
        + code
        + "report = {'done': done, 'told': endpoint.requests[-1]['messages'][-1]}\n"
        + "json.dump(report, open(os.environ['DOC_REPORT'], 'w'))\n"
        + "store.close()\n"
    )
    stdout, report = run_as_script(script, redis_url, namespace, tmp_path)
    assert stdout.endswith("\nRefunded 125.\n") and "invocation_" not in stdout
    assert report["done"] == [{"amount": 125}]
    assert refund_id in json.dumps(report["told"]) and "refunded" in json.dumps(report["told"])
    record = store.get("run-1", refund_id)
    assert record is not None and record.state.status is Status.READY


LLAMAINDEX_PRELUDE = """\
from tests.support.llamaindex_models import ScriptedLLM
"""


def test_the_llamaindex_loop_runs_as_written(
    store: SyncStore, redis_url: str, namespace: str, tmp_path: pathlib.Path
) -> None:
    """As a script: the FunctionAgent's call goes through canon under the model's id, the
    LLM reads the result, and stdout holds the block's own line only."""
    code = blocks_of("LlamaIndex")[0]
    assert len(canon_lines(code)) <= 3
    script = (
        PRELUDE
        + LLAMAINDEX_PRELUDE
        + "scripted = ScriptedLLM([DOC_CALL], answer='Refunds within 30 days.')\n"
        + "llm = scripted.llm\n"
        + code
        + "report = {'runs': search.runs, 'seen': scripted.results_seen()}\n"
        + "json.dump(report, open(os.environ['DOC_REPORT'], 'w'))\n"
        + "store.close()\n"
    )
    stdout, report = run_as_script(script, redis_url, namespace, tmp_path)
    assert stdout == "Refunds within 30 days.\n"
    assert report["runs"] == 1
    assert json.loads(report["seen"][DOC_CALL[0]]) == {"titles": ["refund policy"]}
    record = store.get("run-1", DOC_CALL[0])
    assert record is not None and record.state.status is Status.READY


def test_the_llamaindex_governed_loop_runs_as_written(
    store: SyncStore, redis_url: str, namespace: str, tmp_path: pathlib.Path
) -> None:
    """As a script: the refund waits (ApprovalRequired), an operator approves it in canon
    meanwhile, the block's response makes it run once and the agent answers."""
    code = blocks_of("LlamaIndex")[1]
    refund_id = "toolu_01R3fUnd9Xy7Tn4Bm1Cd6Wq2"
    script = (
        PRELUDE
        + LLAMAINDEX_PRELUDE
        + "import asyncio, threading, time\n"
        + "from eventstore import Projection, SyncBoundary, ToolSpec\n"
        + "from canon.integrations.llamaindex import as_tools\n"
        + "from llama_index.core.agent.workflow import FunctionAgent\n"
        + "from machine.codes import Stage\n"
        + "done = []\n"
        + "def refund(arguments, call):\n"
        + "    done.append(arguments)\n"
        + "    return {'refunded': arguments['amount']}\n"
        + "TOOLS = {'refund': ToolSpec(executor=refund, read_only=False, approval=True,\n"
        + "    projector=lambda raw, call: Projection(\n"
        + "        result=raw, evidence_status='EVIDENCE_FOUND'),\n"
        + "    input_schema={'type': 'object', 'properties': {'amount': {'type': 'integer'}}})}\n"
        + f"scripted = ScriptedLLM([({refund_id!r}, 'refund', {{'amount': 125}})], 'Refunded.')\n"
        + "boundary = SyncBoundary(store, TOOLS, on_duplicate='replay')\n"
        + "agent = FunctionAgent(tools=as_tools(boundary, TOOLS, run='run-1'), llm=scripted.llm)\n"
        + "def operator():\n"
        + "    deadline = time.monotonic() + 30\n"
        + f"    while (r := store.get('run-1', {refund_id!r})) is None or (\n"
        + "            r.state.stage is not Stage.AWAITING_APPROVAL):\n"
        + "        assert time.monotonic() < deadline\n"
        + "        time.sleep(0.05)\n"
        + f"    store.decide('run-1', {refund_id!r}, approve=True, by='ops', reason='ok')\n"
        + "deciding = threading.Thread(target=operator)\n"
        + "deciding.start()\n"
        + code
        + "deciding.join()\n"
        + "report = {'done': done, 'seen': scripted.results_seen()}\n"
        + "json.dump(report, open(os.environ['DOC_REPORT'], 'w'))\n"
        + "store.close()\n"
    )
    stdout, report = run_as_script(script, redis_url, namespace, tmp_path)
    assert stdout == "Refunded.\n"
    assert report["done"] == [{"amount": 125}]
    assert json.loads(report["seen"][refund_id]) == {"refunded": 125}
