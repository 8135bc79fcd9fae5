"""A scripted LlamaIndex function-calling LLM: tool calls on the user's turn, an answer
after the tools.

Built on LlamaIndex's own ``MockFunctionCallingLLM`` (the SDK's test LLM, as Pydantic AI's
``FunctionModel`` is its own): its responses carry the calls as ``ToolCallBlock``s with
the provider's ids, exactly as LlamaIndex's provider integrations build them. It answers
from the conversation it is sent, so a replayed step gets the same answer, and it keeps
every request (messages and the tools' schemas) for the test to assert on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.llms.mock import MockFunctionCallingLLM

#: One call the model makes: (tool call id, tool, arguments).
Call = tuple[str, str, dict[str, Any]]


class ScriptedLLM:
    """Calls every tool of ``calls`` on the user's turn, then answers the results' count.

    Attributes:
        llm: the LlamaIndex LLM to give the agent.
        requests: each request's messages, in order.
        tools: the arguments' JSON Schema of each tool of the latest request, by name.

    """

    def __init__(self, calls: Sequence[Call], answer: str | None = None) -> None:
        self.calls = list(calls)
        self.answer = answer
        self.requests: list[list[ChatMessage]] = []
        self.tools: dict[str, dict[str, Any]] = {}
        self.llm = MockFunctionCallingLLM(response_generator=self._respond)

    def _respond(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        self.requests.append(list(messages))
        self.tools = {
            tool.metadata.name: tool.metadata.get_parameters_dict()
            for tool in kwargs.get("tools") or []
        }
        if messages and messages[-1].role == MessageRole.USER:
            blocks = [
                ToolCallBlock(tool_call_id=call_id, tool_name=name, tool_kwargs=args)
                for call_id, name, args in self.calls
            ]
            return ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks)
        results = self.results_seen()
        return ChatMessage(
            role=MessageRole.ASSISTANT, content=self.answer or f"{len(results)} tool results"
        )

    def results_seen(self) -> dict[str, str]:
        """The tool results of the latest request, by tool call id: what the model read."""
        return {
            message.additional_kwargs["tool_call_id"]: message.content or ""
            for message in self.requests[-1]
            if message.role == MessageRole.TOOL
        }
