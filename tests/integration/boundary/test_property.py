"""Property: for random envelopes, tools and projectors the boundary never raises, every record
ends READY or ERROR with consistent evidence, and raw bytes reach the agent only through the
projector."""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from eventstore import (
    Limits,
    Projection,
    RunContext,
    Store,
    ToolBoundary,
    ToolCall,
    ToolEnvelope,
    ToolError,
    ToolResult,
    ToolSpec,
)
from machine.codes import PREFLIGHT_CODES, EvidenceStatus, Status
from machine.ids import is_tool_call_id
from machine.results import encode_raw
from tests.conftest import RedisServer
from tests.support.tools import namespace_keys

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-p"
TOOL = "probe"
LIMITS = Limits(
    request_bytes=1024, raw_bytes=2048, result_bytes=512, record_bytes=4096, scope_bytes=64
)
READY_EVIDENCE = {EvidenceStatus.EVIDENCE_FOUND, EvidenceStatus.NO_EVIDENCE}


def mostly(common: st.SearchStrategy[Any], rare: st.SearchStrategy[Any]) -> Any:
    """Draw from ``common`` four times in five, else from ``rare``."""
    return st.integers(0, 4).flatmap(lambda n: rare if n == 4 else common)


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=5)

safe_ids = st.one_of(
    st.from_regex(r"[A-Za-z0-9_\-][A-Za-z0-9._:{}*?\[\]\-]{0,30}", fullmatch=True),
    st.text(
        st.characters(exclude_categories=("Cc", "Cs", "Zs", "Zl", "Zp")), min_size=1, max_size=20
    ).filter(is_tool_call_id),
)
unsafe_ids = st.one_of(
    st.text(max_size=12),
    st.just("x" * 513),
    st.sampled_from(["", " ", "a b", "a\tb", "a\nb", "a\x00b", "a\x85", "a\u3000", "a\ud800"]),
    st.none(),
)
any_ids = mostly(safe_ids, unsafe_ids)
bad_arguments = st.one_of(
    st.lists(json_values, max_size=3),
    json_scalars,
    st.sampled_from(["[1]", "7", '"s"', "null", '{"a": NaN}', '{"a": "\\ud800"}', "{"]),
    st.just({"a": float("nan")}),
    st.just({"a": "\ud800"}),
    st.just({1: 2}),
    st.just({"a": {1, 2}}),
    st.just({"a": "x" * 2000}),
    st.builds(lambda depth: _nested(depth), st.integers(LIMITS.json_depth, LIMITS.json_depth + 2)),
)
arguments = mostly(
    st.one_of(
        json_objects,
        json_objects.map(lambda value: msgspec.json.encode(value)),
        json_objects.map(lambda value: msgspec.json.encode(value).decode()),
    ),
    bad_arguments,
)

executor_plans = mostly(
    st.one_of(
        st.tuples(st.just("json"), json_values),
        st.tuples(st.just("text"), st.text(max_size=40)),
        st.tuples(st.just("bytes"), st.binary(max_size=40)),
    ),
    st.tuples(st.sampled_from(["raise", "oversized", "unencodable"]), st.none()),
)
evidence_values = mostly(
    st.sampled_from(["EVIDENCE_FOUND", "NO_EVIDENCE", *READY_EVIDENCE]),
    st.one_of(
        st.sampled_from([*EvidenceStatus, "found", "", "evidence_found"]),
        st.text(max_size=10),
        st.none(),
        st.integers(),
    ),
)
valid_projections = st.tuples(
    st.just("valid"),
    st.fixed_dictionaries(
        {
            "result": json_values,
            "evidence": evidence_values,
            "scope": mostly(st.text(max_size=20), st.one_of(st.just("s" * 65), st.integers())),
            "echo_raw": st.booleans(),
        }
    ),
)
projector_plans = mostly(
    valid_projections,
    st.one_of(
        st.tuples(st.sampled_from(["raise", "oversized"]), st.none()),
        st.tuples(st.just("non_projection"), json_values),
    ),
)


@pytest.fixture(scope="module")
def server_url(redis_server: RedisServer) -> str:
    """The session server's URL, restarted first if a fault test killed it (module-scoped,
    since hypothesis refuses function-scoped fixtures)."""
    if redis_server.server is not None and not redis_server.server.running:
        redis_server.url = redis_server.server.start().url
    return redis_server.url


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def raw_value(plan: tuple[str, Any], marker: str) -> Any:
    """The executor's answer for ``plan``; every answer carries ``marker``."""
    kind, data = plan
    if kind == "json":
        return {"marker": marker, "data": data}
    if kind == "text":
        return f"{data}{marker}{data}"
    if kind == "bytes":
        return data + marker.encode() + data
    if kind == "oversized":
        return marker + "x" * LIMITS.raw_bytes
    if kind == "unencodable":
        return {"marker": marker, "value": object()}
    raise RuntimeError(f"executor failed near {marker}")


