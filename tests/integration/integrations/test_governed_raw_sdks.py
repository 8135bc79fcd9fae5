"""Governed tools through the raw SDK adapters (OpenAI Chat Completions and Responses,
Anthropic, Gemini): a waiting call is answered with canon's pending payload, which the
model reads as a result, not an error; once an operator decided, the harness calls the
adapter again on the same assistant turn and sends the recorded outcome under the same
call id (the tool ran once), or the denial as that SDK's error result.

Each SDK's own async client talks to a scripted endpoint (no network); Redis is real.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, Protocol

import anthropic
import httpx2
import pytest
from google import genai
from google.genai import types

from canon.integrations.anthropic import tool_params, tool_results
from canon.integrations.gemini import function_declarations, function_responses
from canon.integrations.openai import (
    ERROR_PREFIX,
    call_outputs,
    chat_tools,
    response_tools,
    tool_messages,
    tool_messages_sync,
)
from eventstore import (
    Projection,
    RunContext,
    Store,
    SyncBoundary,
    SyncStore,
    ToolBoundary,
    ToolCall,
    ToolSpec,
)
from machine.codes import SAFE_MESSAGES, ErrorCode, EvidenceStatus, Stage
from tests.support.model_script import ModelScript
from tests.support.openai_scripted import (
    FINAL_RESPONSE_ID,
    ScriptedOpenAI,
    chat_completion,
    function_call,
    response,
    response_function_call,
    response_message,
)

RUN = "run-raw"
CTX = RunContext(RUN)
ORDER = {"amount": 125, "to": "acct-9"}
QUERY = {"q": "refund policy"}
REFUND_SCHEMA = {
    "type": "object",
    "properties": {"amount": {"type": "integer"}, "to": {"type": "string"}},
    "required": ["amount", "to"],
}
SEARCH_SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}}
#: What the model reads for a waiting call: a result, saying it waits and has not run.
PENDING_TEXT = "awaiting an operator's approval"


class Tools:
    """A read-only search and a governed refund, each counting its runs."""

    def __init__(self) -> None:
        self.refunds: list[dict[str, Any]] = []
        self.searches = 0

    def search(self, arguments: dict[str, Any], call: ToolCall) -> Any:
        self.searches += 1
        return {"titles": ["Refunds within 30 days"]}

    def refund(self, arguments: dict[str, Any], call: ToolCall) -> Any:
        self.refunds.append(arguments)
        return {"refunded": arguments["amount"]}

    def specs(self) -> dict[str, ToolSpec]:
        return {
            "search": ToolSpec(
                executor=self.search,
                projector=project,
                description="Search the policies.",
                input_schema=SEARCH_SCHEMA,
            ),
            "refund": ToolSpec(
                executor=self.refund,
                projector=project,
                read_only=False,
                approval=True,
                description="Refund an order.",
                input_schema=REFUND_SCHEMA,
            ),
        }


def project(raw: Any, call: ToolCall) -> Projection:
    return Projection(result=raw, evidence_status=EvidenceStatus.EVIDENCE_FOUND, scope="shop")


def read_text(text: str) -> tuple[str, Any]:
    """A text tool output as the model reads it: ("error", safe error) when flagged."""
    if text.startswith(ERROR_PREFIX):
        return ("error", json.loads(text.removeprefix(ERROR_PREFIX)))
    return ("result", json.loads(text))


class Harness(Protocol):
    """One SDK's loop: its client asks the scripted model for a turn calling ``search``
    and ``refund``, the adapter answers the turn, the client sends the answers."""

    #: The refund call's id, as this API shapes it.
    refund_id: str
    search_id: str
    #: The SDK's own async client, closed after the test.
    client: Any

    async def turn(self) -> Any:
        """The model's turn, parsed by the SDK's own client."""

    async def answer(self, boundary: ToolBoundary, turn: Any) -> Any:
        """The adapter's answers to the turn (the tool message(s) to send)."""

    def read(self, answer: Any) -> dict[str, tuple[str, Any]]:
        """What the model reads for each call id: ("result" | "error", the payload)."""

    async def send(self, turn: Any, answer: Any) -> dict[str, tuple[str, Any]]:
        """Send the turn and the answers; what the next request carried, read per call id."""


