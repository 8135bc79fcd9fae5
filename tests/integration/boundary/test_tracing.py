"""OpenTelemetry: each invocation is one GenAI ``execute_tool`` span, nested under the caller's
span, with the tool's own spans nested under it; without the package nothing is imported."""

from __future__ import annotations

import asyncio
import os
import pathlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import SpanKind, StatusCode

from eventstore import Projection, RunContext, Store, ToolBoundary, ToolCall, ToolSpec
from eventstore.boundary.tracing import TRACER_NAME, TRACING
from machine.ids import invocation_id
from tests.support.calls import RUN, TOOL, envelope, open_run
from tests.support.tools import FakeTool

ROOT = pathlib.Path(__file__).resolve().parents[3]


class Switch(Sampler):
    """Samples only while a test of this module runs: the tracer provider, set once per
    process, must cost nothing to the tests that follow."""

    on = False

    def should_sample(
        self,
        parent_context: Any,
        trace_id: int,
        name: str,
        kind: Any = None,
        attributes: Any = None,
        *args: Any,
        **kwargs: Any,
    ) -> SamplingResult:
        if not self.on:
            return SamplingResult(Decision.DROP)
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)

    def get_description(self) -> str:
        return "on while a tracing test runs"


#: One exporter and one switch for the session: a global tracer provider is set only once.
_EXPORTER = InMemorySpanExporter()
_SWITCH = Switch()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The in-memory exporter of the process's tracer provider, recording during the test."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider(sampler=_SWITCH)
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    _SWITCH.on = True
    yield _EXPORTER
    _SWITCH.on = False
    _EXPORTER.clear()


def invocation_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    """Finished spans the boundary made."""
    return [
        span
        for span in exporter.get_finished_spans()
        if span.instrumentation_scope is not None and span.instrumentation_scope.name == TRACER_NAME
    ]


def only_invocation_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    (span,) = invocation_spans(exporter)
    return span


def test_tracing_is_on_with_the_package_installed():
    """The test environment has the otel extra, so the boundary traces."""
    assert TRACING


async def test_a_ready_call_is_one_execute_tool_span(store: Store, spans: InMemorySpanExporter):
    """A READY call: span ``execute_tool search`` (INTERNAL) with the GenAI attributes and the
    record's id, status not ERROR, no error.type."""
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: FakeTool().spec()})

    await boundary.invoke(RunContext(RUN), envelope("call_1"))

    span = only_invocation_span(spans)
    assert span.name == f"execute_tool {TOOL}"
    assert span.kind is SpanKind.INTERNAL
    assert dict(span.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": TOOL,
        "gen_ai.tool.type": "function",
        "gen_ai.tool.call.id": "call_1",
        "canon.run_id": RUN,
        "canon.invocation_id": invocation_id(RUN, "call_1"),
    }
    assert span.status.status_code is not StatusCode.ERROR


async def test_an_error_sets_error_type_and_status(store: Store, spans: InMemorySpanExporter):
    """An ERROR reply: error.type is the code, the status is ERROR, described by the code only."""
    await open_run(store)
    tool = FakeTool(raise_in_executor=RuntimeError("password=hunter2"))
    boundary = ToolBoundary(store, {TOOL: tool.spec()})

    await boundary.invoke(RunContext(RUN), envelope())

    span = only_invocation_span(spans)
    assert (span.attributes or {})["error.type"] == "EXECUTION_FAILED"
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "EXECUTION_FAILED"
    assert not span.events  # no exception event: it would carry the tool's message


async def test_an_unknown_tool_names_no_tool(store: Store, spans: InMemorySpanExporter):
    """A name the boundary does not know stays out of the span name and attributes (an agent
    could send anything there)."""
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: FakeTool().spec()})

    await boundary.invoke(RunContext(RUN), envelope(tool="made_up_tool"))

    span = only_invocation_span(spans)
    assert span.name == "execute_tool"
    attributes = dict(span.attributes or {})
    assert "gen_ai.tool.name" not in attributes
    assert attributes["error.type"] == "UNKNOWN_TOOL"


async def test_the_span_nests_under_the_callers_span_and_the_tools_under_it(
    store: Store, spans: InMemorySpanExporter
):
    """Under the caller's current span; an async executor's, a worker-thread executor's and a
    projector's own spans nest under the invocation span."""
    await open_run(store)
    tracer = trace.get_tracer("tests.harness")

    async def async_executor(arguments: Any, call: ToolCall) -> Any:
        with tracer.start_as_current_span("async-executor"):
            await asyncio.sleep(0)
        return {"rows": 1}

    def thread_executor(arguments: Any, call: ToolCall) -> Any:
        with tracer.start_as_current_span("thread-executor"):
            return {"rows": 1}

    def projector(raw: Any, call: ToolCall) -> Projection:
        with tracer.start_as_current_span(f"projector-{call.tool}"):
            return Projection(result="ok", evidence_status="EVIDENCE_FOUND")

    boundary = ToolBoundary(
        store,
        {
            "alpha": ToolSpec(executor=async_executor, projector=projector),
            "beta": ToolSpec(executor=thread_executor, projector=projector),
        },
    )
    with tracer.start_as_current_span("agent-turn") as turn:
        await boundary.invoke(RunContext(RUN), envelope("a", tool="alpha"))
        await boundary.invoke(RunContext(RUN), envelope("b", tool="beta"))

    finished = {span.name: span for span in spans.get_finished_spans()}
    alpha, beta = finished["execute_tool alpha"], finished["execute_tool beta"]
    for span in (alpha, beta):
        assert span.parent is not None
        assert span.parent.span_id == turn.get_span_context().span_id
    for child, parent in [
        ("async-executor", alpha),
        ("projector-alpha", alpha),
        ("thread-executor", beta),
        ("projector-beta", beta),
    ]:
        assert finished[child].parent is not None, child
        assert finished[child].parent.span_id == parent.context.span_id, child
    assert trace.get_current_span() is trace.INVALID_SPAN  # the invocation span was detached


