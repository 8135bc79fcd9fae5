"""An MCP server with every feature the conformance suite's server scenarios exercise.

``python tests/support/mcp_everything_server.py [PORT]`` serves on stdio, or with a PORT
over streamable HTTP on 127.0.0.1 (``/mcp``). Written with the SDK's low-level ``Server``
from the scenarios' published expectations: tools with text, image, audio, embedded and
mixed content, logging, progress, an error, sampling, elicitation (with defaults and
enums), a raw JSON Schema 2020-12 input schema; static, binary, templated and
subscribable resources; four prompts; completion; logging levels. The proxy's tests
compare what a host sees directly and through ``canon mcp-proxy``.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.message import ServerMessageMetadata

logging.disable(logging.CRITICAL)

IMAGE = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8"
    "z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)
AUDIO = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="
EMPTY: dict[str, Any] = {"type": "object", "properties": {}}
SCHEMA_2020_12 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": False,
}
DEFAULTS_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "User name", "default": "John Doe"},
        "age": {"type": "integer", "description": "User age", "default": 30},
        "score": {"type": "number", "description": "User score", "default": 95.5},
        "status": {
            "type": "string",
            "description": "User status",
            "enum": ["active", "inactive", "pending"],
            "default": "active",
        },
        "verified": {"type": "boolean", "description": "Verification status", "default": True},
    },
    "required": [],
}
ENUMS_SCHEMA = {
    "type": "object",
    "properties": {
        "untitledSingle": {
            "type": "string",
            "description": "Select one option",
            "enum": ["option1", "option2", "option3"],
        },
        "titledSingle": {
            "type": "string",
            "description": "Select one option with titles",
            "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"},
            ],
        },
        "legacyEnum": {
            "type": "string",
            "description": "Select one option (legacy)",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {
            "type": "array",
            "description": "Select multiple options",
            "minItems": 1,
            "maxItems": 3,
            "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
        },
        "titledMulti": {
            "type": "array",
            "description": "Select multiple options with titles",
            "minItems": 1,
            "maxItems": 3,
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                    {"const": "value3", "title": "Third Choice"},
                ]
            },
        },
    },
    "required": [],
}

TOOLS: list[dict[str, Any]] = [
    {"name": "test_simple_text", "description": "Tests simple text content response"},
    {"name": "test_image_content", "description": "Tests image content response"},
    {"name": "test_audio_content", "description": "Tests audio content response"},
    {"name": "test_embedded_resource", "description": "Tests embedded resource content"},
    {"name": "test_multiple_content_types", "description": "Tests multiple content types"},
    {"name": "test_tool_with_logging", "description": "Emits log messages while it runs"},
    {"name": "test_tool_with_progress", "description": "Reports progress notifications"},
    {"name": "test_error_handling", "description": "Tests error response handling"},
    {
        "name": "test_sampling",
        "description": "Tests server-initiated sampling",
        "inputSchema": {
            "type": "object",
            "properties": {"prompt": {"type": "string"}},
            "required": ["prompt"],
        },
    },
    {
        "name": "test_elicitation",
        "description": "Tests server-initiated elicitation",
        "inputSchema": {
            "type": "object",
            "properties": {"message": {"type": "string"}},
            "required": ["message"],
        },
    },
    {"name": "test_elicitation_sep1034_defaults", "description": "Elicitation with defaults"},
    {"name": "test_elicitation_sep1330_enums", "description": "Elicitation with enum schemas"},
    {
        "name": "json_schema_2020_12_tool",
        "description": "Tool with JSON Schema 2020-12 features",
        "inputSchema": SCHEMA_2020_12,
    },
    {"name": "test_roots", "description": "Lists the client's roots"},
    {
        "name": "test_large_text",
        "description": "Answers `size` bytes of text (large results, as file reads give)",
        "inputSchema": {
            "type": "object",
            "properties": {"size": {"type": "integer"}},
            "required": ["size"],
        },
    },
]


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def result(*content: dict[str, Any], is_error: bool = False) -> types.CallToolResult:
    return types.CallToolResult.model_validate({"content": list(content), "isError": is_error})


async def list_tools(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    tools = [{"inputSchema": EMPTY, **tool} for tool in TOOLS]
    return types.ListToolsResult.model_validate({"tools": tools})


async def ask(ctx: ServerRequestContext[Any], method: str, params: dict[str, Any]) -> Any:
    """Send the host a request (sampling, elicitation, roots) on this call's stream."""
    request_types = {
        "sampling/createMessage": (types.CreateMessageRequest, types.CreateMessageResult),
        "elicitation/create": (types.ElicitRequest, types.ElicitResult),
        "roots/list": (types.ListRootsRequest, types.ListRootsResult),
    }
    request_type, result_type = request_types[method]
    request = request_type.model_validate({"method": method, "params": params})
    metadata = ServerMessageMetadata(related_request_id=ctx.request_id)
    return await ctx.session.send_request(request, result_type, metadata=metadata)


