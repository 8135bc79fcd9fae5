"""docs/integrations.md: the OpenAI and Agents SDK loops run as written.

Each code block is executed unchanged with the names the section says it takes
(``client`` or ``model``, ``store``, ``TOOLS``, ``run``), against a scripted model
endpoint, and the test checks what the SDK sent back to the model.
"""

from __future__ import annotations

import io
import json
import pathlib
import re
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from agents import OpenAIResponsesModel, set_tracing_disabled

from canon.integrations.openai import chat_tools
from eventstore import Projection, RunContext, SyncBoundary, SyncStore, ToolCall, ToolSpec
from machine.codes import Stage
from tests.support.calls import RUN
from tests.support.openai_scripted import (
    FINAL_RESPONSE_ID,
    ScriptedOpenAI,
    Tools,
    chat_completion,
    function_call,
    in_thread,
    response,
    response_function_call,
    response_message,
)
from tests.support.waiting import wait_until

DOC = pathlib.Path(__file__).parents[3] / "docs" / "integrations.md"


def blocks(heading: str) -> list[str]:
    """The python code blocks of the section under ``## heading``."""
    text = DOC.read_text()
    section = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert section is not None, heading
    return re.findall(r"```python\n(.*?)```", section.group(1), re.S)


def canon_lines(block: str) -> list[str]:
    """The block's lines of canon-specific code (imports aside)."""
    names = ("SyncBoundary", "tool_messages", "call_outputs", "function_tool", "context=run")
    return [
        line
        for line in block.splitlines()
        if not line.startswith(("from ", "import ")) and any(name in line for name in names)
    ]


def execute(block: str, **names: Any) -> str:
    """Run the block with ``names`` defined; return what its own ``print`` calls printed.

    The block's ``print`` is captured rather than the process's stdout, which other
    tests of the session may have handed to a logging set-up.
    """
    printed = io.StringIO()

    def captured_print(*values: Any) -> None:
        print(*values, file=printed)

    exec(compile(block, str(DOC), "exec"), {**names, "print": captured_print})
    return printed.getvalue()


@pytest.fixture
def sync_store(redis_url: str, namespace: str) -> Iterator[SyncStore]:
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        yield store


def test_chat_completions_loop_runs_as_written(sync_store: SyncStore) -> None:
    """The Chat Completions loop: two parallel calls through canon, then the answer."""
    [chat, _, _] = blocks("OpenAI (Chat Completions and Responses)")
    assert len(canon_lines(chat)) <= 3
    calls = [
        function_call("call_FthC9qRpsL5kBpwwyw6c7j4k", "search_kb", '{"q": "refund"}'),
        function_call("call_3Rk8ZpL2vWq9Xy7Tn4Bm1Cd6", "search_kb", '{"q": "returns"}'),
    ]
    endpoint = ScriptedOpenAI(chat_completion(calls), chat_completion(None, "30 days."))
    tools = Tools(together=2)
    with endpoint.client() as client:
        printed = execute(
            chat, client=client, store=sync_store, TOOLS=tools.specs(), run=RunContext(RUN)
        )
    assert printed == "30 days.\n"
    sent = endpoint.requests[1]["messages"][2:]
    assert [(m["role"], m["tool_call_id"]) for m in sent] == [
        ("tool", "call_FthC9qRpsL5kBpwwyw6c7j4k"),
        ("tool", "call_3Rk8ZpL2vWq9Xy7Tn4Bm1Cd6"),
    ]
    assert [json.loads(m["content"]) for m in sent] == [["refund policy"], ["returns policy"]]
    assert tools.runs == {"search_kb": 2}


def test_responses_loop_runs_as_written(sync_store: SyncStore) -> None:
    """The Responses loop: outputs keyed by call_id, chained by previous_response_id."""
    [_, responses, _] = blocks("OpenAI (Chat Completions and Responses)")
    assert len(canon_lines(responses)) <= 3
    call = response_function_call(
        "fc_67ccd2c3b5c48190a1c6b6e1a7f43c1f0bb6a6b452d3795b",
        "call_FthC9qRpsL5kBpwwyw6c7j4k",
        "search_kb",
        '{"q": "refund"}',
    )
    endpoint = ScriptedOpenAI(
        response([call]), response([response_message("msg_1", "30 days.")], FINAL_RESPONSE_ID)
    )
    tools = Tools()
    with endpoint.client() as client:
        printed = execute(
            responses, client=client, store=sync_store, TOOLS=tools.specs(), run=RunContext(RUN)
        )
    assert printed == "30 days.\n"
    [output] = endpoint.requests[1]["input"]
    assert output["type"] == "function_call_output"
    assert output["call_id"] == "call_FthC9qRpsL5kBpwwyw6c7j4k"
    assert json.loads(output["output"]) == ["refund policy"]
    assert tools.runs == {"search_kb": 1}


