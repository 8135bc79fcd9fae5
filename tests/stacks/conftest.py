"""Fixtures of the stacks' suites: each runs in a virtualenv of its own (scripts/test.sh).

The SDKs of these adapters (Strands, Agent Framework, Google ADK, CrewAI) pin versions the
main test extra cannot share, so each stack's tests run in ``.venv-stacks/<stack>`` with
``CANON_STACK=<stack>``; the main run does not collect them (tests/conftest.py). They reuse
the suite's fixtures (stores, namespaces, the log scan) on one private Redis 7.x server
(``REDIS_URL`` when set, as in the main suite): an adapter's behaviour does not depend on
the server's version, which the main suite covers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta

import pytest

from eventstore import SyncStore
from eventstore.server.embedded import EmbeddedRedis
from tests.conftest import STACK_ENV, embedded_binary

if not os.environ.get(STACK_ENV):
    # Named on the command line from the main venv: say how they run, not an ImportError.
    raise pytest.UsageError(
        "tests/stacks/<stack> runs in its own virtualenv: CANON_STACK=<stack> "
        ".venv-stacks/<stack>/bin/pytest tests/stacks/<stack> (scripts/test.sh makes it; "
        "see docs/development.md)"
    )


@pytest.fixture(scope="session")
def stack_redis_url() -> Iterator[str]:
    """The session's server: ``REDIS_URL`` as is, else a private Redis >= 7, stopped at the end."""
    if url := os.environ.get("REDIS_URL"):
        yield url
        return
    with EmbeddedRedis(embedded_binary("7.x")) as server:
        yield server.url


@pytest.fixture
def redis_url(stack_redis_url: str) -> str:
    """The stacks' server (one, not one per version: see the module's docstring)."""
    return stack_redis_url


@pytest.fixture
def sync_store(
    request: pytest.FixtureRequest, redis_url: str, namespace: str
) -> Iterator[SyncStore]:
    """A SyncStore with the test module's run open (its ``RUN``; the docs' blocks use
    "run-1"); closed after the test."""
    run_id = getattr(request.module, "RUN", "run-1")
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(run_id, deadline=timedelta(minutes=5))
        yield store
