"""The product without extras: importing it loads no model SDK."""

from __future__ import annotations

import json
import subprocess
import sys

#: The top-level modules of every SDK an integration extra installs.
SDKS = (
    "anthropic",
    "google.genai",
    "openai",
    "agents",
    "langchain_core",
    "langgraph",
    "pydantic_ai",
    "mcp",
    "mcp_types",
)


def sdks_loaded_by(*modules: str) -> list[str]:
    """The SDK modules in ``sys.modules`` of a fresh interpreter that imported ``modules``."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n    importlib.import_module(name)\n"
        # The whole parser: every subcommand module, canon mcp-proxy's included.
        "import canon.cli\ncanon.cli.build_parser()\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m in {SDKS!r})))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return list(json.loads(result.stdout))


def test_the_packages_and_the_cli_import_no_sdk() -> None:
    """eventstore, projections, the CLI (every subcommand) and canon.integrations itself
    leave every SDK unloaded, though the test extra has them installed."""
    base = (
        "machine",
        "eventstore",
        "projections",
        "canon.cli",
        "canon.integrations",
        "canon.integrations._shared",
    )
    assert sdks_loaded_by(*base) == []


def test_an_adapter_loads_its_own_sdk_not_the_others() -> None:
    """The probe above sees an SDK once an adapter is imported, so it cannot pass blind.

    (google-genai itself imports ``mcp`` when that is installed: its own choice.)
    """
    assert sdks_loaded_by("canon.integrations.anthropic") == ["anthropic"]
    assert "google.genai" in sdks_loaded_by("canon.integrations.gemini")
    assert "anthropic" not in sdks_loaded_by("canon.integrations.gemini")
