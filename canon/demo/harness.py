"""The demo's simulated harness: a few runs with budgets and a realistic call mix."""

from __future__ import annotations

import asyncio
import random
import secrets
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from canon.demo.tools import demo_tools
from eventstore.boundary.contracts import (
    AgentReply,
    ApprovalPending,
    RunContext,
    ToolEnvelope,
    ToolError,
    ToolResult,
)
from eventstore.boundary.tool_boundary import ToolBoundary
from eventstore.store import Store

#: The label of a call that waits for an operator's approval.
WAITING = "AWAITING_APPROVAL"
QUERIES = ["refund", "shipping", "warranty", "recovery codes", "export", "teleport"]


@dataclass(frozen=True)
class PlannedCall:
    """One call the simulated agent will make."""

    ctx_run_id: str
    envelope: ToolEnvelope
    note: str


@dataclass
class DemoRun:
    """A run of the demo and what happened to its calls."""

    run_id: str
    budget: int
    outcomes: Counter[str] = field(default_factory=Counter)
    tool_call_ids: list[str] = field(default_factory=list)
    #: The first answer to each of the run's own calls (a duplicate's refusal comes later).
    first_answers: dict[str, str] = field(default_factory=dict)

    def first_call_with(self, outcome: str) -> str | None:
        """The first of the run's calls whose first answer was ``outcome`` (``ERROR/...``)."""
        return next((call for call, got in self.first_answers.items() if got == outcome), None)


def plan_run(run_id: str, calls: int, other_run_id: str, rng: random.Random) -> list[PlannedCall]:
    """Return the call mix of one run.

    Searches, an empty lookup, a failure, an oversized export, a refund that waits for
    an operator's approval, a writable tool with no approval policy, a duplicate id and
    a call that claims another run.
    """

    def call(i: int, tool: str, note: str, **arguments: Any) -> PlannedCall:
        envelope = ToolEnvelope(
            run_id=run_id, tool_call_id=f"call_{i:03d}", tool=tool, arguments=arguments
        )
        return PlannedCall(run_id, envelope, note)

    plan = [call(i, "kb_search", "search", query=rng.choice(QUERIES)) for i in range(calls)]
    plan += [
        call(calls, "ticket_lookup", "finds nothing", customer="c-1042"),
        call(calls + 1, "flaky_api", "upstream fails", invoice="inv-7"),
        call(calls + 2, "export_dump", "oversized response", table="orders"),
        call(calls + 3, "delete_user", "writable tool", user="u-9"),
        call(calls + 4, "issue_refund", "waits for approval", order="ord-1042", amount_eur=25),
        call(0, "kb_search", "duplicate id", query="refund"),
    ]
    cross = ToolEnvelope(
        run_id=other_run_id, tool_call_id="call_999", tool="kb_search", arguments={"query": "x"}
    )
    plan.append(PlannedCall(run_id, cross, "claims another run"))
    return plan


def outcome_of(reply: AgentReply) -> str:
    """A short label of a reply for the tables."""
    if isinstance(reply, ToolResult):
        return f"READY/{reply.evidence_status.value}"
    if isinstance(reply, ApprovalPending):
        return WAITING
    assert isinstance(reply, ToolError)
    return f"ERROR/{reply.error_code.value}"


async def drive(
    store: Store,
    *,
    runs: int,
    calls_per_run: int,
    seed: int,
    on_call: Callable[[], None] = lambda: None,
) -> list[DemoRun]:
    """Open the runs and play every planned call, a few concurrently per run."""
    rng = random.Random(seed)
    suffix = secrets.token_hex(3)
    names = ["support", "research", "billing", "onboarding", "audit"]
    run_ids = [f"{names[i % len(names)]}-{suffix}-{i}" for i in range(runs)]
    boundary = ToolBoundary(store, demo_tools())
    demo_runs = []
    for i, run_id in enumerate(run_ids):
        # The last run gets a budget smaller than its plan, so budgets visibly bind.
        budget = calls_per_run + 4 if i < runs - 1 else calls_per_run // 2
        await store.open_run(
            run_id,
            deadline=timedelta(minutes=10),
            budget=budget,
            tools={
                "kb_search": None,
                "ticket_lookup": 5,
                "flaky_api": 2,
                "export_dump": 1,
                "issue_refund": 1,
            },
        )
        demo_runs.append(DemoRun(run_id, budget))

    async def play(demo_run: DemoRun, plan: list[PlannedCall]) -> None:
        for start in range(0, len(plan), 4):
            batch = plan[start : start + 4]
            replies = await asyncio.gather(
                *(boundary.invoke(RunContext(c.ctx_run_id), c.envelope) for c in batch)
            )
            for planned, reply in zip(batch, replies, strict=True):
                demo_run.outcomes[outcome_of(reply)] += 1
                if planned.envelope.run_id == demo_run.run_id:
                    demo_run.first_answers.setdefault(
                        planned.envelope.tool_call_id, outcome_of(reply)
                    )
                if planned.envelope.tool_call_id not in demo_run.tool_call_ids:
                    demo_run.tool_call_ids.append(planned.envelope.tool_call_id)
                on_call()

    plans = [
        plan_run(r.run_id, calls_per_run, run_ids[(i + 1) % runs], rng)
        for i, r in enumerate(demo_runs)
    ]
    await asyncio.gather(*(play(r, p) for r, p in zip(demo_runs, plans, strict=True)))
    for demo_run in demo_runs:
        # A run with a call waiting for approval stays open: a closed run's approved call
        # never runs (its approval lives as long as the run's authority).
        if not demo_run.outcomes.get(WAITING):
            await store.close_run(demo_run.run_id)
    return demo_runs


def planned_calls(runs: int, calls_per_run: int) -> int:
    """How many calls :func:`drive` will make."""
    return runs * (calls_per_run + 7)
