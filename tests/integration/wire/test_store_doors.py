"""What a newcomer gets wrong at the store's doors gets one clear error, never a crash: a
deadline given as seconds works (and anything that is no deadline is InvalidArgument, in
Store, SyncStore and the MCP run options alike); a server that is down is named by host
and port (or socket) with the cause, never with a password; a database the server does
not have, and a cluster client pointed at a plain Redis, each say what is wrong."""

from __future__ import annotations

import math
import pathlib
from datetime import UTC, date, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest

from canon.integrations.mcp import RunOptions
from eventstore import Store, StoreUnavailable, SyncStore
from eventstore.errors import InvalidArgument, NoSuchDatabase, NotACluster
from eventstore.writer import now_ms
from tests.support.ports import free_port

#: The password of the URLs below: never in an error.
PASSWORD = "s3cret-pw"


def refused_url() -> str:
    """A URL with a password, naming a loopback port nobody listens on."""
    return f"redis://ops:{PASSWORD}@127.0.0.1:{free_port()}/0"


def with_database(url: str, number: int) -> str:
    """``url`` naming database ``number`` instead of its own."""
    return urlsplit(url)._replace(path=f"/{number}").geturl()


@pytest.mark.parametrize(
    "deadline",
    [300, 300.0, timedelta(seconds=300), "aware"],
    ids=["int-seconds", "float-seconds", "timedelta", "aware-datetime"],
)
async def test_a_deadline_is_a_timedelta_a_number_of_seconds_or_an_aware_datetime(
    store: Store, deadline: Any
) -> None:
    """``open_run(run, deadline=300)`` opens a run that stops taking calls 300 s from now,
    as a timedelta or an aware datetime 300 s ahead does."""
    if deadline == "aware":
        deadline = datetime.now(UTC) + timedelta(seconds=300)
    before = now_ms()
    opened = await store.open_run("run-deadline", deadline=deadline)
    assert before + 299_000 <= opened.deadline_ms <= now_ms() + 300_000
    info = await store.run_info("run-deadline")
    assert info is not None and info.deadline_ms == opened.deadline_ms


BAD_DEADLINES = [
    "300",
    None,
    True,
    math.nan,
    math.inf,
    datetime(2030, 1, 1),  # naive: which zone?
    date(2030, 1, 1),
    [300],
]


@pytest.mark.parametrize("deadline", BAD_DEADLINES, ids=repr)
async def test_anything_else_is_invalid_argument_and_opens_nothing(
    store: Store, deadline: Any
) -> None:
    """A string, None, a bool, NaN, an infinity, a naive datetime, a date or a list is
    InvalidArgument naming what a deadline may be; no run is registered."""
    with pytest.raises(InvalidArgument, match="deadline must be"):
        await store.open_run("run-bad", deadline=deadline)
    assert await store.run_info("run-bad") is None


def test_the_sync_store_takes_the_same_deadlines(redis_url: str, namespace: str) -> None:
    """SyncStore.open_run accepts seconds and refuses a string the same way."""
    with SyncStore.from_url(redis_url, namespace=namespace, durability="off") as store:
        opened = store.open_run("run-sync", deadline=60)
        assert opened.deadline_ms > now_ms() + 50_000
        with pytest.raises(InvalidArgument, match="deadline must be"):
            store.open_run("run-sync-bad", deadline="60")


def test_the_mcp_run_options_check_their_deadline_when_made() -> None:
    """RunOptions(deadline=300) is five minutes; a string or a moment is refused at once."""
    assert RunOptions(deadline=300).deadline == 300
    with pytest.raises(InvalidArgument, match="deadline must be"):
        RunOptions(deadline="300")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="a span"):
        RunOptions(deadline=datetime.now(UTC))  # type: ignore[arg-type]


async def test_a_server_that_is_down_is_named_with_its_cause_never_its_password() -> None:
    """Entering a store on a port nobody listens on raises StoreUnavailable naming
    127.0.0.1:PORT and that the connection was refused; the password is nowhere in it."""
    url = refused_url()
    port = urlsplit(url).port
    store = Store.from_url(url, timeout_s=1.0)
    with pytest.raises(StoreUnavailable) as raised:
        async with store:
            pass
    text = str(raised.value)
    assert text.startswith(f"Redis at 127.0.0.1:{port} is unavailable: ")
    assert "connection was refused" in text and "(ConnectionError)" in text
    assert raised.value.server == f"127.0.0.1:{port}" and raised.value.cause == "ConnectionError"
    assert PASSWORD not in text and PASSWORD not in repr(raised.value)


async def test_a_store_method_names_the_server_too(tmp_path: pathlib.Path) -> None:
    """A call after entering (here a read on a missing unix socket) names the socket."""
    socket_path = tmp_path / "gone.sock"
    store = Store.from_url(f"unix://{socket_path}", timeout_s=1.0)
    try:
        with pytest.raises(StoreUnavailable) as raised:
            await store.get("run-1", "call-1")
    finally:
        await store.aclose()
    assert str(raised.value).startswith(f"Redis at unix socket {socket_path} is unavailable: ")
    assert "no socket at that path" in str(raised.value)


def test_the_sync_store_names_the_server_it_could_not_reach() -> None:
    """SyncStore.from_url(...) entered on a dead port: the same message, host and port."""
    url = refused_url()
    named = rf"Redis at 127\.0\.0\.1:{urlsplit(url).port} "
    with pytest.raises(StoreUnavailable, match=named), SyncStore.from_url(url, timeout_s=1.0):
        pass


async def test_a_database_the_server_does_not_have_is_not_an_outage(redis_url: str) -> None:
    """redis://host:port/99 on a server of 16 databases: NoSuchDatabase naming database 99
    and what to put in the URL, not a generic "unavailable"."""
    store = Store.from_url(with_database(redis_url, 99), timeout_s=2.0)
    with pytest.raises(NoSuchDatabase) as raised:
        async with store:
            pass
    assert raised.value.database == 99
    assert "has no database 99" in str(raised.value) and "redis://host:port/0" in str(raised.value)


async def test_a_cluster_client_on_a_plain_redis_says_so(redis_url: str) -> None:
    """cluster=True against a server without cluster support: one NotACluster line naming
    the node and the fix, instead of redis-py's traceback."""
    store = Store.from_url(redis_url, cluster=True, timeout_s=2.0)
    with pytest.raises(NotACluster) as raised:
        async with store:
            pass
    node = f"{urlsplit(redis_url).hostname}:{urlsplit(redis_url).port}"
    assert str(raised.value).startswith(f"Redis at {node} is not in cluster mode")
    assert "without cluster=True" in str(raised.value)
    assert isinstance(raised.value, InvalidArgument)
