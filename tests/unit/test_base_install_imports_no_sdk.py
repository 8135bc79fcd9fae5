"""The product without extras: importing it loads no model SDK."""

from __future__ import annotations

import importlib.util
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
    "smolagents",
    "llama_index",
    # The stacks tested in virtualenvs of their own (tests/stacks, scripts/test.sh).
    "strands",
    "agent_framework",
    "google.adk",
    "crewai",
)

#: The adapters of those stacks, each with its extra and its SDK's top-level module.
STACK_ADAPTERS = (
    ("canon.integrations.strands", "strands", "strands"),
    ("canon.integrations.agent_framework", "agent_framework", "agent_framework"),
    ("canon.integrations.google_adk", "google_adk", "google.adk"),
    ("canon.integrations.crewai", "crewai", "crewai"),
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
    assert "smolagents" in sdks_loaded_by("canon.integrations.smolagents")
    assert "anthropic" not in sdks_loaded_by("canon.integrations.smolagents")
    assert "llama_index" in sdks_loaded_by("canon.integrations.llamaindex")
    assert "smolagents" not in sdks_loaded_by("canon.integrations.llamaindex")


def test_a_stack_adapter_without_its_sdk_names_its_extra() -> None:
    """This virtualenv has none of the SDKs tested in tests/stacks: importing each of their
    adapters fails with the one line that names its extra, and loads no other SDK."""
    for module, extra, sdk in STACK_ADAPTERS:
        assert importlib.util.find_spec(sdk) is None, f"{sdk} is installed in the main venv"
        code = (
            "import importlib, json, sys\n"
            "try:\n"
            f"    importlib.import_module({module!r})\n"
            "except ImportError as error:\n"
            "    print(json.dumps([str(error), sorted(m for m in sys.modules "
            f"if m in {SDKS!r})]))\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
        )
        message, loaded = json.loads(result.stdout)
        assert message == (
            f"canon.integrations.{extra} needs the {sdk!r} package: "
            f"pip install 'canon-store[{extra}]'"
        )
        assert loaded == []
