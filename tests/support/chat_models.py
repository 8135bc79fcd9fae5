"""A scripted LangChain chat model: tool calls on the user's turn, an answer after the tools.

It answers from the conversation it is sent (not from a counter), so a graph that re-runs
a node gets the same answer again, and it captures every request, so a test asserts on
exactly what the model was shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import Field

from tests.support.agent_tools import TURN


class ScriptedChatModel(BaseChatModel):
    """Calls every tool of ``calls`` in one turn, then answers with the tool results' count."""

    calls: list[tuple[str, str, dict[str, Any]]] = Field(default_factory=lambda: list(TURN))
    requests: list[list[BaseMessage]] = Field(default_factory=list)
    bound: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[Any, Any]:
        """Record the tools as a provider would receive them (OpenAI function shape)."""
        self.bound = [convert_to_openai_tool(tool) for tool in tools]
        return self.bind(tools=self.bound, **kwargs)

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        self.requests.append(list(messages))
        if isinstance(messages[-1], HumanMessage):
            message = AIMessage(
                content="",
                id="chatcmpl-1",
                tool_calls=[
                    {"id": call_id, "name": name, "args": args, "type": "tool_call"}
                    for call_id, name, args in self.calls
                ],
            )
        else:
            results = [m for m in messages if isinstance(m, ToolMessage)]
            message = AIMessage(content=f"{len(results)} tool results", id="chatcmpl-2")
        return ChatResult(generations=[ChatGeneration(message=message)])

    def tool_results_seen(self) -> list[ToolMessage]:
        """The tool messages of the model's latest request."""
        return [m for m in self.requests[-1] if isinstance(m, ToolMessage)]
