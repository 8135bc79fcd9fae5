"""The OpenAI extras: without its SDK, an adapter is one clear ImportError naming the extra."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (a clean ``sys.modules``)."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [
        ("canon.integrations.openai", "openai", "openai"),
        ("canon.integrations.openai_agents", "agents", "openai_agents"),
    ],
)
def test_an_adapter_without_its_sdk_names_the_extra(module: str, blocked: str, extra: str) -> None:
    """Importing the adapter where the SDK is absent raises one ImportError naming the
    extra to install, and nothing else."""
    result = run_python(
        f"import sys\nsys.modules[{blocked!r}] = None  # as if it were not installed\n"
        f"try:\n    import {module}\nexcept ImportError as error:\n    print(error)\n"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == (
        f"canon.integrations.{extra} needs the {blocked!r} package: "
        f"pip install 'canon-store[{extra}]'"
    )
    assert result.stderr == ""