class OpenAIChat:
    """Chat Completions: ``tool_messages`` on the assistant ``ChatCompletionMessage``."""

    refund_id = "call_R3fUnd9Xy7Tn4Bm1Cd6Wq2L"
    search_id = "call_S3arch9Xy7Tn4Bm1Cd6Wq2L"

    def __init__(self, specs: dict[str, ToolSpec]) -> None:
        calls = [
            function_call(self.search_id, "search", json.dumps(QUERY)),
            function_call(self.refund_id, "refund", json.dumps(ORDER)),
        ]
        self.endpoint = ScriptedOpenAI(chat_completion(calls), chat_completion(None, "Done."))
        self.client = self.endpoint.async_client()
        self.question: Any = {"role": "user", "content": "Refund order 9 if the policy allows."}
        self.tools = chat_tools(specs)

    async def turn(self) -> Any:
        completion = await self.client.chat.completions.create(
            model="gpt-4.1", messages=[self.question], tools=self.tools
        )
        return completion.choices[0].message

    async def answer(self, boundary: ToolBoundary, turn: Any) -> Any:
        return await tool_messages(boundary, CTX, turn)

    def read(self, answer: Any) -> dict[str, tuple[str, Any]]:
        return {message["tool_call_id"]: read_text(message["content"]) for message in answer}

    async def send(self, turn: Any, answer: Any) -> dict[str, tuple[str, Any]]:
        await self.client.chat.completions.create(
            model="gpt-4.1", messages=[self.question, turn, *answer], tools=self.tools
        )
        sent = self.endpoint.requests[-1]["messages"]
        return self.read([message for message in sent if message["role"] == "tool"])


class OpenAIResponses:
    """Responses API: ``call_outputs`` on the ``Response``."""

    refund_id = "call_R3fUnd9Xy7Tn4Bm1Cd6Wq2L"
    search_id = "call_S3arch9Xy7Tn4Bm1Cd6Wq2L"

    def __init__(self, specs: dict[str, ToolSpec]) -> None:
        calls = [
            response_function_call("fc_search", self.search_id, "search", json.dumps(QUERY)),
            response_function_call("fc_refund", self.refund_id, "refund", json.dumps(ORDER)),
        ]
        final = response([response_message("msg_final", "Done.")], FINAL_RESPONSE_ID)
        self.endpoint = ScriptedOpenAI(response(calls), final)
        self.client = self.endpoint.async_client()
        self.tools = response_tools(specs)

    async def turn(self) -> Any:
        return await self.client.responses.create(
            model="gpt-4.1", input="Refund order 9 if the policy allows.", tools=self.tools
        )

    async def answer(self, boundary: ToolBoundary, turn: Any) -> Any:
        return await call_outputs(boundary, CTX, turn)

    def read(self, answer: Any) -> dict[str, tuple[str, Any]]:
        return {item["call_id"]: read_text(item["output"]) for item in answer}

    async def send(self, turn: Any, answer: Any) -> dict[str, tuple[str, Any]]:
        await self.client.responses.create(
            model="gpt-4.1", previous_response_id=turn.id, input=answer, tools=self.tools
        )
        return self.read(self.endpoint.requests[-1]["input"])


class Anthropic:
    """Messages API: ``tool_results`` on the ``Message``; errors are ``is_error`` blocks."""

    refund_id = "toolu_01R3fUnd9Xy7Tn4Bm1Cd6Wq2"
    search_id = "toolu_01S3arch9Xy7Tn4Bm1Cd6Wq2"

    def __init__(self, specs: dict[str, ToolSpec]) -> None:
        def message(content: list[Any], stop_reason: str) -> dict[str, Any]:
            return {
                "id": "msg_01Aq9w938a90dw8q",
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-6",
                "content": content,
                "stop_reason": stop_reason,
                "stop_sequence": None,
                "usage": {"input_tokens": 472, "output_tokens": 165},
            }

        turn = [
            {"type": "text", "text": "Checking the policy, then refunding."},
            {"type": "tool_use", "id": self.search_id, "name": "search", "input": QUERY},
            {"type": "tool_use", "id": self.refund_id, "name": "refund", "input": ORDER},
        ]
        final = [{"type": "text", "text": "Done."}]
        self.script = ModelScript(message(turn, "tool_use"), message(final, "end_turn"))
        http = httpx2.AsyncClient(transport=self.script.transport())
        self.client = anthropic.AsyncAnthropic(api_key="test", http_client=http, max_retries=0)
        self.question: Any = {"role": "user", "content": "Refund order 9 if the policy allows."}
        self.tools = tool_params(specs)

    async def turn(self) -> Any:
        return await self.client.messages.create(
            model="claude-sonnet-4-6", max_tokens=1024, tools=self.tools, messages=[self.question]
        )

    async def answer(self, boundary: ToolBoundary, turn: Any) -> Any:
        return await tool_results(boundary, CTX, turn)

    def read(self, answer: Any) -> dict[str, tuple[str, Any]]:
        return {
            block["tool_use_id"]: (
                "error" if block.get("is_error") else "result",
                json.loads(block["content"]),
            )
            for block in answer["content"]
        }

    async def send(self, turn: Any, answer: Any) -> dict[str, tuple[str, Any]]:
        messages = [self.question, {"role": "assistant", "content": turn.content}, answer]
        await self.client.messages.create(
            model="claude-sonnet-4-6", max_tokens=1024, tools=self.tools, messages=messages
        )
        return self.read(self.script.bodies[-1]["messages"][-1])


