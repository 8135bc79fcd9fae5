"""An MCP server with every feature the conformance suite's server scenarios exercise.

``python tests/support/mcp_everything_server.py [PORT]`` serves on stdio, or with a PORT
over streamable HTTP on 127.0.0.1 (``/mcp``). Written with the SDK's low-level ``Server``
from the scenarios' published expectations: tools with text, image, audio, embedded and
mixed content, logging, progress, an error, sampling, elicitation (with defaults and
enums), a raw JSON Schema 2020-12 input schema; static, binary, templated and
subscribable resources; four prompts; completion; logging levels; and, for 2026-07-28,
InputRequiredResult tools and a prompt (one input request of each kind, several at once,
several rounds, an HMAC-signed ``requestState`` that refuses tampering, requests limited
to the capabilities the client declared). The proxy's tests compare what a host sees
directly and through ``canon mcp-proxy``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import secrets
import sys
from collections.abc import Mapping
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
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
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
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
    *(
        {
            "name": f"test_input_required_result_{kind}",
            "description": f"InputRequiredResult: {kind}",
        }
        for kind in (
            "elicitation",
            "sampling",
            "list_roots",
            "request_state",
            "multiple_inputs",
            "multi_round",
            "tampered_state",
            "capabilities",
        )
    ),
    {"name": "test_missing_capability", "description": "Needs the client's sampling"},
    {
        "name": "test_custom_headers",
        "description": "A parameter mirrored into an Mcp-Param header (2026-07-28)",
        "inputSchema": {
            "type": "object",
            "properties": {"region": {"type": "string", "x-mcp-header": "Region"}},
            "required": ["region"],
        },
    },
    {"name": "test_reconnection", "description": "Answers after a pause (SSE polling)"},
    {"name": "test_streaming_elicitation", "description": "Asks for input (2026-07-28)"},
    {"name": "test_logging_tool", "description": "Logs only when the request opts in"},
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
) -> types.CallToolResult | types.InputRequiredResult:
    name, arguments = params.name, params.arguments or {}
    if name.startswith("test_input_required_result_"):
        return call_input_required(ctx, name.removeprefix("test_input_required_result_"))
    if name == "test_missing_capability" and "sampling" not in declared(ctx):
        # 2026-07-28: a request that needs a capability the client did not declare.
        data = {"requiredCapabilities": {"sampling": {}}}
        raise MCPError(-32021, "Missing required client capability: sampling", data)
    if name == "test_missing_capability":
        return result(text("sampling is declared"))
    if name == "test_streaming_elicitation":
        # An input request in the result, never a request on the response stream.
        form = ask_form("What should the stream carry?", "answer")
        return input_required({"answer": form})
    if name == "test_custom_headers":
        return result(text(f"region: {arguments.get('region')}"))
    if name == "test_reconnection":
        # Served without an event store, so the stream stays open: the answer comes on it.
        return result(text("Reconnection test completed"))
    if name == "test_logging_tool":
        meta = (ctx.params or {}).get("_meta") or {}
        if "io.modelcontextprotocol/logLevel" in meta or ctx.protocol_version < "2026":
            await log(ctx, "test_logging_tool ran")
        return result(text("logged only when asked"))
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


# -- InputRequiredResult (2026-07-28) ------------------------------------------------------

_STATE_KEY = secrets.token_bytes(32)


def sign(state: dict[str, Any]) -> str:
    """An integrity-protected ``requestState``: the state's JSON and its HMAC."""
    body = base64.urlsafe_b64encode(json.dumps(state).encode()).decode()
    tag = hmac.new(_STATE_KEY, body.encode(), hashlib.sha256).hexdigest()
    return f"{body}.{tag}"


def verified(token: str | None) -> dict[str, Any] | None:
    """The state a ``requestState`` carries, or an error when it was tampered with."""
    if token is None:
        return None
    body, _, tag = token.rpartition(".")
    expected = hmac.new(_STATE_KEY, body.encode(), hashlib.sha256).hexdigest()
    if not body or not hmac.compare_digest(tag, expected):
        raise MCPError(-32602, "requestState failed its integrity check")
    return dict(json.loads(base64.urlsafe_b64decode(body)))


def ask_form(message: str, field: str, kind: str = "string") -> dict[str, Any]:
    schema = {"type": "object", "properties": {field: {"type": kind}}, "required": [field]}
    return {
        "method": "elicitation/create",
        "params": {"message": message, "requestedSchema": schema},
    }


def ask_model(text_: str, max_tokens: int) -> dict[str, Any]:
    message = {"role": "user", "content": {"type": "text", "text": text_}}
    return {
        "method": "sampling/createMessage",
        "params": {"messages": [message], "maxTokens": max_tokens},
    }


ASK_ROOTS: dict[str, Any] = {"method": "roots/list", "params": {}}


def input_required(requests: dict[str, Any], state: str | None = None) -> types.InputRequiredResult:
    body: dict[str, Any] = {"resultType": "input_required", "inputRequests": requests}
    if state is not None:
        body["requestState"] = state
    return types.InputRequiredResult.model_validate(body)


