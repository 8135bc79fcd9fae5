"""A scripted Pydantic AI model (a FunctionModel function): tool calls on the user's turn,
an answer after the tool results, every request captured.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo

from tests.support.agent_tools import TURN


class ScriptedModel:
    """The model's side: all of TURN in one response, then an answer after the results.
    It records every request (the messages Pydantic AI sends back)."""

    def __init__(self, calls: list[tuple[str, str, dict[str, Any]]] | None = None) -> None:
        self.calls = TURN if calls is None else calls
        self.requests: list[list[ModelMessage]] = []
        self.tools: list[str] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests.append(list(messages))
        self.tools = [tool.name for tool in info.function_tools]
        last = messages[-1]
        if isinstance(last, ModelRequest) and isinstance(last.parts[-1], UserPromptPart):
            return ModelResponse(
                parts=[
                    ToolCallPart(tool_name=name, args=json.dumps(args), tool_call_id=call_id)
                    for call_id, name, args in self.calls
                ]
            )
        return ModelResponse(parts=[TextPart("answered")])

    def returns_seen(self) -> list[ToolReturnPart]:
        """The tool returns of the model's latest request."""
        last = self.requests[-1][-1]
        assert isinstance(last, ModelRequest)
        return [part for part in last.parts if isinstance(part, ToolReturnPart)]
