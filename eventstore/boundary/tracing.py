"""OpenTelemetry spans for tool invocations, when ``opentelemetry-api`` is installed.

Install the ``otel`` extra (``pip install 'canon-store[otel]'``) and configure a tracer
provider in the application as usual: each ``ToolBoundary.invoke`` is then one span
following the GenAI semantic conventions for tool execution:

| | |
|---|---|
| name | ``execute_tool {tool}`` (``execute_tool`` for a tool the boundary does not know) |
| kind | ``INTERNAL`` |
| ``gen_ai.operation.name`` | ``execute_tool`` |
| ``gen_ai.tool.name`` | the registered tool's name |
| ``gen_ai.tool.type`` | ``function`` |
| ``gen_ai.tool.call.id`` | the framework's tool call id (an unsafe id is left out) |
| ``canon.run_id``, ``canon.invocation_id`` | the run and the record's public id |
| ``canon.replayed`` | True when the reply was replayed from an earlier call's record |
| ``error.type`` | the error code, on an ERROR reply (status ERROR, described by the code) |

The span is the current span while the executor and the projector run, so spans they
start nest under it, in worker threads too (``asyncio.to_thread`` copies the context).
It nests under whatever span is current when ``invoke`` is called. Arguments, raw
responses and results are never recorded: they are payloads.

Without the package, :data:`TRACING` is False and the boundary skips every call here:
the import is tried once, when this module is imported. With the package but no tracer
provider configured, :func:`tracing` is False and the boundary skips the span too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from eventstore.boundary.contracts import AgentReply, ToolError
from machine.codes import ErrorCode

try:
    from opentelemetry import context as _context
    from opentelemetry import trace as _trace
except ImportError:  # the otel extra is not installed
    _context = None  # type: ignore[assignment]
    _trace = None  # type: ignore[assignment]

#: Whether invocations are traced (``opentelemetry-api`` importable).
TRACING: Final = _trace is not None

#: The instrumentation scope of every span here.
TRACER_NAME: Final = "canon"

#: The span attribute of each id the boundary knows of a call.
_ID_ATTRIBUTES: Final = (
    ("tool_call_id", "gen_ai.tool.call.id"),
    ("run_id", "canon.run_id"),
    ("invocation_id", "canon.invocation_id"),
)

_tracer: Any = _trace.get_tracer(TRACER_NAME) if _trace is not None else None
#: The providers that record nothing: the API's stand-in until an SDK provider is set.
_SILENT: Final = (
    (_trace.ProxyTracerProvider, _trace.NoOpTracerProvider) if _trace is not None else ()
)


def tracing() -> bool:
    """Whether a call is traced now: the API is installed and a real provider is set.

    With the API but no SDK provider (installed by a dependency, never configured),
    every span would be a no-op built and ended for nothing; one check skips it. A
    provider set later is seen by the next call.
    """
    return _trace is not None and not isinstance(_trace.get_tracer_provider(), _SILENT)


class InvocationSpan:
    """One invocation's span, current from its creation until :meth:`end`.

    Build it only when :data:`TRACING` is True.
    """

    __slots__ = ("_span", "_token")

    def __init__(self, tool: str | None, ids: Mapping[str, str | None]) -> None:
        """Start the span of a call to ``tool`` (None: unknown) with the call's ``ids``.

        ``ids`` holds ``run_id``, ``tool_call_id`` and ``invocation_id``, None when unsafe.
        """
        assert _trace is not None and _context is not None
        attributes: dict[str, str] = {"gen_ai.operation.name": "execute_tool"}
        if tool is not None:
            attributes["gen_ai.tool.name"] = tool
            attributes["gen_ai.tool.type"] = "function"
        for name, attribute in _ID_ATTRIBUTES:
            value = ids.get(name)
            if value is not None:
                attributes[attribute] = value
        self._span = _tracer.start_span(
            f"execute_tool {tool}" if tool is not None else "execute_tool",
            kind=_trace.SpanKind.INTERNAL,
            attributes=attributes,
        )
        self._token = _context.attach(_trace.set_span_in_context(self._span))

    def end(self, reply: AgentReply | None, *, replayed: bool = False) -> None:
        """End the span with ``reply``'s outcome; None: the call was cut short and re-raised."""
        assert _trace is not None and _context is not None
        span = self._span
        if replayed:
            span.set_attribute("canon.replayed", True)
        code = ErrorCode.CALLER_CANCELLED if reply is None else None
        if isinstance(reply, ToolError):
            code = reply.error_code
        if code is not None:
            span.set_attribute("error.type", code.value)
            span.set_status(_trace.Status(_trace.StatusCode.ERROR, code.value))
        _context.detach(self._token)
        span.end()
