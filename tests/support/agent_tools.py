"""Tools for the agent-framework adapter tests: a knowledge-base search, a broken tool, a
tool nobody may run, and how each is described to the model.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from eventstore import Projection, ToolCall, ToolSpec

#: The turn every framework test scripts: four parallel calls, one of them failing, plus
#: a tool the boundary does not know and one it may not run. (tool call id, tool, args)
TURN: list[tuple[str, str, dict[str, Any]]] = [
    ("call_Kq1vD2bW7cYxZ0aR", "search", {"q": "refund"}),
    ("call_m3Np8QeLt5sJ2uHw", "search", {"q": "shipping"}),
    ("call_Z9yXw8Vu7Ts6Rq5P", "search", {"q": "warranty"}),
    ("call_A1b2C3d4E5f6G7h8", "broken", {"q": "anything"}),
    ("call_u7Yt6Rr5Ee4Ww3Qq", "no_such_tool", {}),
    ("call_P0o9I8u7Y6t5R4e3", "delete_order", {"order": "A-17"}),
]

#: What the model is told about each tool (the canon integrations' ToolSchema shape).
SCHEMAS: dict[str, Any] = {
    "search": {
        "description": "Search the knowledge base.",
        "parameters": {
            "type": "object",
            "properties": {"q": {"type": "string"}},
            "required": ["q"],
        },
    },
    "broken": {
        "description": "A tool whose backend is down.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
    "delete_order": {
        "description": "Delete an order (never allowed here).",
        "parameters": {"type": "object", "properties": {"order": {"type": "string"}}},
    },
}


class KnowledgeBase:
    """The tools' executors, counting every execution (from any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.executed: Counter[str] = Counter()

    def _count(self, call: ToolCall) -> None:
        with self._lock:
            self.executed[call.tool_call_id] += 1

    def search(self, arguments: dict[str, Any], call: ToolCall) -> dict[str, Any]:
        """Raw hits for the query (a plain executor: it runs in a worker thread)."""
        self._count(call)
        return {"hits": [f"{arguments['q']} policy"], "internal": "raw row 42"}

    def broken(self, arguments: dict[str, Any], call: ToolCall) -> Any:
        """Fail the way a real backend does: with details the agent must never see."""
        self._count(call)
        raise ConnectionError("backend 10.0.0.7 refused; token=sk-secret")

    def delete_order(self, arguments: dict[str, Any], call: ToolCall) -> Any:
        """Never reached: the tool is not authorized."""
        self._count(call)
        return {"deleted": True}

    def specs(self) -> dict[str, ToolSpec]:
        """The boundary's tools: ``no_such_tool`` is deliberately absent."""
        return {
            "search": ToolSpec(executor=self.search, projector=titles),
            "broken": ToolSpec(executor=self.broken, projector=titles),
            "delete_order": ToolSpec(
                executor=self.delete_order, projector=titles, authorized=False
            ),
        }


def titles(raw: Any, call: ToolCall) -> Projection:
    """The bounded result: the hits' titles, never the raw row."""
    return Projection(result={"titles": raw["hits"]}, evidence_status="EVIDENCE_FOUND", scope="kb")


#: What the model sees for each call of :data:`TURN`, in order (status, JSON content).
EXPECTED: list[tuple[str, Any]] = [
    ("success", {"titles": ["refund policy"]}),
    ("success", {"titles": ["shipping policy"]}),
    ("success", {"titles": ["warranty policy"]}),
    ("error", {"error_code": "EXECUTION_FAILED"}),
    ("error", {"error_code": "UNKNOWN_TOOL"}),
    ("error", {"error_code": "UNAUTHORIZED"}),
]

#: The calls that run a tool (the others are refused before execution).
EXECUTED_ONCE = {call_id: 1 for call_id, _, _ in TURN[:4]}


#: The one call the docs' loops script.
DOC_CALL = ("call_Rf3kQ9xZ1mN7pW2s", "search", {"q": "refund"})


class CountingSearch:
    """The docs' search tool: raw hits for the query, counting its runs."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, arguments: dict[str, Any], call: ToolCall) -> dict[str, Any]:
        """Return the raw hits."""
        self.runs += 1
        return {"hits": [f"{arguments['q']} policy"], "internal": "raw row 42"}


class Refunds:
    """A governed refund that counts its runs, beside the knowledge base's search."""

    def __init__(self) -> None:
        self.done: list[dict[str, Any]] = []

    def specs(self) -> dict[str, ToolSpec]:
        def refund(arguments: dict[str, Any], call: ToolCall) -> Any:
            self.done.append(arguments)
            return {"refunded": arguments["amount"]}

        return {
            **KnowledgeBase().specs(),
            "refund": ToolSpec(
                executor=refund,
                projector=lambda raw, call: Projection(
                    result=raw, evidence_status="EVIDENCE_FOUND"
                ),
                read_only=False,
                approval=True,
                description="Refund an order.",
                input_schema={
                    "type": "object",
                    "properties": {"amount": {"type": "integer"}, "to": {"type": "string"}},
                    "required": ["amount", "to"],
                },
            ),
        }
