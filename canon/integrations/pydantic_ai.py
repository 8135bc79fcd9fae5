"""A Pydantic AI toolset whose every call goes through a canon boundary.

``BoundaryToolset(boundary, TOOLS, run_id=...)`` is an
:class:`~pydantic_ai.toolsets.AbstractToolset`: it lists one tool per entry of ``TOOLS``
(the boundary's ``ToolSpec``s, whose ``description`` and ``input_schema`` the model sees,
or ToolSchemas) and sends each call to the
boundary with Pydantic AI's own ``ctx.tool_call_id`` and the harness's run id (a string,
or a function of the run context, e.g. ``lambda ctx: ctx.deps.run_id``). The arguments
reach the boundary as the model sent them (no schema validation here: the boundary
decides what is INVALID_INPUT); a call without arguments is ``{}``.

Replies:

- a result is returned as the bounded value, which Pydantic AI sends as the tool return;
- an error raises :class:`~pydantic_ai.exceptions.ToolFailed` with the safe error JSON,
  which Pydantic AI turns into a ``ToolReturnPart(outcome="failed")``: the provider's
  native error result (Anthropic ``is_error``, ...), the run goes on, and no retry budget
  is spent. ``ModelRetry`` would instead ask the model to call again, which a refused or
  failed canon call (its id is recorded) cannot honour.

A name the toolset does not list never reaches canon: Pydantic AI answers it with its
own retry prompt. A listed name the boundary does not know answers UNKNOWN_TOOL.

``agent.run`` may use a ``ToolBoundary`` on its store's loop or a
:class:`~eventstore.SyncBoundary`; ``agent.run_sync`` runs a loop of its own, so it needs
a ``SyncBoundary`` (an async store used from another loop raises ``WrongEventLoop``).
Pydantic AI generates ids for providers that send none, so for them a re-sent turn is a
new call, not a replay.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from canon.integrations._shared import (
    ToolSchema,
    invoke_awaiting,
    is_error,
    reply_content,
    reply_payload,
    require,
    tool_schemas,
)

require("pydantic_ai", "pydantic-ai")

from pydantic_ai import RunContext as AgentContext  # noqa: E402
from pydantic_ai.exceptions import ToolFailed  # noqa: E402
from pydantic_ai.tools import ToolDefinition  # noqa: E402
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool  # noqa: E402
from pydantic_core import SchemaValidator, core_schema  # noqa: E402

from eventstore.boundary.contracts import RunContext, ToolEnvelope, ToolSpec  # noqa: E402
from eventstore.boundary.tool_boundary import ToolBoundary  # noqa: E402
from eventstore.sync import SyncBoundary  # noqa: E402

__all__ = ["BoundaryToolset"]

# Any JSON value passes: the boundary, not the toolset, refuses what is not an object.
_AS_SENT = SchemaValidator(schema=core_schema.any_schema())


class BoundaryToolset(AbstractToolset[Any]):
    """The tools of ``schemas``, each call run by ``boundary``.

    Args:
        boundary: a ``SyncBoundary`` (``run`` and ``run_sync``) or a ``ToolBoundary``
            (``run`` on its store's loop).
        schemas: by tool name, what the model sees: the boundary's own ToolSpecs (their
            ``description`` and ``input_schema``, any object without one), or
            ToolSchemas (description and arguments' JSON Schema).
        run_id: the canon run of the agent run: a string, or a function of the run
            context (``lambda ctx: ctx.deps.run_id``).
        max_retries: how often the model may re-send a call whose arguments are not
            JSON (Pydantic AI's retry prompt); canon's errors spend none.
        id: the toolset's id among the agent's toolsets.

    """

    def __init__(
        self,
        boundary: ToolBoundary | SyncBoundary,
        schemas: Mapping[str, ToolSpec | ToolSchema],
        *,
        run_id: str | Callable[[AgentContext[Any]], str],
        max_retries: int = 1,
        id: str | None = None,
    ) -> None:
        self.boundary = boundary
        self.run_id = run_id
        self.max_retries = max_retries
        self._id = id
        self._definitions = [
            ToolDefinition(
                name=name,
                description=schema["description"] or None,
                parameters_json_schema=schema["parameters"],
            )
            for name, schema in tool_schemas(schemas).items()
        ]

    @property
    def id(self) -> str | None:
        """The toolset's id, if one was given."""
        return self._id

    async def get_tools(self, ctx: AgentContext[Any]) -> dict[str, ToolsetTool[Any]]:
        """One tool per schema; arguments pass unvalidated to the boundary."""
        return {
            definition.name: ToolsetTool(
                toolset=self,
                tool_def=definition,
                max_retries=self.max_retries,
                args_validator=_AS_SENT,
            )
            for definition in self._definitions
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: AgentContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        """Run the call through the boundary; return the bounded result.

        Raises:
            ToolFailed: the boundary answered an error; the message is the safe error JSON.

        """
        run_id = self.run_id if isinstance(self.run_id, str) else self.run_id(ctx)
        envelope = ToolEnvelope(
            run_id=run_id, tool_call_id=ctx.tool_call_id or "", tool=name, arguments=tool_args
        )
        reply = await invoke_awaiting(self.boundary, RunContext(run_id), envelope)
        if is_error(reply):
            raise ToolFailed(reply_content(reply))
        return reply_payload(reply)
