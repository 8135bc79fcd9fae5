"""A scripted OpenAI endpoint: recorded replies in the API's published JSON, every request kept.

The real SDK clients talk to it through ``httpx2.MockTransport`` (the transport of the
SDK's own HTTP client), so the tests see exactly the bodies the SDK sends; nothing leaves
the process.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import httpx2
from openai import AsyncOpenAI, OpenAI

from eventstore import Projection, ToolCall, ToolSpec
from machine.codes import SAFE_MESSAGES, ErrorCode

T = TypeVar("T")

#: Ids shaped as the APIs emit them.
CHAT_ID = "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG"
RESPONSE_ID = "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b"
FINAL_RESPONSE_ID = "resp_67ccd2c8f1a48190a8c3f0e5b7d2c1a60bb6a6b452d3795b"


class ScriptedOpenAI:
    """Answers each request with the next recorded reply and keeps each request's body."""

    def __init__(self, *replies: dict[str, Any]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self._lock = threading.Lock()
        self._async_clients: list[AsyncOpenAI] = []

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        """The transport's handler: record the request, send the next reply."""
        with self._lock:
            self.paths.append(request.url.path)
            self.requests.append(json.loads(request.content))
            assert self.replies, "the model was asked more often than scripted"
            reply = self.replies.pop(0)
        return httpx2.Response(200, json=reply, headers={"x-request-id": "req_scripted"})

    @contextmanager
    def client(self) -> Iterator[OpenAI]:
        """A sync ``OpenAI`` client on this endpoint, closed afterwards."""
        http = httpx2.Client(transport=httpx2.MockTransport(self.handle))
        with OpenAI(api_key="sk-test", http_client=http, max_retries=0) as client:
            yield client

    def async_client(self) -> AsyncOpenAI:
        """An ``AsyncOpenAI`` client on this endpoint, closed by :meth:`aclose`."""
        http = httpx2.AsyncClient(transport=httpx2.MockTransport(self.handle))
        client = AsyncOpenAI(api_key="sk-test", http_client=http, max_retries=0)
        self._async_clients.append(client)
        return client

    async def aclose(self) -> None:
        """Close every async client handed out."""
        for client in self._async_clients:
            await client.close()


def function_call(call_id: str, name: str, arguments: str | None) -> dict[str, Any]:
    """A Chat Completions function tool call."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def custom_call(call_id: str, name: str, text: str) -> dict[str, Any]:
    """A Chat Completions custom (free-form) tool call."""
    return {"id": call_id, "type": "custom", "custom": {"name": name, "input": text}}


def chat_completion(tool_calls: list[dict[str, Any]] | None, content: str | None = None) -> Any:
    """A ``chat.completion`` object whose one choice asks for ``tool_calls`` (or answers)."""
    return {
        "id": CHAT_ID,
        "object": "chat.completion",
        "created": 1741569952,
        "model": "gpt-4.1-2025-04-14",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": content,
                    "tool_calls": tool_calls,
                    "refusal": None,
                    "annotations": [],
                },
                "logprobs": None,
                "finish_reason": "tool_calls" if tool_calls else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 82,
            "completion_tokens": 17,
            "total_tokens": 99,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        },
        "service_tier": "default",
        "system_fingerprint": "fp_b376dfbbd5",
    }


def response_function_call(
    item_id: str, call_id: str, name: str, arguments: str, **extra: Any
) -> dict[str, Any]:
    """A Responses API ``function_call`` output item."""
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
        **extra,
    }


def response_custom_call(item_id: str, call_id: str, name: str, text: str) -> dict[str, Any]:
    """A Responses API ``custom_tool_call`` output item."""
    return {
        "type": "custom_tool_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "input": text,
    }


def response_message(item_id: str, text: str) -> dict[str, Any]:
    """A Responses API assistant ``message`` output item."""
    return {
        "type": "message",
        "id": item_id,
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def response(output: list[dict[str, Any]], response_id: str = RESPONSE_ID) -> dict[str, Any]:
    """A completed ``response`` object with these output items."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": 1741476542,
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": None,
        "model": "gpt-4.1-2025-04-14",
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": True,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": {
            "input_tokens": 291,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 23,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 314,
        },
        "user": None,
        "metadata": {},
    }


class Tools:
    """The tools the adapter tests register, with a count of every executor run."""

    def __init__(self, together: int = 1) -> None:
        self.runs: dict[str, int] = {}
        self._lock = threading.Lock()
        # search_kb calls wait for each other: they pass only if ``together`` run at once.
        self._together = threading.Barrier(together, timeout=10)

    def _ran(self, name: str) -> None:
        with self._lock:
            self.runs[name] = self.runs.get(name, 0) + 1

    def specs(self) -> dict[str, ToolSpec]:
        """search_kb, ping (no parameters), fail (raises), admin (unauthorized), grammar."""

        def search(arguments: dict[str, Any], call: ToolCall) -> Any:
            self._ran("search_kb")
            self._together.wait()
            return {"titles": [f"{arguments['q']} policy"], "secret": "raw only"}

        def ping(arguments: dict[str, Any], call: ToolCall) -> Any:
            self._ran("ping")
            return {"arguments": arguments}

        def fail(arguments: dict[str, Any], call: ToolCall) -> Any:
            self._ran("fail")
            raise RuntimeError("the backend said: password=hunter2")

        def admin(arguments: dict[str, Any], call: ToolCall) -> Any:
            self._ran("admin")
            return {}

        def grammar(arguments: dict[str, Any], call: ToolCall) -> Any:
            self._ran("grammar")
            return {"parsed": arguments["input"]}

        def project(raw: Any, call: ToolCall) -> Projection:
            shown = raw.get("titles", raw) if isinstance(raw, dict) else raw
            return Projection(result=shown, evidence_status="EVIDENCE_FOUND", scope="kb")

        return {
            "search_kb": ToolSpec(executor=search, projector=project),
            "ping": ToolSpec(executor=ping, projector=project),
            "fail": ToolSpec(executor=fail, projector=project),
            "admin": ToolSpec(executor=admin, projector=project, authorized=False),
            "grammar": ToolSpec(executor=grammar, projector=project),
        }


def error_content(code: str) -> dict[str, Any]:
    """What the model reads for an error: the code and its fixed message."""
    return {"error_code": code, "message": SAFE_MESSAGES[ErrorCode(code)]}


def in_thread(work: Callable[[], T]) -> T:
    """Run ``work`` in a fresh thread, as a harness's worker runs ``Runner.run_sync``.

    ``run_sync`` drives the thread's default loop and leaves it open; this thread's loop is
    closed afterwards so nothing outlives the test.
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            outcome["value"] = work()
        except BaseException as error:
            outcome["error"] = error
        finally:
            loop.run_until_complete(loop.shutdown_default_executor())
            asyncio.set_event_loop(None)
            loop.close()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "Runner.run_sync did not finish"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