async def test_a_cancelled_call_ends_its_span_as_caller_cancelled(
    store: Store, spans: InMemorySpanExporter
):
    """The span of a call whose caller cancelled it ends, with error.type CALLER_CANCELLED."""
    await open_run(store)
    running = asyncio.Event()

    async def executor(arguments: Any, call: ToolCall) -> Any:
        running.set()
        await asyncio.Event().wait()

    boundary = ToolBoundary(store, {TOOL: ToolSpec(executor=executor, projector=executor)})
    task = asyncio.create_task(boundary.invoke(RunContext(RUN), envelope()))
    await running.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    span = only_invocation_span(spans)
    assert (span.attributes or {})["error.type"] == "CALLER_CANCELLED"
    assert span.status.status_code is StatusCode.ERROR


async def test_a_replayed_reply_is_marked(store: Store, spans: InMemorySpanExporter):
    """A reply answered from an earlier call's record says so (canon.replayed)."""
    await open_run(store)
    boundary = ToolBoundary(store, {TOOL: FakeTool().spec()}, on_duplicate="replay")

    await boundary.invoke(RunContext(RUN), envelope())
    await boundary.invoke(RunContext(RUN), envelope())

    first, second = invocation_spans(spans)
    assert "canon.replayed" not in (first.attributes or {})
    assert (second.attributes or {})["canon.replayed"] is True
    assert second.status.status_code is not StatusCode.ERROR


WITHOUT_OTEL = textwrap.dedent(
    """
    import asyncio, sys
    sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
    from datetime import timedelta
    from eventstore import Projection, RunContext, Store, ToolBoundary, ToolEnvelope, ToolSpec
    from eventstore.boundary import tracing

    async def main(url, namespace):
        async with Store.from_url(url, namespace=namespace) as store:
            await store.open_run("r", deadline=timedelta(minutes=1))
            spec = ToolSpec(
                executor=lambda arguments, call: {"ok": 1},
                projector=lambda raw, call: Projection(result=1, evidence_status="NO_EVIDENCE"),
            )
            reply = await ToolBoundary(store, {"t": spec}).invoke(
                RunContext("r"),
                ToolEnvelope(run_id="r", tool_call_id="c", tool="t", arguments={}),
            )
        loaded = [name for name, module in sys.modules.items()
                  if name.startswith("opentelemetry") and module is not None]
        print(type(reply).__name__, tracing.TRACING, loaded)

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


def test_without_the_package_nothing_is_imported_and_calls_work(redis_url: str, namespace: str):
    """With opentelemetry unimportable, the boundary imports, runs a call to READY and never
    loads any opentelemetry module."""
    path = os.environ.get("PYTHONPATH", "")
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_OTEL, redis_url, namespace],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), path]))},
    )

    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "ToolResult False []"


UNCONFIGURED = textwrap.dedent(
    """
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from eventstore.boundary import tracing

    before = tracing.tracing()
    trace.set_tracer_provider(TracerProvider())
    print(before, tracing.tracing())
    """
)


def tracing_answers(source: str, **environment: str | None) -> list[str]:
    """What ``source`` prints in a fresh interpreter, with ``environment`` changed
    (None: the variable is removed); the process must succeed."""
    env = {k: v for k, v in os.environ.items() if k not in environment}
    env.update({k: v for k, v in environment.items() if v is not None})
    result = subprocess.run(
        [sys.executable, "-c", source],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_with_the_package_but_no_provider_no_span_is_built():
    """The API installed by some dependency but never configured: calls are not traced
    (no no-op span built and ended per call); once a provider is set, the next call is."""
    answers = tracing_answers(UNCONFIGURED, OTEL_PYTHON_TRACER_PROVIDER=None)
    assert answers == ["False", "True"]


FROM_ENVIRONMENT = textwrap.dedent(
    """
    from eventstore.boundary import tracing

    print(tracing.tracing())
    """
)


def test_a_provider_named_in_the_environment_is_traced():
    """``OTEL_PYTHON_TRACER_PROVIDER`` names the provider, and nothing sets one in code:
    calls are traced from the first, as the API loads that provider."""
    answers = tracing_answers(FROM_ENVIRONMENT, OTEL_PYTHON_TRACER_PROVIDER="sdk_tracer_provider")
    assert answers == ["True"]


NO_OP = textwrap.dedent(
    """
    from opentelemetry import trace

    from eventstore.boundary import tracing

    trace.set_tracer_provider(trace.NoOpTracerProvider())
    print(tracing.tracing())
    """
)


def test_a_no_op_provider_set_in_code_is_not_traced():
    """A provider that records nothing, set on purpose, builds no span either."""
    assert tracing_answers(NO_OP, OTEL_PYTHON_TRACER_PROVIDER=None) == ["False"]
