"""Collect a single-server test module's tests into a cluster test module.

``globals().update(single_server_tests(module, exclude={...}))`` in ``tests/cluster/test_on_*.py``
makes pytest collect every test function of ``module`` (and the fixtures the module
defines) a second time under ``tests/cluster/``, where ``conftest.py`` turns
``redis_url``, ``redis_server`` and ``redis`` into the session cluster. The functions
are the very same objects: a test added to the single-server module runs on the cluster
too. ``exclude`` names what cannot run there, each with its reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any


def _is_fixture(value: Any) -> bool:
    # pytest >= 8.4 wraps fixtures in FixtureFunctionDefinition; older ones mark the function.
    return type(value).__name__ == "FixtureFunctionDefinition" or hasattr(
        value, "_pytestfixturefunction"
    )


def single_server_tests(
    module: ModuleType, *, exclude: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Every ``test_*`` function and every fixture of ``module``, minus ``exclude``.

    Args:
        module: a single-server test module.
        exclude: test names that cannot run on a cluster, each mapped to the reason.

    """
    skipped = dict(exclude or {})
    if any(not reason.strip() for reason in skipped.values()):
        raise ValueError("every excluded test needs its reason")
    found: dict[str, Any] = {}
    for name, value in vars(module).items():
        if name in skipped:
            continue
        if (name.startswith("test_") and callable(value)) or _is_fixture(value):
            found[name] = value
    if not any(name.startswith("test_") for name in found):
        raise ValueError(f"{module.__name__} has no test left to run on the cluster")
    return found