class Gemini:
    """generateContent: ``function_responses`` on the response; an error is the
    ``{"error": ...}`` response Gemini documents, a result ``{"output": ...}``."""

    refund_id = "r3fund9x"
    search_id = "s3arch9x"

    def __init__(self, specs: dict[str, ToolSpec]) -> None:
        def reply(parts: list[Any]) -> dict[str, Any]:
            return {
                "candidates": [
                    {"content": {"parts": parts, "role": "model"}, "finishReason": "STOP"}
                ],
                "responseId": "Yx3aZ7b0Ocs2-O4Pm8WKoAg",
                "modelVersion": "gemini-3-pro-preview",
            }

        parts = [
            {"functionCall": {"name": "search", "args": QUERY, "id": self.search_id}},
            {"functionCall": {"name": "refund", "args": ORDER, "id": self.refund_id}},
        ]
        self.script = ModelScript(reply(parts), reply([{"text": "Done."}]))
        self.http = httpx2.AsyncClient(transport=self.script.transport())
        options = types.HttpOptions(httpx_async_client=self.http)
        self.client = genai.Client(api_key="test", http_options=options).aio
        self.question = types.Content(
            role="user", parts=[types.Part(text="Refund order 9 if the policy allows.")]
        )
        self.config = types.GenerateContentConfig(
            tools=[types.Tool(function_declarations=function_declarations(specs))]
        )

    async def turn(self) -> Any:
        return await self.client.models.generate_content(
            model="gemini-3-pro-preview", contents=[self.question], config=self.config
        )

    async def answer(self, boundary: ToolBoundary, turn: Any) -> Any:
        return await function_responses(boundary, CTX, turn)

    def read(self, answer: Any) -> dict[str, tuple[str, Any]]:
        content = answer.model_dump(mode="json", by_alias=True, exclude_none=True)
        return self._read(content)

    @staticmethod
    def _read(content: dict[str, Any]) -> dict[str, tuple[str, Any]]:
        read = {}
        for part in content["parts"]:
            answer = part["functionResponse"]
            [(key, payload)] = answer["response"].items()
            read[answer["id"]] = ("error" if key == "error" else "result", payload)
        return read

    async def send(self, turn: Any, answer: Any) -> dict[str, tuple[str, Any]]:
        contents = [self.question, turn.candidates[0].content, answer]
        await self.client.models.generate_content(
            model="gemini-3-pro-preview", contents=contents, config=self.config
        )
        return self._read(self.script.bodies[-1]["contents"][-1])


HARNESSES: dict[str, Any] = {
    "openai-chat": OpenAIChat,
    "openai-responses": OpenAIResponses,
    "anthropic": Anthropic,
    "gemini": Gemini,
}


@pytest.fixture(params=list(HARNESSES))
async def setup(request: Any, store: Store) -> AsyncIterator[tuple[Harness, Tools, ToolBoundary]]:
    """A harness of one SDK, its tools, and a boundary that replays re-sent read-only calls
    (the harness re-enters the whole turn)."""
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    tools = Tools()
    harness = HARNESSES[request.param](tools.specs())
    yield harness, tools, ToolBoundary(store, tools.specs(), on_duplicate="replay")
    client = harness.client
    await (client.aclose() if isinstance(harness, Gemini) else client.close())
    if isinstance(harness, Gemini):
        await harness.http.aclose()


async def pending_turn(store: Store, harness: Harness, tools: Tools, boundary: ToolBoundary) -> Any:
    """The model's turn, answered while the refund waits; check how the wait reads."""
    turn = await harness.turn()
    read = harness.read(await harness.answer(boundary, turn))
    assert read[harness.search_id] == ("result", {"titles": ["Refunds within 30 days"]})
    kind, pending = read[harness.refund_id]
    assert kind == "result"  # waiting is not a failure
    record = await store.get(RUN, harness.refund_id)
    assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL
    assert pending["status"] == "awaiting_approval"
    assert pending["approval_id"] == record.state.approval_id
    assert PENDING_TEXT in pending["message"] and "has not run" in pending["message"]
    assert tools.refunds == []
    return turn


