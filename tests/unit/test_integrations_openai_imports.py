"""The OpenAI extras: the base install imports neither SDK; a missing SDK is one clear error."""

from __future__ import annotations

import subprocess
import sys

import pytest

SDK_MODULES = ("openai", "agents")


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (a clean ``sys.modules``)."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_base_install_imports_no_openai_sdk() -> None:
    """The store, the projections, the CLI and the integrations package import no SDK."""
    result = run_python(
        "import sys, eventstore, projections, canon.cli, canon.integrations, "
        "canon.integrations._shared\n"
        f"print(sorted(m for m in {SDK_MODULES!r} if m in sys.modules))"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


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
