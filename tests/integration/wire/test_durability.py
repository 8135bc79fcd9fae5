"""Durability preflight: entering a store reads appendonly, appendfsync and maxmemory-policy,
warns about settings that could lose or evict records, and refuses them in strict mode."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from redis.asyncio import Redis
from structlog.testing import capture_logs

from canon.cli import main as canon_main
from eventstore.errors import InvalidArgument
from eventstore.server.durability import (
    DurabilityError,
    DurabilityReport,
    _weakest,
    check_durability,
    read_durability,
)
from eventstore.store import Store
from tests.helpers import commandstats

#: Password of the ACL user without CONFIG (also forbidden in every captured log).
NO_CONFIG_PASSWORD = "durability-acl-pass-5e7d"


def warnings_of(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``durability_warning`` entries."""
    return [entry for entry in logs if entry["event"] == "durability_warning"]


#: Server options → the risks the preflight must name.
CASES: dict[str, tuple[dict[str, Any], list[str]]] = {
    "aof-always": ({"appendonly": True, "appendfsync": "always"}, []),
    "aof-everysec": ({"appendonly": True, "appendfsync": "everysec"}, []),
    "no-aof": ({"appendonly": False}, ["appendonly=no"]),
    "aof-fsync-no": ({"appendonly": True, "appendfsync": "no"}, ["appendfsync=no"]),
    "evicting": (
        {"appendonly": True, "extra_args": ["--maxmemory-policy", "volatile-lru"]},
        ["maxmemory-policy=volatile-lru"],
    ),
    "everything-wrong": (
        {"appendonly": False, "extra_args": ["--maxmemory-policy", "allkeys-lru"]},
        ["appendonly=no", "maxmemory-policy=allkeys-lru"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_each_setting_is_judged(start_server: Any, namespace: str, case: str) -> None:
    """Warn mode logs one durability_warning naming exactly the risky settings (none for a
    safe server); strict mode refuses exactly when there is a risk."""
    options, risks = CASES[case]
    server = start_server(**options)

    with capture_logs() as logs:
        async with Store.from_url(server.url, namespace=namespace) as store:
            assert store.settings.durability == "warn"
    warned = warnings_of(logs)
    if risks:
        [entry] = warned
        assert entry["risks"] == risks and entry["unverified"] == []
        assert entry["log_level"] == "warning" and entry["source"] == "config"
    else:
        assert warned == []

    strict = Store.from_url(server.url, namespace=namespace, durability="strict")
    if risks:
        with pytest.raises(DurabilityError) as refused:
            await strict.__aenter__()
        assert refused.value.risks == tuple(risks)
        assert all(risk in str(refused.value) for risk in risks)
    else:
        async with strict:
            pass


async def test_strict_refusal_closes_the_pool(start_server: Any, namespace: str) -> None:
    """A strict store that refuses to start leaves no connection open behind it."""
    server = start_server(appendonly=False)
    admin = Redis.from_url(server.url)
    try:
        before = len(await admin.client_list())
        with pytest.raises(DurabilityError):
            async with Store.from_url(server.url, namespace=namespace, durability="strict"):
                pass
        # The server notices a closed socket on its next event-loop turn: poll briefly.
        for _ in range(100):
            if len(await admin.client_list()) == before:
                break
            await asyncio.sleep(0.02)
        assert len(await admin.client_list()) == before
    finally:
        await admin.aclose()


async def test_off_mode_reads_nothing(start_server: Any, namespace: str) -> None:
    """Mode off issues no CONFIG GET and no INFO, and logs nothing about durability."""
    server = start_server(appendonly=False)
    admin = Redis.from_url(server.url)
    try:
        before = await commandstats(admin)
        with capture_logs() as logs:
            async with Store.from_url(server.url, namespace=namespace, durability="off"):
                pass
        after = await commandstats(admin)
    finally:
        await admin.aclose()
    assert warnings_of(logs) == []
    assert after.get("config|get", after.get("config", 0)) == before.get(
        "config|get", before.get("config", 0)
    )
    # The admin's own INFO commandstats calls are the only INFO calls.
    assert after["info"] - before["info"] == 1


async def test_unknown_mode_is_refused(store: Store) -> None:
    """A durability mode other than off, warn or strict is an invalid argument."""
    with pytest.raises(InvalidArgument):
        await check_durability(store.client, "lenient")  # type: ignore[arg-type]


async def test_without_config_permission_info_is_used(start_server: Any, namespace: str) -> None:
    """A user refused CONFIG still gets appendonly and the eviction policy from INFO; the
    unreadable appendfsync is reported unverified (a warning), and strict mode refuses it."""
    server = start_server(appendonly=True, appendfsync="always")
    admin = Redis.from_url(server.url)
    try:
        await admin.acl_setuser(
            "noconfig",
            enabled=True,
            passwords=[f"+{NO_CONFIG_PASSWORD}"],
            keys=["*"],
            commands=["+@all", "-config"],
        )
    finally:
        await admin.aclose()
    url = f"redis://noconfig:{NO_CONFIG_PASSWORD}@127.0.0.1:{server.port}/0"

    with capture_logs() as logs:
        async with Store.from_url(url, namespace=namespace) as store:
            report = await read_durability(store.client)
    assert (report.appendonly, report.appendfsync, report.maxmemory_policy) == (
        "yes",
        None,
        "noeviction",
    )
    assert report.source == "info" and report.risks == []
    [entry] = warnings_of(logs)
    assert entry["unverified"] == ["appendfsync=unverified"] and entry["risks"] == []
    assert NO_CONFIG_PASSWORD not in repr(logs)

    with pytest.raises(DurabilityError) as refused:
        async with Store.from_url(url, namespace=namespace, durability="strict"):
            pass
    assert refused.value.risks == ("appendfsync=unverified",)
    assert NO_CONFIG_PASSWORD not in str(refused.value)


async def test_info_fallback_sees_a_disabled_aof(start_server: Any, namespace: str) -> None:
    """Through the INFO fallback a server without an append-only file is still a risk."""
    server = start_server(appendonly=False)
    admin = Redis.from_url(server.url)
    try:
        await admin.acl_setuser(
            "noconfig",
            enabled=True,
            passwords=[f"+{NO_CONFIG_PASSWORD}"],
            keys=["*"],
            commands=["+@all", "-config"],
        )
    finally:
        await admin.aclose()
    url = f"redis://noconfig:{NO_CONFIG_PASSWORD}@127.0.0.1:{server.port}/0"
    store = Store.from_url(url, namespace=namespace)
    try:
        report = await read_durability(store.client)
    finally:
        await store.aclose()
    assert report.risks == ["appendonly=no"] and report.source == "info"


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Put back the structlog configuration a CLI run replaces (configure_logging)."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.mark.parametrize("command", ["workers", "serve"])
async def test_cli_strict_durability_refuses_a_lossy_server(
    start_server: Any, namespace: str, capsys: Any, restore_logging: None, command: str
) -> None:
    """``canon workers`` and ``canon serve`` with --strict-durability exit 2 on a server without
    an append-only file, naming the setting and nothing else."""
    server = start_server(appendonly=False)
    argv = [command, f"--redis-url={server.url}", f"--namespace={namespace}"]
    argv += ["--strict-durability", "--port=0"] if command == "serve" else ["--strict-durability"]

    code = await asyncio.to_thread(canon_main, argv)

    assert code == 2
    error = capsys.readouterr().err
    assert "appendonly=no" in error and str(server.port) not in error


async def test_cli_strict_durability_accepts_a_durable_server(
    start_server: Any, namespace: str
) -> None:
    """``canon workers --burst --strict-durability`` runs to completion (exit 0) on a server
    with an append-only file synced on every write."""
    server = start_server(appendonly=True, appendfsync="always")
    argv = ["workers", f"--redis-url={server.url}", f"--namespace={namespace}", "--burst"]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "canon.cli", *argv, "--strict-durability",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        _, stderr = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, stderr.decode(errors="replace")
    assert b"durability_warning" not in stderr


@pytest.mark.parametrize(
    ("settings", "risks", "unverified"),
    [
        (("yes", "always", "noeviction", None, 0), [], []),
        (("no", "no", "noeviction", None, 0), ["appendonly=no"], []),
        (("yes", None, None, None, 0), [], ["appendfsync", "maxmemory-policy"]),
        (("no", None, "noeviction", None, 0), ["appendonly=no"], []),
        (
            ("yes", "everysec", "allkeys-lfu", 0, 2),
            ["maxmemory-policy=allkeys-lfu", "replicas=0/2"],
            [],
        ),
        (("yes", "everysec", "noeviction", None, 1), [], ["replicas"]),
        ((None, None, None, None, 0), [], ["appendonly", "appendfsync", "maxmemory-policy"]),
    ],
)
def test_report_names_risks_and_unverified_settings(
    settings: tuple[Any, ...], risks: list[str], unverified: list[str]
) -> None:
    """A report names each risky setting once, and each unreadable one as unverified
    (appendfsync does not matter without an append-only file)."""
    appendonly, appendfsync, policy, connected, required = settings
    report = DurabilityReport(
        appendonly=appendonly,
        appendfsync=appendfsync,
        maxmemory_policy=policy,
        connected_replicas=connected,
        replicas_required=required,
    )
    assert report.risks == risks
    assert report.unverified == [f"{name}=unverified" for name in unverified]


def test_a_cluster_is_judged_by_its_weakest_primary() -> None:
    """Across primaries, the value that puts records most at risk wins."""
    assert _weakest("appendonly", ["yes", "no", "yes"]) == "no"
    assert _weakest("appendfsync", ["always", "everysec"]) == "everysec"
    assert _weakest("appendfsync", ["always", "no", "everysec"]) == "no"
    assert _weakest("maxmemory-policy", ["noeviction", "volatile-lru"]) == "volatile-lru"
    assert _weakest("maxmemory-policy", ["noeviction", "noeviction"]) == "noeviction"
