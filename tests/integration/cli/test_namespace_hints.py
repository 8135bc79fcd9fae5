"""A read-only command that finds nothing in its namespace says which namespaces hold runs
(or the run it was asked about), found by a bounded SCAN of key names, never a read of
another namespace's keys."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from eventstore import RunContext, Store, ToolBoundary, ToolResult
from eventstore.audit.namespaces import other_namespaces
from eventstore.server.embedded import EmbeddedRedis
from machine.ids import invocation_id
from tests.integration.audit.test_replay import run_cli
from tests.security.test_acl import admin, denials, server, url_of  # noqa: F401 (fixtures)
from tests.support.calls import RUN, TOOL, envelope
from tests.support.tools import FakeTool

pytestmark = pytest.mark.backends("single", "cluster")


async def one_call(url: str, namespace: str, run_id: str = RUN, **options: Any) -> None:
    """Open ``run_id`` in ``namespace`` and make one READY call in it."""
    async with Store.from_url(url, namespace=namespace, **options) as store:
        await store.open_run(run_id, deadline=timedelta(minutes=5))
        reply = await ToolBoundary(store, {TOOL: FakeTool().spec()}).invoke(
            RunContext(run_id), envelope(run_id=run_id)
        )
        assert isinstance(reply, ToolResult), reply


@pytest.fixture
def private_url(start_server: Any) -> str:
    """A private server of each supported version: only this test's namespaces are in it."""
    embedded: EmbeddedRedis = start_server()
    return embedded.url


async def test_each_command_names_the_namespace_that_holds_the_run(
    private_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Asked in the default namespace about a run of ``demo``, replay and export name
    ``demo`` and the flag to add; runs, verify and status say that runs exist there."""
    await one_call(private_url, "demo")

    def said(out: str, err: str) -> str:
        return " ".join((out + err).split())

    code, out, err = await run_cli(capsys, private_url, "canon", "replay", RUN)
    assert code == 1
    assert err == (
        f"canon: error: no invocation found for run {RUN} in namespace canon (absent or "
        f"expired); run {RUN} is in namespace demo: add --namespace demo\n"
    )
    code, out, err = await run_cli(capsys, private_url, "canon", "replay", RUN, "call_1")
    assert code == 1 and err.startswith(f"canon: error: no such invocation for run {RUN} ")
    assert err.endswith(f"; run {RUN} is in namespace demo: add --namespace demo\n")
    code, out, err = await run_cli(capsys, private_url, "canon", "export", RUN)
    assert code == 1
    assert err == (
        f"canon: error: no run or invocation found for run {RUN} in namespace canon (absent "
        f"or expired); run {RUN} is in namespace demo: add --namespace demo\n"
    )
    code, out, err = await run_cli(
        capsys, private_url, "canon", "inspect", invocation_id(RUN, "call_1"), "--run-id", RUN
    )
    assert code == 1 and err.endswith(f"; run {RUN} is in namespace demo: add --namespace demo\n")
    code, out, err = await run_cli(capsys, private_url, "canon", "runs")
    assert code == 0
    assert said(out, err) == (
        "no runs in namespace canon (none opened, or all expired); runs exist in namespace "
        "demo: add --namespace demo"
    )
    code, out, err = await run_cli(capsys, private_url, "canon", "verify", "--no-progress")
    assert code == 0
    assert said(out, err).endswith(
        "nothing to check: namespace canon holds no invocation records; runs exist in "
        "namespace demo: add --namespace demo"
    )
    code, out, err = await run_cli(capsys, private_url, "canon", "status")
    assert code == 0
    assert said(out, err).endswith(
        "no records in namespace canon; runs exist in namespace demo: add --namespace demo"
    )
    # In the right namespace nothing changes.
    code, out, err = await run_cli(capsys, private_url, "demo", "replay", RUN)
    assert code == 0 and err == ""


async def test_a_run_that_no_namespace_holds_is_said_so_and_several_are_listed(
    private_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run no other namespace holds is said to be nowhere else, naming the namespaces
    that do hold runs; several are listed by name."""
    await one_call(private_url, "demo")
    await one_call(private_url, "prod", "run-p")

    code, _, err = await run_cli(capsys, private_url, "canon", "replay", "run-zz")
    assert code == 1
    assert err.endswith(
        "; run run-zz is in no other namespace either (runs exist in namespaces demo, prod)\n"
    )
    code, out, _ = await run_cli(capsys, private_url, "canon", "runs")
    assert " ".join(out.split()).endswith(
        "runs exist in namespaces demo, prod: add --namespace with one of them"
    )


async def test_with_no_other_namespace_the_line_is_unchanged(
    private_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a server whose only runs are in the namespace asked, nothing is added."""
    await one_call(private_url, "canon")

    code, _, err = await run_cli(capsys, private_url, "canon", "replay", "run-zz")
    assert code == 1
    assert err == (
        "canon: error: no invocation found for run run-zz in namespace canon (absent or expired)\n"
    )


async def test_the_search_is_bounded_and_says_when_it_stopped(private_url: str) -> None:
    """The SCAN makes at most ``max_calls`` calls: on a keyspace larger than that covers,
    it stops early and says so; with room it covers everything."""
    await one_call(private_url, "demo")
    client = Redis.from_url(private_url)
    try:
        await client.mset({f"other:key:{i}": "x" for i in range(3000)})
    finally:
        await client.aclose()

    async with Store.from_url(private_url, read_only=True) as store:
        cut = await other_namespaces(store, RUN, max_calls=2, count=10)
        whole = await other_namespaces(store, RUN, max_calls=1000, count=100)

    assert not cut.complete and cut.keys_bound == 20
    assert whole.complete and whole.holding_run == ("demo",) and whole.with_runs == ("demo",)


async def test_the_search_finds_the_namespace_of_a_run_on_every_backend(
    redis_url: str, namespace: str
) -> None:
    """On a single server and across a cluster's primaries, the run is found in the other
    namespace that holds it, and never in the store's own."""
    other = f"{namespace}-o"
    await one_call(redis_url, other, "run-elsewhere")
    await one_call(redis_url, namespace, "run-here")

    async with Store.from_url(redis_url, namespace=namespace, read_only=True) as store:
        # Room for every key of the shared test servers, whatever the suite left there.
        found = await other_namespaces(store, "run-elsewhere", max_calls=10_000)
        here = await other_namespaces(store, "run-here", max_calls=10_000)

    assert found.complete and found.holding_run == (other,)
    assert other in found.with_runs and namespace not in found.with_runs
    assert here.holding_run == ()


async def test_the_reader_gets_the_hint_without_a_denial(
    server: EmbeddedRedis,  # noqa: F811
    admin: Redis,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The read-only user of docs/acl.md, allowed only its namespace's keys, is pointed to
    another namespace with no ACL denial: the search reads key names, never their keys."""
    await one_call(server.url, "demo", shards=4)
    url = url_of(server, "canon-reader")

    code, _, err = await run_cli(capsys, url, "canon", "replay", RUN, "--shards=4")

    assert code == 1
    assert err.endswith(f"; run {RUN} is in namespace demo: add --namespace demo\n")
    assert await denials(admin) == []
