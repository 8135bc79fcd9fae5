"""CrewAI's tests: its telemetry and trace collection off before it is imported.

CrewAI sends anonymous telemetry and offers trace collection over the network by
default; the suite makes no network call, so both are switched off the documented way.
"""

from __future__ import annotations

import os

import pytest

os.environ["CREWAI_DISABLE_TELEMETRY"] = "true"
os.environ["CREWAI_TRACING_ENABLED"] = "false"
os.environ["OTEL_SDK_DISABLED"] = "true"


def pytest_configure(config: pytest.Config) -> None:
    """The suite turns warnings into errors; CrewAI's own (its import warns about its lazy
    submodules, and it reads its own deprecated fields, ``function_calling_llm`` and the
    ones pydantic names only "deprecated", on every agent and kickoff) are let through,
    canon's are not."""
    config.addinivalue_line(
        "filterwarnings", "ignore:Cannot set an attribute on 'crewai:ImportWarning"
    )
    config.addinivalue_line(
        "filterwarnings", "ignore:function_calling_llm is deprecated:DeprecationWarning"
    )
    config.addinivalue_line("filterwarnings", "ignore:deprecated$:DeprecationWarning")