def answered(responses: Mapping[str, Any], key: str, field: str | None = None) -> Any:
    """The accepted form field (or the whole response) under ``key``, else None."""
    response = responses.get(key)
    if not isinstance(response, Mapping):
        return None
    if field is None:
        return response
    content = response.get("content")
    if response.get("action") != "accept" or not isinstance(content, Mapping):
        return None
    return content.get(field)


def sampled_text(response: Any) -> str | None:
    content = response.get("content") if isinstance(response, Mapping) else None
    text_ = content.get("text") if isinstance(content, Mapping) else None
    return text_ if isinstance(text_, str) else None


def declared(ctx: ServerRequestContext[Any]) -> Mapping[str, Any]:
    """The client capabilities of this request's envelope (2026-07-28)."""
    meta = (ctx.params or {}).get("_meta") or {}
    capabilities = meta.get("io.modelcontextprotocol/clientCapabilities")
    return capabilities if isinstance(capabilities, Mapping) else {}


def call_input_required(
    ctx: ServerRequestContext[Any], kind: str
) -> types.CallToolResult | types.InputRequiredResult:
    """The InputRequiredResult tools: round 1 asks, a later round answers (or asks again)."""
    raw = ctx.params or {}
    given = raw.get("inputResponses")
    responses: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
    state = verified(raw.get("requestState"))
    if kind == "elicitation":
        name = answered(responses, "user_name", "name")
        if name is None:
            return input_required({"user_name": ask_form("What is your name?", "name")})
        return result(text(f"Hello, {name}!"))
    if kind == "sampling":
        said = sampled_text(answered(responses, "capital_question"))
        if said is None:
            return input_required(
                {"capital_question": ask_model("What is the capital of France?", 100)}
            )
        return result(text(f"The model said: {said}"))
    if kind == "list_roots":
        roots = answered(responses, "client_roots")
        listed = roots.get("roots") if isinstance(roots, Mapping) else None
        if not isinstance(listed, list):
            return input_required({"client_roots": ASK_ROOTS})
        uris = [str(root.get("uri")) for root in listed if isinstance(root, Mapping)]
        return result(text(f"Roots: {', '.join(uris)}"))
    if kind in ("request_state", "tampered_state"):
        if state is None or answered(responses, "confirm", "ok") is None:
            confirm = ask_form("Please confirm", "ok", "boolean")
            return input_required({"confirm": confirm}, sign({"tool": kind}))
        return result(text("Confirmed: state-ok"))
    if kind == "multiple_inputs":
        name = answered(responses, "user_name", "name")
        greeting = sampled_text(answered(responses, "greeting"))
        roots = answered(responses, "client_roots")
        if state is None or name is None or greeting is None or roots is None:
            requests = {
                "user_name": ask_form("What is your name?", "name"),
                "greeting": ask_model("Generate a greeting", 50),
                "client_roots": ASK_ROOTS,
            }
            return input_required(requests, sign({"round": 1}))
        return result(text(f"{greeting}, {name}"))
    if kind == "multi_round":
        step = state.get("step") if state is not None else None
        if step == 1 and (name := answered(responses, "step1", "name")) is not None:
            color = ask_form("Step 2: What is your favorite color?", "color")
            return input_required({"step2": color}, sign({"step": 2, "name": name}))
        if step == 2 and state is not None:
            color = answered(responses, "step2", "color")
            if color is not None:
                return result(text(f"{state['name']} likes {color}"))
            again = ask_form("Step 2: What is your favorite color?", "color")
            return input_required({"step2": again}, sign(state))
        first = ask_form("Step 1: What is your name?", "name")
        return input_required({"step1": first}, sign({"step": 1}))
    # capabilities: ask only for what the client declared it can answer.
    capabilities = declared(ctx)
    requests: dict[str, Any] = {}
    if "sampling" in capabilities and answered(responses, "model") is None:
        requests["model"] = ask_model("Say hello", 20)
    if "elicitation" in capabilities and answered(responses, "form") is None:
        requests["form"] = ask_form("Anything to add?", "note")
    if "roots" in capabilities and answered(responses, "roots") is None:
        requests["roots"] = ASK_ROOTS
    if requests:
        return input_required(requests)
    return result(text("Nothing more to ask"))


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
    {
        "name": "test_input_required_result_prompt",
        "title": "Prompt With Input",
        "description": "A prompt that asks the client for its context first (2026-07-28)",
    },
]


async def list_prompts(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListPromptsResult:
    return types.ListPromptsResult.model_validate({"prompts": PROMPTS})


async def get_prompt(
    ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams
) -> types.GetPromptResult | types.InputRequiredResult:
    arguments = params.arguments or {}
    if params.name == "test_input_required_result_prompt":
        given = (ctx.params or {}).get("inputResponses")
        context = answered(given if isinstance(given, Mapping) else {}, "user_context", "context")
        if context is None:
            form = ask_form("What context should the prompt use?", "context")
            return input_required({"user_context": form})
        said = f"Use this context: {context}"
        return types.GetPromptResult.model_validate(
            {"messages": [{"role": "user", "content": text(said)}]}
        )
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