def make_projector(plan: tuple[str, Any], marker: str) -> Any:
    """A projector for ``plan``; it puts ``marker`` in its result only when told to."""
    kind, data = plan

    def project(raw: Any, call: ToolCall) -> Any:
        if kind == "raise":
            raise ValueError(f"projector failed on {raw!r}")
        if kind == "non_projection":
            return {"result": data, "raw": raw}
        if kind == "oversized":
            return Projection(result="y" * LIMITS.result_bytes, evidence_status="NO_EVIDENCE")
        result = {"echo": marker, "data": data["result"]} if data["echo_raw"] else data["result"]
        return Projection(result=result, evidence_status=data["evidence"], scope=data["scope"])

    return project


def echoes_marker(plan: tuple[str, Any]) -> bool:
    """Whether the projector of ``plan`` deliberately returns the raw marker."""
    return plan[0] == "valid" and bool(plan[1]["echo_raw"])


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    call_id=any_ids,
    envelope_run=mostly(st.just(RUN), st.just("run-other")),
    tool=mostly(st.just(TOOL), st.sampled_from(["unknown", "", None])),
    args=arguments,
    executor_plan=executor_plans,
    projector_plan=projector_plans,
    sync_executor=st.booleans(),
)
async def test_boundary_outcomes_are_always_consistent(
    server_url: str,
    call_id: Any,
    envelope_run: str,
    tool: str,
    args: Any,
    executor_plan: tuple[str, Any],
    projector_plan: tuple[str, Any],
    sync_executor: bool,
):
    """invoke never raises; a record ends READY (found/none evidence) or ERROR (ERROR evidence and
    a code) matching the reply; a refused preflight creates no key but the run's refusal log,
    which holds it as its one entry, never storing the marker; the reply holds the raw
    response's marker only when the projector put it there."""
    marker = "RAWMARK" + secrets.token_hex(8)
    namespace = "p" + secrets.token_hex(5)

    def sync_run(arguments: dict[str, Any], call: ToolCall) -> Any:
        return raw_value(executor_plan, marker)

    async def async_run(arguments: dict[str, Any], call: ToolCall) -> Any:
        return raw_value(executor_plan, marker)

    spec = ToolSpec(
        executor=sync_run if sync_executor else async_run,
        projector=make_projector(projector_plan, marker),
    )
    store = Store.from_url(server_url, namespace=namespace, limits=LIMITS)
    try:
        await store.open_run(RUN, deadline=timedelta(minutes=5))
        boundary = ToolBoundary(store, {TOOL: spec})
        envelope = ToolEnvelope(
            run_id=envelope_run, tool_call_id=call_id, tool=tool, arguments=args
        )
        keys_before = await namespace_keys(store.client, namespace)

        reply = await boundary.invoke(RunContext(RUN), envelope)

        record = await store.get(RUN, call_id) if is_tool_call_id(call_id) else None
        keys_after = await namespace_keys(store.client, namespace)
        refusal_log = store.keys.refusals(RUN).encode()
        refusals = await store.refusals(RUN)
    finally:
        await store.aclose()

    assert isinstance(reply, ToolResult | ToolError)
    event("READY" if isinstance(reply, ToolResult) else reply.error_code.value)
    if isinstance(reply, ToolError) and reply.error_code in PREFLIGHT_CODES:
        assert record is None
        assert keys_after == sorted([*keys_before, refusal_log])
        assert [refusal.code for refusal in refusals] == [reply.error_code.value]
        assert marker not in repr(refusals)
    else:
        assert record is not None
        state = record.state
        assert state.status in (Status.READY, Status.ERROR)
        if state.status is Status.READY:
            assert isinstance(reply, ToolResult)
            assert state.evidence_status in READY_EVIDENCE
            assert reply.evidence_status is state.evidence_status
            assert state.error_code is None
            assert record.raw == encode_raw(raw_value(executor_plan, marker))
        else:
            assert isinstance(reply, ToolError)
            assert state.evidence_status is EvidenceStatus.ERROR
            assert state.error_code is reply.error_code
            assert record.result is None
    agent_value = msgspec.json.encode(reply)
    if not (isinstance(reply, ToolResult) and echoes_marker(projector_plan)):
        assert marker.encode() not in agent_value
