"""docs/integrations.md, Microsoft Agent Framework: both blocks run as written, each as a
script in a fresh interpreter, against a scripted model endpoint, on a real store."""

from __future__ import annotations

import json
import pathlib

from eventstore import SyncStore
from machine.codes import Status
from tests.integration.integrations.test_docs_frameworks import (
    PRELUDE,
    blocks_of,
    canon_lines,
    run_as_script,
)
from tests.support.agent_tools import DOC_CALL

SECTION = "Microsoft Agent Framework"
SCRIPTED = """\
import httpx2
from openai import AsyncOpenAI
from agent_framework.openai import OpenAIChatCompletionClient
from tests.support.openai_scripted import ScriptedOpenAI, chat_completion, function_call

def openai_client(endpoint):
    http = httpx2.AsyncClient(transport=httpx2.MockTransport(endpoint.handle))
    client = AsyncOpenAI(api_key="sk-test", http_client=http, max_retries=0)
    return OpenAIChatCompletionClient(model="gpt-4.1", async_client=client)
"""
REFUND_ID = "call_R3fUnd9Xy7Tn4Bm1Cd6Wq2L"


def test_the_agent_framework_loop_runs_as_written(
    sync_store: SyncStore, redis_url: str, namespace: str, tmp_path: pathlib.Path
) -> None:
    """As a script: the agent's call goes through canon under the model's id, the model
    reads the result, and stdout holds the block's own line only (no canon log)."""
    code = blocks_of(SECTION)[0]
    assert len(canon_lines(code)) <= 3
    script = (
        PRELUDE
        + SCRIPTED
        + "endpoint = ScriptedOpenAI(\n"
        + "    chat_completion([function_call(*DOC_CALL[:2], json.dumps(DOC_CALL[2]))]),\n"
        + "    chat_completion(None, 'Refunds within 30 days.'),\n"
        + ")\n"
        + "client = openai_client(endpoint)\n"
        + code
        + "report = {'runs': search.runs, 'sent': endpoint.requests[1]['messages']}\n"
        + "json.dump(report, open(os.environ['DOC_REPORT'], 'w'))\n"
        + "store.close()\n"
    )
    stdout, report = run_as_script(script, redis_url, namespace, tmp_path)
    assert stdout == "Refunds within 30 days.\n"
    assert report["runs"] == 1
    [answer] = [m for m in report["sent"] if m["role"] == "tool"]
    assert answer["tool_call_id"] == DOC_CALL[0]
    assert json.loads(answer["content"]) == {"titles": ["refund policy"]}
    record = sync_store.get("run-1", DOC_CALL[0])
    assert record is not None and record.state.status is Status.READY


def test_the_agent_framework_governed_loop_runs_as_written(
    sync_store: SyncStore, redis_url: str, namespace: str, tmp_path: pathlib.Path
) -> None:
    """As a script: the refund ends the run with canon's approval request; while the loop
    waits, an operator approves it in canon; the next run executes it once and the model
    reads its result."""
    code = blocks_of(SECTION)[1]
    script = (
        PRELUDE
        + SCRIPTED
        + "import asyncio as real_asyncio\n"
        + "from agent_framework import Agent\n"
        + "from eventstore import Projection, SyncBoundary, ToolSpec\n"
        + "from canon.integrations.agent_framework import as_tools\n"
        + "done = []\n"
        + "def refund(arguments, call):\n"
        + "    done.append(arguments)\n"
        + "    return {'refunded': arguments['amount']}\n"
        + "TOOLS = {'refund': ToolSpec(executor=refund, read_only=False, approval=True,\n"
        + "    projector=lambda raw, call: Projection(\n"
        + "        result=raw, evidence_status='EVIDENCE_FOUND'),\n"
        + "    input_schema={'type': 'object', 'properties': {'amount': {'type': 'integer'}}})}\n"
        # The loop's wait is the operator's turn: they approve in canon, no time passes.
        + "class asyncio:\n"
        + "    run = staticmethod(real_asyncio.run)\n"
        + "    @staticmethod\n"
        + "    async def sleep(seconds):\n"
        + f"        store.decide('run-1', {REFUND_ID!r}, approve=True, by='ops', reason='ok')\n"
        + "endpoint = ScriptedOpenAI(\n"
        + f"    chat_completion([function_call({REFUND_ID!r}, 'refund', '{{\"amount\": 125}}')]),\n"
        + "    chat_completion(None, 'Refunded 125.'),\n"
        + ")\n"
        + "boundary = SyncBoundary(store, TOOLS, on_duplicate='replay')\n"
        + "agent = Agent(client=openai_client(endpoint),\n"
        + "    tools=as_tools(boundary, TOOLS, run='run-1'))\n"
        + code
        + "report = {'done': done, 'sent': endpoint.requests[-1]['messages']}\n"
        + "json.dump(report, open(os.environ['DOC_REPORT'], 'w'))\n"
        + "store.close()\n"
    )
    stdout, report = run_as_script(script, redis_url, namespace, tmp_path)
    assert stdout == "Refunded 125.\n"
    assert report["done"] == [{"amount": 125}]
    [answer] = [m for m in report["sent"] if m["role"] == "tool"]
    assert (answer["tool_call_id"], json.loads(answer["content"])) == (REFUND_ID, {"refunded": 125})
    record = sync_store.get("run-1", REFUND_ID)
    assert record is not None and record.state.status is Status.READY