async def test_a_waiting_call_reads_as_pending_and_an_approved_one_runs_once_on_reentry(
    store: Store, setup: tuple[Harness, Tools, ToolBoundary]
) -> None:
    """Pending first (a result saying it waits); approved, the adapter called again on the
    same turn runs the refund once and the next request carries its result under the
    same call id; calling again answers the same, running nothing."""
    harness, tools, boundary = setup
    turn = await pending_turn(store, harness, tools, boundary)
    again = harness.read(await harness.answer(boundary, turn))
    assert again[harness.refund_id][0] == "result"
    assert again[harness.refund_id][1]["status"] == "awaiting_approval"
    await store.decide(RUN, harness.refund_id, approve=True, by="ops@example", reason="ok")
    answer = await harness.answer(boundary, turn)
    assert harness.read(answer)[harness.refund_id] == ("result", {"refunded": 125})
    assert harness.read(await harness.answer(boundary, turn)) == harness.read(answer)
    sent = await harness.send(turn, answer)
    assert sent == {
        harness.search_id: ("result", {"titles": ["Refunds within 30 days"]}),
        harness.refund_id: ("result", {"refunded": 125}),
    }
    assert tools.refunds == [ORDER] and tools.searches == 1


async def test_a_denied_call_is_sent_as_the_sdks_error_result(
    store: Store, setup: tuple[Harness, Tools, ToolBoundary]
) -> None:
    """Denied: the adapter called again answers the call with APPROVAL_DENIED as that
    SDK's error (``Error: `` text, ``is_error``, Gemini's ``error``); nothing ran."""
    harness, tools, boundary = setup
    turn = await pending_turn(store, harness, tools, boundary)
    await store.decide(RUN, harness.refund_id, approve=False, by="ops@example", reason="no")
    sent = await harness.send(turn, await harness.answer(boundary, turn))
    denied = {"error_code": "APPROVAL_DENIED", "message": SAFE_MESSAGES[ErrorCode.APPROVAL_DENIED]}
    assert sent[harness.refund_id] == ("error", denied)
    assert tools.refunds == []


async def test_a_pause_holds_an_approved_call_until_the_unpause(
    store: Store, setup: tuple[Harness, Tools, ToolBoundary]
) -> None:
    """Approved, then the run paused: the adapter called again answers the call as still
    waiting (the pending payload, a result, not RUN_PAUSED) and runs nothing; unpaused,
    called again on the same turn, the refund runs once."""
    harness, tools, boundary = setup
    turn = await pending_turn(store, harness, tools, boundary)
    await store.decide(RUN, harness.refund_id, approve=True, by="ops@example", reason="ok")
    await store.pause_run(RUN, by="ops@example", reason="incident")
    kind, held = harness.read(await harness.answer(boundary, turn))[harness.refund_id]
    record = await store.get(RUN, harness.refund_id)
    assert record is not None and record.state.stage is Stage.APPROVED
    assert kind == "result" and held["status"] == "awaiting_approval"
    assert held["approval_id"] == record.state.approval_id and "has not run" in held["message"]
    assert tools.refunds == []
    await store.unpause_run(RUN, by="ops@example", reason="resolved")
    answer = await harness.answer(boundary, turn)
    assert harness.read(answer)[harness.refund_id] == ("result", {"refunded": 125})
    assert harness.read(await harness.answer(boundary, turn)) == harness.read(answer)
    assert tools.refunds == [ORDER]


def test_a_pause_holds_an_approved_call_in_the_sync_helpers(redis_url: str, namespace: str) -> None:
    """``tool_messages_sync`` on a SyncBoundary: approved then paused, the refund answers
    the pending payload (not ``Error: RUN_PAUSED``); unpaused, it runs once."""
    tools = Tools()
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [function_call(OpenAIChat.refund_id, "refund", json.dumps(ORDER))],
    }
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(RUN, deadline=timedelta(minutes=5))
        boundary = SyncBoundary(store, tools.specs(), on_duplicate="replay")
        [waiting] = tool_messages_sync(boundary, CTX, message)
        assert read_text(waiting["content"])[1]["status"] == "awaiting_approval"
        store.decide(RUN, OpenAIChat.refund_id, approve=True, by="ops@example", reason="ok")
        store.pause_run(RUN, by="ops@example", reason="incident")
        [held] = tool_messages_sync(boundary, CTX, message)
        assert read_text(held["content"]) == read_text(waiting["content"])
        assert tools.refunds == []
        store.unpause_run(RUN, by="ops@example", reason="resolved")
        [ran] = tool_messages_sync(boundary, CTX, message)
        assert read_text(ran["content"]) == ("result", {"refunded": 125})
        assert tools.refunds == [ORDER]
