"""Through ``canon mcp-proxy`` on stdio a host sees what it sees directly, tools recorded.

The host is the SDK's client with sampling, elicitation, roots, logging and progress
callbacks; the upstream is tests/support/mcp_everything_server.py on stdio. Every
feature is exercised once directly and once through a real proxy process, and the two
transcripts must be equal but for the ids canon adds to tool results.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from eventstore import Store
from machine.codes import Status
from tests.support.log_scan import LOG_FORBIDDEN

ROOT = Path(__file__).parents[3]
EVERYTHING = [sys.executable, str(ROOT / "tests" / "support" / "mcp_everything_server.py")]
RUN = "run-passthrough"
CANON_KEYS = ("io.canon/run_id", "io.canon/tool_call_id", "io.canon/invocation_id")

pytestmark = [
    pytest.mark.timeout(120),
    # Subscriptions and logging levels are deprecated by a later spec, not by the ones
    # hosts speak today (2025-06-18, 2025-11-25): the proxy must still carry them.
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]


#: W3C trace context the MCP SDK adds to ``_meta`` when a span is current (in a process
#: where OpenTelemetry is configured): fresh ids on every request, directly or through
#: the proxy, so only their presence is compared.
TRACE_CONTEXT = frozenset({"traceparent", "tracestate"})


def heard_params(params: Any) -> dict[str, Any]:
    """A server-to-host request's params as JSON, trace context ids replaced by their names."""
    dumped: dict[str, Any] = params.model_dump(mode="json", exclude_none=True)
    meta = dumped.get("meta")
    if isinstance(meta, dict):
        dumped["meta"] = {
            key: f"<{key}>" if key in TRACE_CONTEXT else value for key, value in meta.items()
        }
    return dumped


class Host:
    """What a desktop host answers and what it hears, written down as it happens."""

    def __init__(self) -> None:
        self.heard: list[Any] = []

    async def sampling(self, context: Any, params: types.CreateMessageRequestParams) -> Any:
        self.heard.append(("sampling", heard_params(params)))
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="sampled"), model="m"
        )

    async def elicitation(self, context: Any, params: types.ElicitRequestParams) -> Any:
        self.heard.append(("elicitation", heard_params(params)))
        return types.ElicitResult(action="accept", content={"response": "yes"})

    async def roots(self, context: Any) -> Any:
        self.heard.append(("roots",))
        return types.ListRootsResult(roots=[types.Root(uri="file:///work/project")])

    async def logging(self, params: types.LoggingMessageNotificationParams) -> None:
        self.heard.append(("log", params.level, params.data))

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        self.heard.append(("progress", progress, total, message))


@asynccontextmanager
async def session_on(argv: list[str], host: Host, errlog: Any) -> AsyncIterator[Any]:
    parameters = StdioServerParameters(
        command=argv[0], args=argv[1:], env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=str(ROOT)
    )
    async with (
        stdio_client(parameters, errlog=errlog) as (read, write),
        ClientSession(
            read,
            write,
            sampling_callback=host.sampling,
            elicitation_callback=host.elicitation,
            list_roots_callback=host.roots,
            logging_callback=host.logging,
        ) as session,
    ):
        yield session


def plain(value: Any) -> Any:
    """A result as JSON, without the ids canon adds to tool results."""
    dumped = value.model_dump(mode="json", by_alias=True, exclude_none=True)
    meta = dumped.get("_meta")
    if isinstance(meta, dict):
        meta = {key: item for key, item in meta.items() if key not in CANON_KEYS}
        if meta:
            dumped["_meta"] = meta
        else:
            del dumped["_meta"]
    return dumped


