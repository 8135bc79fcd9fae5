"""The client under test of the conformance suite's client scenarios: directly, or through
``canon mcp-proxy``.

``python tests/support/mcp_conformance_client.py [--through-proxy] URL`` (the suite appends
the URL of its scenario's server, and names the scenario in ``MCP_CONFORMANCE_SCENARIO``
and the protocol in ``MCP_CONFORMANCE_PROTOCOL_VERSION``). Directly, the official
``Client`` reaches the URL itself; with ``--through-proxy`` it reaches
``canon mcp-proxy --upstream-url URL`` on stdio instead (its embedded Redis in a temporary
folder), so the proxy is the HTTP client the scenario's server sees. Either way the host
does what a host does: list the tools, call each with arguments its schema asks for (a
tool named ``*echo*`` gets the first tool's input schema), answer elicitations with
their defaults, sampling and roots requests with fixed answers.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from typing import Any

import mcp_types as types
from mcp import StdioServerParameters
from mcp.client.client import Client
from mcp.client.stdio import stdio_client


def sample(schema: Any) -> Any:
    """A value of the JSON Schema ``schema`` (its default when it has one)."""
    if not isinstance(schema, dict):
        return "x"
    if "default" in schema:
        return schema["default"]
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if kind in ("number", "integer"):
        return 1
    if kind == "boolean":
        return True
    if kind == "array":
        return []
    if kind == "object":
        properties = schema.get("properties") or {}
        return {name: sample(properties[name]) for name in schema.get("required", [])}
    return "test"


async def answer_elicitation(context: Any, params: Any) -> types.ElicitResult:
    """Accept, with every field's default (what the user did not change)."""
    schema = getattr(params, "requested_schema", None) or {}
    properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
    content = {
        name: field["default"]
        for name, field in properties.items()
        if isinstance(field, dict) and "default" in field
    }
    return types.ElicitResult(action="accept", content=content)


async def answer_sampling(context: Any, params: Any) -> types.CreateMessageResult:
    """A fixed model answer."""
    return types.CreateMessageResult(
        role="assistant",
        content=types.TextContent(type="text", text="Paris"),
        model="test-model",
        stop_reason="endTurn",
    )


async def answer_roots(context: Any) -> types.ListRootsResult:
    """One root."""
    return types.ListRootsResult(roots=[types.Root(uri="file:///test/root", name="Test Root")])


async def drive(client: Client) -> None:
    """List the tools and call each; list and read resources and prompts when offered."""
    tools = (await client.list_tools()).tools
    first_schema = tools[0].input_schema if tools else {}
    for tool in tools:
        arguments = sample(tool.input_schema)
        if "echo" in tool.name and isinstance(arguments, dict):
            arguments = {
                "schema": first_schema,
                **{k: v for k, v in arguments.items() if k != "schema"},
            }
        try:
            await client.call_tool(tool.name, arguments)
        except Exception:
            continue


async def main(url: str, through_proxy: bool) -> None:
    protocol = os.environ.get("MCP_CONFORMANCE_PROTOCOL_VERSION", "")
    mode: Any = protocol if protocol.startswith("2026") else "legacy"
    callbacks: dict[str, Any] = {
        "elicitation_callback": answer_elicitation,
        "sampling_callback": answer_sampling,
        "list_roots_callback": answer_roots,
    }
    if not through_proxy:
        async with Client(url, mode=mode, **callbacks) as client:
            await drive(client)
        return
    with tempfile.TemporaryDirectory() as data:
        proxy = StdioServerParameters(
            command=sys.executable,
            args=["-m", "canon.cli", "mcp-proxy", f"--data-dir={data}", f"--upstream-url={url}"],
        )
        with open(os.devnull, "w") as quiet:  # noqa: ASYNC230  (set-up, before any I/O)
            async with Client(stdio_client(proxy, errlog=quiet), mode=mode, **callbacks) as client:  # type: ignore[arg-type]
                await drive(client)


if __name__ == "__main__":
    arguments = sys.argv[1:]
    through = "--through-proxy" in arguments
    asyncio.run(main([a for a in arguments if a != "--through-proxy"][-1], through))