async def test_agents_sdk_loop_runs_as_written(sync_store: SyncStore) -> None:
    """The Agents SDK loop: Runner.run_sync (in a harness thread) through canon."""
    [block, _] = blocks("OpenAI Agents SDK")
    assert len(canon_lines(block)) <= 3
    call = response_function_call(
        "fc_67ccd2c3b5c48190a1c6b6e1a7f43c1f0bb6a6b452d3795b",
        "call_FthC9qRpsL5kBpwwyw6c7j4k",
        "search_kb",
        '{"q": "refund"}',
    )
    endpoint = ScriptedOpenAI(
        response([call]), response([response_message("msg_1", "30 days.")], FINAL_RESPONSE_ID)
    )
    model = OpenAIResponsesModel(model="gpt-4.1", openai_client=endpoint.async_client())
    tools = Tools()
    set_tracing_disabled(True)  # the SDK would export traces to the network
    try:
        printed = in_thread(
            lambda: execute(
                block, model=model, store=sync_store, TOOLS=tools.specs(), run=RunContext(RUN)
            )
        )
    finally:
        set_tracing_disabled(False)
        await endpoint.aclose()
    assert printed == "30 days.\n"
    [output] = [i for i in endpoint.requests[1]["input"] if i.get("type") == "function_call_output"]
    assert output["call_id"] == "call_FthC9qRpsL5kBpwwyw6c7j4k"
    assert json.loads(output["output"]) == ["refund policy"]
    assert tools.runs == {"search_kb": 1}


class Refunds:
    """A governed refund tool that counts its runs."""

    def __init__(self) -> None:
        self.done: list[dict[str, Any]] = []

    def specs(self) -> dict[str, ToolSpec]:
        def refund(arguments: dict[str, Any], call: ToolCall) -> Any:
            self.done.append(arguments)
            return {"refunded": arguments["amount"]}

        def project(raw: Any, call: ToolCall) -> Projection:
            return Projection(result=raw, evidence_status="EVIDENCE_FOUND", scope="refunds")

        return {
            "refund": ToolSpec(
                executor=refund,
                projector=project,
                read_only=False,
                approval=True,
                description="Refund an order.",
                input_schema={"type": "object", "properties": {"amount": {"type": "integer"}}},
            )
        }


REFUND_ID = "call_R3fUnd9Xy7Tn4Bm1Cd6Wq2L"


def test_a_late_approved_result_is_sent_as_a_new_message_as_written(
    sync_store: SyncStore,
) -> None:
    """The pending payload went to the model and the conversation went on; after the
    operator's approval the block runs the refund once and tells the model its result in
    a user message naming the call (the call id is never answered twice)."""
    [_, _, late] = blocks("OpenAI (Chat Completions and Responses)")
    refunds = Refunds()
    specs = refunds.specs()
    decided: list[bool] = []

    class OperatorAtSecondTurn(ScriptedOpenAI):
        """The operator approves in canon while the model answers the pending payload."""

        def handle(self, request: Any) -> Any:
            if len(self.requests) == 1 and not decided:
                sync_store.decide(RUN, REFUND_ID, approve=True, by="ops@example", reason="ok")
                decided.append(True)
            return super().handle(request)

    endpoint = OperatorAtSecondTurn(
        chat_completion([function_call(REFUND_ID, "refund", '{"amount": 125}')]),
        chat_completion(None, "The refund waits for approval."),
        chat_completion(None, "Refunded 125."),
    )
    boundary = SyncBoundary(sync_store, specs, on_duplicate="replay")
    tools = chat_tools(specs)
    question = {"role": "user", "content": "Refund order 9."}
    with endpoint.client() as client:
        first = client.chat.completions.create(model="gpt-4.1", messages=[question], tools=tools)
        message = first.choices[0].message
        printed = execute(
            late,
            client=client,
            boundary=boundary,
            run=RunContext(RUN),
            message=message,
            messages=[question, message],
            tools=tools,
        )
    assert printed == "Refunded 125.\n"
    pending = json.loads(endpoint.requests[1]["messages"][2]["content"])
    assert pending["status"] == "awaiting_approval"
    sent = endpoint.requests[2]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "assistant", "user"]
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == [REFUND_ID]
    assert sent[-1]["content"] == f'Tool call {REFUND_ID} has now run: {{"refunded":125}}'
    assert refunds.done == [{"amount": 125}]


async def test_the_agents_sdk_governed_loop_runs_as_written(sync_store: SyncStore) -> None:
    """The governed Agents SDK loop: interrupted on the refund, an operator approves in
    canon, the decisions applied run it once, and the resumed run answers."""
    [_, block] = blocks("OpenAI Agents SDK")
    call = response_function_call("fc_refund", REFUND_ID, "refund", '{"amount": 125}')
    endpoint = ScriptedOpenAI(
        response([call]), response([response_message("msg_1", "Refunded.")], FINAL_RESPONSE_ID)
    )
    model = OpenAIResponsesModel(model="gpt-4.1", openai_client=endpoint.async_client())
    refunds = Refunds()

    def operator() -> None:
        def waiting() -> bool:
            record = sync_store.get(RUN, REFUND_ID)
            return record is not None and record.state.stage is Stage.AWAITING_APPROVAL

        wait_until(waiting, timeout_s=30)
        sync_store.decide(RUN, REFUND_ID, approve=True, by="ops@example", reason="ok")

    set_tracing_disabled(True)  # the SDK would export traces to the network
    deciding = threading.Thread(target=operator)
    deciding.start()
    try:
        printed = in_thread(
            lambda: execute(
                block, model=model, store=sync_store, TOOLS=refunds.specs(), run=RunContext(RUN)
            )
        )
    finally:
        deciding.join()
        set_tracing_disabled(False)
        await endpoint.aclose()
    assert printed == "Refunded.\n"
    [output] = [i for i in endpoint.requests[1]["input"] if i.get("type") == "function_call_output"]
    assert output["call_id"] == REFUND_ID and json.loads(output["output"]) == {"refunded": 125}
    assert refunds.done == [{"amount": 125}]