async def transcript(session: Any, host: Host) -> list[Any]:
    """Every feature once, in order: what the host got back and what it heard meanwhile."""
    said: list[Any] = []
    initialized = await session.initialize()
    said.append(("server", initialized.server_info.name, initialized.instructions))
    said.append(("capabilities", plain(initialized.capabilities)))
    said.append(plain(await session.list_prompts()))
    for name, arguments in (
        ("test_simple_prompt", None),
        ("test_prompt_with_arguments", {"arg1": "a", "arg2": "b"}),
        ("test_prompt_with_embedded_resource", {"resourceUri": "test://example-resource"}),
        ("test_prompt_with_image", None),
    ):
        said.append(plain(await session.get_prompt(name, arguments)))
    said.append(plain(await session.list_resources()))
    said.append(plain(await session.list_resource_templates()))
    for uri in ("test://static-text", "test://static-binary", "test://template/7/data"):
        said.append(plain(await session.read_resource(uri)))
    said.append(plain(await session.subscribe_resource("test://watched-resource")))
    said.append(plain(await session.unsubscribe_resource("test://watched-resource")))
    said.append(
        plain(
            await session.complete(
                types.PromptReference(type="ref/prompt", name="test_prompt_with_arguments"),
                {"name": "arg1", "value": "a"},
            )
        )
    )
    said.append(plain(await session.set_logging_level("debug")))
    said.append(plain(await session.send_ping()))
    said.append(plain(await session.list_tools()))
    for name, arguments in (
        ("test_sampling", {"prompt": "hello"}),
        ("test_elicitation", {"message": "confirm?"}),
        ("test_roots", {}),
        ("test_tool_with_logging", {}),
        ("test_image_content", {}),
        ("test_multiple_content_types", {}),
    ):
        said.append(plain(await session.call_tool(name, arguments)))
    progressed = await session.call_tool(
        "test_tool_with_progress", {}, progress_callback=host.progress
    )
    said.append(plain(progressed).get("isError", False))
    said.append(list(host.heard))
    return said


async def test_a_host_sees_through_the_proxy_what_it_sees_directly(
    redis_url: str, namespace: str, tmp_path: Path, make_store: Any
) -> None:
    """Prompts, resources, completion, logging, progress, sampling, elicitation, roots."""
    direct_host, proxied_host = Host(), Host()
    with (tmp_path / "direct.stderr").open("w") as errlog:
        async with session_on(EVERYTHING, direct_host, errlog) as session:
            direct = await transcript(session, direct_host)
    proxy = [
        sys.executable,
        "-m",
        "canon.cli",
        "mcp-proxy",
        f"--redis-url={redis_url}",
        f"--namespace={namespace}",
        f"--run-id={RUN}",
        "--",
        *EVERYTHING,
    ]
    log = tmp_path / "proxy.stderr"
    with log.open("w") as errlog:
        async with session_on(proxy, proxied_host, errlog) as session:
            proxied = await transcript(session, proxied_host)
    assert proxied == direct
    kinds = {entry[0] for entry in proxied_host.heard}
    assert {"sampling", "elicitation", "roots", "log", "progress"} <= kinds

    # Only the seven tools/call went through the boundary.
    store: Store = make_store()
    run = await store.run_info(RUN)
    assert run is not None and run.invocations == 7
    text = log.read_text()
    assert not [fragment for fragment in (*LOG_FORBIDDEN, "Traceback") if fragment in text]


async def test_results_of_several_mib_pass_and_a_limit_names_its_flag(
    redis_url: str, namespace: str, tmp_path: Path, make_store: Any
) -> None:
    """A 3 MiB result is recorded and returned whole; over --max-result-bytes, the flag."""
    store: Store = make_store()
    proxy = [
        sys.executable,
        "-m",
        "canon.cli",
        "mcp-proxy",
        f"--redis-url={redis_url}",
        f"--namespace={namespace}",
        f"--run-id={RUN}",
    ]
    with (tmp_path / "proxy.stderr").open("w") as errlog:
        async with session_on([*proxy, "--", *EVERYTHING], Host(), errlog) as session:
            await session.initialize()
            big = await session.call_tool("test_large_text", {"size": 3 * 1024 * 1024})
        async with session_on(
            [*proxy, "--max-result-bytes=65536", "--", *EVERYTHING], Host(), errlog
        ) as session:
            await session.initialize()
            refused = await session.call_tool("test_large_text", {"size": 100_000})
    [block] = big.content
    assert isinstance(block, types.TextContent) and len(block.text) == 3 * 1024 * 1024
    assert big.meta is not None
    record = await store.get(RUN, big.meta["io.canon/tool_call_id"])
    assert record is not None and record.state.status is Status.READY
    assert refused.is_error
    [block] = refused.content
    assert isinstance(block, types.TextContent)
    error = json.loads(block.text)
    assert error["error_code"] == "RESULT_TOO_LARGE"
    assert "--max-result-bytes" in error["limit"]
