"""docs/integrations.md, CrewAI: both blocks run as written, each as a script in a fresh
interpreter, against a scripted Chat Completions endpoint, on a real store."""

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

SECTION = "CrewAI"
SCRIPTED = """\
import os
for name, value in (("CREWAI_DISABLE_TELEMETRY", "true"), ("CREWAI_TRACING_ENABLED", "false"),
                    ("OTEL_SDK_DISABLED", "true")):
    os.environ[name] = value
from tests.stacks.crewai.test_crewai import ScriptedChat, llm_of, turn
from tests.support.openai_scripted import chat_completion
"""
REFUND_ID = "call_R3fUnd9Xy7Tn4Bm1Cd6Wq2L"


def test_the_crewai_loop_runs_as_written(
    sync_store: SyncStore, redis_url: str, namespace: str, tmp_path: pathlib.Path
) -> None:
    """As a script: the agent's call goes through canon under the model's id, the model
    reads the result, and stdout ends with the block's own line (no canon log)."""
    code = blocks_of(SECTION)[0]
    assert len(canon_lines(code)) <= 3
    script = (
        PRELUDE
        + SCRIPTED
        + "endpoint = ScriptedChat(turn([DOC_CALL]),\n"
        + "    chat_completion(None, 'Refunds within 30 days.'))\n"
        + "llm = llm_of(endpoint)\n"
        + code
        + "report = {'runs': search.runs, 'seen': endpoint.tool_messages()}\n"
        + "json.dump(report, open(os.environ['DOC_REPORT'], 'w'))\n"
        + "store.close()\n"
    )
    stdout, report = run_as_script(script, redis_url, namespace, tmp_path)
    assert stdout.endswith("Refunds within 30 days.\n") and "invocation_" not in stdout
    assert report["runs"] == 1
    assert {i: json.loads(text) for i, text in report["seen"].items()} == {
        DOC_CALL[0]: {"titles": ["refund policy"]}
    }
    record = sync_store.get("run-1", DOC_CALL[0])
    assert record is not None and record.state.status is Status.READY


def test_the_crewai_governed_loop_runs_as_written(
    sync_store: SyncStore, redis_url: str, namespace: str, tmp_path: pathlib.Path
) -> None:
    """As a script: the refund's output says it waits; an operator approves it in canon
    meanwhile; resume_waiting runs it once and the next kickoff tells the model."""
    code = blocks_of(SECTION)[1]
    script = (
        PRELUDE
        + SCRIPTED
        + "from crewai import Agent, Crew, Task\n"
        + "from eventstore import Projection, SyncBoundary, ToolSpec\n"
        + "from canon.integrations.crewai import as_tools\n"
        + "done = []\n"
        + "def refund(arguments, call):\n"
        + "    done.append(arguments)\n"
        + "    return {'refunded': arguments['amount']}\n"
        + "TOOLS = {'refund': ToolSpec(executor=refund, read_only=False, approval=True,\n"
        + "    projector=lambda raw, call: Projection(\n"
        + "        result=raw, evidence_status='EVIDENCE_FOUND'),\n"
        + "    input_schema={'type': 'object', 'properties': {'amount': {'type': 'integer'}}})}\n"
        + "class Operator(ScriptedChat):\n"
        + "    def handle(self, request):\n"
        + "        if len(self.requests) == 1 and request.url.path.endswith('/completions'):\n"
        + f"            store.decide('run-1', {REFUND_ID!r}, approve=True, by='ops', reason='ok')\n"
        + "        return super().handle(request)\n"
        + f"endpoint = Operator(turn([({REFUND_ID!r}, 'refund', {{'amount': 125}})]),\n"
        + "    chat_completion(None, 'It waits for approval.'),\n"
        + "    chat_completion(None, 'Refunded 125.'))\n"
        + "boundary = SyncBoundary(store, TOOLS, on_duplicate='replay')\n"
        + "agent = Agent(role='support', goal='Refund.', backstory='Support.',\n"
        + "    tools=as_tools(boundary, TOOLS, run='run-1'), llm=llm_of(endpoint))\n"
        + "task = Task(description='Refund order 9.', expected_output='Done.', agent=agent)\n"
        + code
        + "report = {'done': done, 'told': endpoint.requests[-1]['messages']}\n"
        + "json.dump(report, open(os.environ['DOC_REPORT'], 'w'))\n"
        + "store.close()\n"
    )
    stdout, report = run_as_script(script, redis_url, namespace, tmp_path)
    assert stdout.endswith("It waits for approval.\nRefunded 125.\n")
    assert "invocation_" not in stdout
    assert report["done"] == [{"amount": 125}]
    told = json.dumps(report["told"])
    assert REFUND_ID in told and "refunded" in told
    record = sync_store.get("run-1", REFUND_ID)
    assert record is not None and record.state.status is Status.READY
