"""The framework adapters import their SDK only when imported, and fail in one clear line
without it (the base install: test_base_install_imports_no_sdk)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [
        ("canon.integrations.langchain", "langchain_core", "langchain"),
        ("canon.integrations.langgraph", "langgraph", "langgraph"),
        ("canon.integrations.pydantic_ai", "pydantic_ai", "pydantic-ai"),
        ("canon.integrations.smolagents", "smolagents", "smolagents"),
        ("canon.integrations.llamaindex", "llama_index", "llamaindex"),
    ],
)
def test_an_adapter_without_its_sdk_is_one_import_error_naming_the_extra(
    module: str, blocked: str, extra: str
) -> None:
    """With the SDK missing (blocked in sys.modules), the import fails naming the extra."""
    result = run(
        f"import sys\nsys.modules[{blocked!r}] = None\n"
        f"try:\n    import {module}\nexcept ImportError as error:\n    print(error)\n"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith(f"pip install 'canon-store[{extra}]'")


def test_the_adapters_import_no_cli() -> None:
    """An integration never pulls in the CLI."""
    result = run(
        "import sys, canon.integrations.langgraph, canon.integrations.pydantic_ai\n"
        "import canon.integrations.smolagents, canon.integrations.llamaindex\n"
        "print(sorted(m for m in sys.modules if m.startswith(('canon.cli', 'canon.commands'))))"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
