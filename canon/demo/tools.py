"""Simulated tools of the demo.

A knowledge-base search that finds evidence, a ticket lookup that finds nothing, an
upstream API that fails, an export that returns far too much, a refund that changes
things and so waits for an operator's approval, and a writable tool with no approval
policy, which preflight refuses.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from eventstore.boundary.contracts import Projection, ToolCall, ToolSpec

_ARTICLES = [
    ("Refund policy", "Refunds are issued within 30 days of purchase to the original method."),
    ("Shipping times", "Standard shipping takes 3-5 business days inside the EU."),
    ("Warranty", "Hardware is covered for 24 months against manufacturing defects."),
    ("Account recovery", "Recovery codes are shown once; support cannot read them."),
    ("Data export", "Exports are prepared within 48 hours and kept for 7 days."),
]


async def kb_search(arguments: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    """Search the knowledge base; the raw response carries whole article bodies."""
    await asyncio.sleep(random.uniform(0.001, 0.004))
    query = str(arguments.get("query", "")).lower()
    hits = [
        {"title": title, "body": body * 8, "score": round(random.random(), 3)}
        for title, body in _ARTICLES
        if any(word in (title + body).lower() for word in query.split())
    ]
    return {"query": query, "hits": hits, "took_ms": random.randint(3, 40)}


def project_kb(raw: dict[str, Any], call: ToolCall) -> Projection:
    """Give the agent titles only; the bodies stay in the canonical record."""
    titles = [hit["title"] for hit in raw["hits"]][:3]
    status = "EVIDENCE_FOUND" if titles else "NO_EVIDENCE"
    return Projection(result={"titles": titles}, evidence_status=status, scope="kb:articles")


async def ticket_lookup(arguments: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    """Look up tickets of a customer; the demo customers have none in range."""
    await asyncio.sleep(random.uniform(0.001, 0.003))
    return {"customer": arguments.get("customer"), "tickets": [], "window_days": 7}


def project_tickets(raw: dict[str, Any], call: ToolCall) -> Projection:
    """A lookup that finds nothing is a scoped negative observation, not a failure."""
    return Projection(
        result={"tickets": len(raw["tickets"])},
        evidence_status="EVIDENCE_FOUND" if raw["tickets"] else "NO_EVIDENCE",
        scope=f"tickets:{raw['customer']}:last-{raw['window_days']}d",
    )


def flaky_api(arguments: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    """An upstream that fails with an error message no agent should read."""
    raise ConnectionError("upstream 503 from billing-internal.example (token=demo-secret)")


def export_dump(arguments: dict[str, Any], call: ToolCall) -> str:
    """An export far larger than the raw-response limit."""
    return "row;" * 400_000


def project_passthrough(raw: Any, call: ToolCall) -> Projection:
    """A projector that is never reached in the demo (its tools fail first)."""
    return Projection(result=str(raw)[:64], evidence_status="EVIDENCE_FOUND")


async def issue_refund(arguments: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    """Refund an order: a side effect, so it runs only once an operator approved it."""
    await asyncio.sleep(random.uniform(0.001, 0.003))
    return {"order": arguments.get("order"), "refunded_eur": arguments.get("amount_eur")}


def project_refund(raw: dict[str, Any], call: ToolCall) -> Projection:
    """The agent learns what was refunded."""
    return Projection(result=raw, evidence_status="EVIDENCE_FOUND", scope=f"orders:{raw['order']}")


def demo_tools() -> dict[str, ToolSpec]:
    """The tools the demo harness may call."""
    return {
        "kb_search": ToolSpec(executor=kb_search, projector=project_kb),
        "ticket_lookup": ToolSpec(executor=ticket_lookup, projector=project_tickets),
        "flaky_api": ToolSpec(executor=flaky_api, projector=project_passthrough),
        "export_dump": ToolSpec(executor=export_dump, projector=project_passthrough),
        "issue_refund": ToolSpec(
            executor=issue_refund,
            projector=project_refund,
            read_only=False,
            approval=True,
            description="Refund an order (waits for an operator's approval).",
        ),
        "delete_user": ToolSpec(executor=flaky_api, projector=project_passthrough, read_only=False),
    }