async def log(ctx: ServerRequestContext[Any], message: str) -> None:
    await ctx.session.send_log_message("info", message, related_request_id=ctx.request_id)


async def call_tool(
    ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    name, arguments = params.name, params.arguments or {}
    if name == "test_simple_text":
        return result(text("This is a simple text response for testing."))
    if name == "test_image_content":
        return result({"type": "image", "data": IMAGE, "mimeType": "image/png"})
    if name == "test_audio_content":
        return result({"type": "audio", "data": AUDIO, "mimeType": "audio/wav"})
    if name == "test_embedded_resource":
        resource = {
            "uri": "test://embedded-resource",
            "mimeType": "text/plain",
            "text": "This is an embedded resource content.",
        }
        return result({"type": "resource", "resource": resource})
    if name == "test_multiple_content_types":
        resource = {
            "uri": "test://mixed-content-resource",
            "mimeType": "application/json",
            "text": json.dumps({"test": "data", "value": 123}),
        }
        return result(
            text("Multiple content types test:"),
            {"type": "image", "data": IMAGE, "mimeType": "image/png"},
            {"type": "resource", "resource": resource},
        )
    if name == "test_tool_with_logging":
        for step in ("Tool execution started", "Tool processing data", "Tool execution completed"):
            await log(ctx, step)
        return result(text("Tool with logging executed successfully"))
    if name == "test_tool_with_progress":
        meta: Any = params.meta or {}
        token = meta.get("progress_token", meta.get("progressToken"))
        for done in (0, 50, 100):
            # A no-op when the host asked for no progress (no token).
            await ctx.session.report_progress(done, 100, f"Completed step {done} of 100")
        return result(text(str(token)))
    if name == "test_error_handling":
        return result(text("This tool intentionally returns an error for testing"), is_error=True)
    if name == "test_sampling":
        message = {"role": "user", "content": text(str(arguments.get("prompt", "")))}
        sampled = await ask(
            ctx, "sampling/createMessage", {"messages": [message], "maxTokens": 100}
        )
        content = sampled.content
        answer = getattr(content, "text", None) or "No response"
        return result(text(f"LLM response: {answer}"))
    if name.startswith("test_elicitation"):
        schema = {
            "test_elicitation": {
                "type": "object",
                "properties": {"response": {"type": "string", "description": "User's response"}},
                "required": ["response"],
            },
            "test_elicitation_sep1034_defaults": DEFAULTS_SCHEMA,
            "test_elicitation_sep1330_enums": ENUMS_SCHEMA,
        }[name]
        message = str(arguments.get("message", "Please fill in the form"))
        answer = await ask(
            ctx,
            "elicitation/create",
            {"mode": "form", "message": message, "requestedSchema": schema},
        )
        shown = json.dumps(answer.content or {})
        return result(text(f"Elicitation completed: action={answer.action}, content={shown}"))
    if name == "json_schema_2020_12_tool":
        return result(text(f"JSON Schema 2020-12 tool called with: {json.dumps(arguments)}"))
    if name == "test_roots":
        roots = await ask(ctx, "roots/list", {})
        return result(text(json.dumps([str(root.uri) for root in roots.roots])))
    if name == "test_large_text":
        return result(text("x" * int(arguments.get("size", 0))))
    raise ValueError(f"Unknown tool: {name}")


RESOURCES = [
    {
        "uri": "test://static-text",
        "name": "static-text",
        "title": "Static Text Resource",
        "description": "A static text resource for testing",
        "mimeType": "text/plain",
    },
    {
        "uri": "test://static-binary",
        "name": "static-binary",
        "title": "Static Binary Resource",
        "description": "A static binary resource (image) for testing",
        "mimeType": "image/png",
    },
    {
        "uri": "test://watched-resource",
        "name": "watched-resource",
        "title": "Watched Resource",
        "description": "A resource that can be subscribed to",
        "mimeType": "text/plain",
    },
]


async def list_resources(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListResourcesResult:
    return types.ListResourcesResult.model_validate({"resources": RESOURCES})


async def list_templates(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListResourceTemplatesResult:
    template = {
        "uriTemplate": "test://template/{id}/data",
        "name": "template",
        "title": "Resource Template",
        "description": "A resource template with parameter substitution",
        "mimeType": "application/json",
    }
    return types.ListResourceTemplatesResult.model_validate({"resourceTemplates": [template]})


async def read_resource(
    ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
) -> types.ReadResourceResult:
    uri = str(params.uri)
    if uri == "test://static-text":
        content = {
            "text": "This is the content of the static text resource.",
            "mimeType": "text/plain",
        }
    elif uri == "test://static-binary":
        content = {"blob": IMAGE, "mimeType": "image/png"}
    elif uri == "test://watched-resource":
        content = {"text": "Watched resource content", "mimeType": "text/plain"}
    elif uri.startswith("test://template/") and uri.endswith("/data"):
        item = uri.removeprefix("test://template/").removesuffix("/data")
        data = {"id": item, "templateTest": True, "data": f"Data for ID: {item}"}
        content = {"text": json.dumps(data), "mimeType": "application/json"}
    else:
        raise ValueError(f"Unknown resource: {uri}")
    return types.ReadResourceResult.model_validate({"contents": [{"uri": uri, **content}]})


async def subscribe(
    ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams
) -> types.EmptyResult:
    return types.EmptyResult()


async def unsubscribe(
    ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
) -> types.EmptyResult:
    return types.EmptyResult()


PROMPTS = [
    {"name": "test_simple_prompt", "title": "Simple Test Prompt", "description": "No arguments"},
    {
        "name": "test_prompt_with_arguments",
        "title": "Prompt With Arguments",
        "description": "A prompt with required arguments",
        "arguments": [
            {"name": "arg1", "description": "First test argument", "required": True},
            {"name": "arg2", "description": "Second test argument", "required": True},
        ],
    },
    {
        "name": "test_prompt_with_embedded_resource",
        "title": "Prompt With Embedded Resource",
        "description": "A prompt that includes an embedded resource",
        "arguments": [
            {"name": "resourceUri", "description": "URI of the resource to embed", "required": True}
        ],
    },
    {
        "name": "test_prompt_with_image",
        "title": "Prompt With Image",
        "description": "A prompt that includes image content",
    },
]


async def list_prompts(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListPromptsResult:
    return types.ListPromptsResult.model_validate({"prompts": PROMPTS})


async def get_prompt(
    ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams
) -> types.GetPromptResult:
    arguments = params.arguments or {}
    if params.name == "test_simple_prompt":
        messages = [{"role": "user", "content": text("This is a simple prompt for testing.")}]
    elif params.name == "test_prompt_with_arguments":
        said = (
            f"Prompt with arguments: arg1='{arguments.get('arg1')}', arg2='{arguments.get('arg2')}'"
        )
        messages = [{"role": "user", "content": text(said)}]
    elif params.name == "test_prompt_with_embedded_resource":
        resource = {
            "uri": arguments.get("resourceUri", "test://example-resource"),
            "mimeType": "text/plain",
            "text": "Embedded resource content for testing.",
        }
        messages = [
            {"role": "user", "content": {"type": "resource", "resource": resource}},
            {"role": "user", "content": text("Please process the embedded resource above.")},
        ]
    elif params.name == "test_prompt_with_image":
        messages = [
            {"role": "user", "content": {"type": "image", "data": IMAGE, "mimeType": "image/png"}},
            {"role": "user", "content": text("Please analyze the image above.")},
        ]
    else:
        raise ValueError(f"Unknown prompt: {params.name}")
    return types.GetPromptResult.model_validate({"messages": messages})


async def complete(
    ctx: ServerRequestContext[Any], params: types.CompleteRequestParams
) -> types.CompleteResult:
    return types.CompleteResult.model_validate(
        {"completion": {"values": [], "total": 0, "hasMore": False}}
    )


async def set_level(
    ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams
) -> types.EmptyResult:
    await ctx.session.send_log_message(
        "info", f"Log level set to: {params.level}", related_request_id=ctx.request_id
    )
    return types.EmptyResult()


server: Server[Any] = Server(
    "mcp-conformance-test-server",
    version="1.0.0",
    instructions="A server for conformance tests.",
    on_list_tools=list_tools,
    on_call_tool=call_tool,
    on_list_resources=list_resources,
    on_list_resource_templates=list_templates,
    on_read_resource=read_resource,
    on_subscribe_resource=subscribe,
    on_unsubscribe_resource=unsubscribe,
    on_list_prompts=list_prompts,
    on_get_prompt=get_prompt,
    on_completion=complete,
    on_set_logging_level=set_level,
)


async def serve_stdio() -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def serve_http(port: int) -> None:
    import uvicorn

    app = server.streamable_http_app(host="127.0.0.1")
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        serve_http(int(sys.argv[1]))
    else:
        import anyio

        anyio.run(serve_stdio)
