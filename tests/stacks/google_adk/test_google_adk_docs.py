"""docs/integrations.md, Google ADK: both blocks run as written, each as a script in a
fresh interpreter, against a scripted generateContent endpoint, on a real store."""

from __future__ import annotations

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

SECTION = "Google ADK"
SCRIPTED = """\
import httpx2
from google import genai
from google.genai import types
from google.adk.models.google_llm import Gemini
from tests.stacks.google_adk.test_google_adk import MODEL, ScriptedGemini, response, turn

def gemini(endpoint):
    http = httpx2.AsyncClient(transport=httpx2.MockTransport(endpoint.handle))
    options = types.HttpOptions(httpx_async_client=http)
    return Gemini(model=MODEL, client=genai.Client(api_key="test", http_options=options))
"""
REFUND_ID = "rf8c2f1a"


def test_the_adk_loop_runs_as_written(
    sync_store: SyncStore, redis_url: str, namespace: str, tmp_path: pathlib.Path
) -> None:
    """As a script: the agent's call goes through canon under the model's id, the model
    reads the result, and stdout holds the block's own line only (no canon log)."""
    code = blocks_of(SECTION)[0]
    assert len(canon_lines(code)) <= 3
    script = (
        PRELUDE
        + SCRIPTED
        + "endpoint = ScriptedGemini(turn([DOC_CALL]),\n"
        + "    response([{'text': 'Refunds within 30 days.'}]))\n"
        + "model = gemini(endpoint)\n"
        + code
        + "report = {'runs': search.runs, 'seen': endpoint.responses()}\n"
        + "json.dump(report, open(os.environ['DOC_REPORT'], 'w'))\n"
        + "store.close()\n"
    )
    stdout, report = run_as_script(script, redis_url, namespace, tmp_path)
    assert stdout == "Refunds within 30 days.\n"
    assert report["runs"] == 1
    assert report["seen"] == {DOC_CALL[0]: {"result": {"titles": ["refund policy"]}}}
    record = sync_store.get("run-1", DOC_CALL[0])
    assert record is not None and record.state.status is Status.READY


def test_the_adk_governed_loop_runs_as_written(
    sync_store: SyncStore, redis_url: str, namespace: str, tmp_path: pathlib.Path
) -> None:
    """As a script: the refund asks for ADK's confirmation; while the loop waits, an
    operator approves it in canon; the answer runs it once and the model reads its
    result."""
    code = blocks_of(SECTION)[1]
    script = (
        PRELUDE
        + SCRIPTED
        + "import asyncio as real_asyncio\n"
        + "from google.adk.agents import LlmAgent\n"
        + "from google.adk.runners import InMemoryRunner\n"
        + "from eventstore import Projection, SyncBoundary, ToolSpec\n"
        + "from canon.integrations.google_adk import as_tools\n"
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
        + f"endpoint = ScriptedGemini(turn([({REFUND_ID!r}, 'refund', {{'amount': 125}})]),\n"
        + "    response([{'text': 'Refunded 125.'}]))\n"
        + "boundary = SyncBoundary(store, TOOLS, on_duplicate='replay')\n"
        + "agent = LlmAgent(name='support', model=gemini(endpoint),\n"
        + "    tools=as_tools(boundary, TOOLS, run='run-1'))\n"
        + "runner = InMemoryRunner(agent=agent, app_name='support')\n"
        + "session = runner.session_service.create_session_sync(app_name='support',"
        + " user_id='u-1')\n"
        + code
        + "json.dump({'done': done, 'seen': endpoint.responses()},"
        + " open(os.environ['DOC_REPORT'], 'w'))\n"
        + "store.close()\n"
    )
    stdout, report = run_as_script(script, redis_url, namespace, tmp_path)
    assert stdout == "Refunded 125.\n"
    assert report["done"] == [{"amount": 125}]
    assert report["seen"] == {REFUND_ID: {"result": {"refunded": 125}}}
    record = sync_store.get("run-1", REFUND_ID)
    assert record is not None and record.state.status is Status.READY
