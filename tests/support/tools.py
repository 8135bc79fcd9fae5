"""Fake tools and projectors that record whether they ran, for the boundary tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from eventstore.boundary.contracts import Projection, ToolCall, ToolSpec
from machine.codes import EvidenceStatus


@dataclass
class FakeTool:
    """An executor/projector pair with call counters and configurable behaviour."""

    raw: Any = field(default_factory=lambda: {"rows": [1, 2, 3]})
    result: Any = field(default_factory=lambda: {"count": 3})
    evidence: Any = EvidenceStatus.EVIDENCE_FOUND
    scope: str = "orders:2026"
    raise_in_executor: BaseException | None = None
    raise_in_projector: BaseException | None = None
    project: Callable[[Any, ToolCall], Any] | None = None
    executed: int = 0
    projected: int = 0
    #: Every ToolCall the executor and the projector were handed, in order.
    calls: list[ToolCall] = field(default_factory=list)

    async def executor(self, arguments: dict[str, Any], call: ToolCall) -> Any:
        """Return the configured raw response (or raise)."""
        self.executed += 1
        self.calls.append(call)
        if self.raise_in_executor is not None:
            raise self.raise_in_executor
        return self.raw

    def projector(self, raw: Any, call: ToolCall) -> Any:
        """Return the configured projection (or raise)."""
        self.projected += 1
        self.calls.append(call)
        if self.raise_in_projector is not None:
            raise self.raise_in_projector
        if self.project is not None:
            return self.project(raw, call)
        return Projection(result=self.result, evidence_status=self.evidence, scope=self.scope)

    def spec(self, **options: Any) -> ToolSpec:
        """A ToolSpec running this fake."""
        return ToolSpec(executor=self.executor, projector=self.projector, **options)


async def namespace_keys(redis: Redis, namespace: str) -> list[bytes]:
    """Every key of a namespace (SCAN), sorted."""
    return sorted([key async for key in redis.scan_iter(match=f"{namespace}:*", count=1000)])


async def record_keys(redis: Redis, namespace: str) -> list[bytes]:
    """Keys of canonical records and event streams of a namespace (both layouts)."""
    return [
        key for key in await namespace_keys(redis, namespace) if b":inv:" in key or b":ev:" in key
    ]
