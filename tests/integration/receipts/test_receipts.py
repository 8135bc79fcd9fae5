"""The receipt HTTP API over a real loopback socket: every rule of its answer order."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import httpx
import msgspec
import pytest
from redis.asyncio import Redis

from eventstore.store import Store
from machine.codes import EvidenceStatus
from machine.ids import invocation_id
from projections import ReceiptWorker, create_app
from projections.worker.supervisor import ReceiptServer
from tests.helpers import commandstats

pytestmark = pytest.mark.backends("single", "cluster")

RUN, OTHER = "run-h", "run-o"
RECEIPT = "/v1/invocations/{}/receipt"
CAPS = "/v1/invocations/inspection-capabilities"


@pytest.fixture
async def serve() -> AsyncIterator[Any]:
    """Serves stores' receipt APIs on loopback ports; every server is stopped at the end."""
    running: list[tuple[ReceiptServer, asyncio.Task[None]]] = []

    async def start(store: Store) -> httpx.AsyncClient:
        server = ReceiptServer(create_app(store))
        task = asyncio.create_task(server.serve())
        while not server.started:
            assert not task.done(), "the server did not start"
            await asyncio.sleep(0.005)
        running.append((server, task))
        return httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}")

    yield start
    for server, task in running:
        server.stop()
        await asyncio.wait_for(task, 10)


@pytest.fixture
async def api(make_store: Any, serve: Any) -> AsyncIterator[Any]:
    """A store with two runs (one READY call each), its API client and the run tokens."""
    store: Store = make_store(shards=4)
    tokens = {}
    for run in (RUN, OTHER):
        tokens[run] = (await store.open_run(run, deadline=timedelta(minutes=5))).access_token
        head = await store.writer.create(run, "c1", "search", b'{"q":1}')
        head = await store.writer.start_projecting(head, b'{"raw":"RAW"}')
        await store.writer.complete(head, b'{"answer":42}', EvidenceStatus.EVIDENCE_FOUND, "s")
    client = await serve(store)
    async with client:
        yield store, client, tokens


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def path(run: str = RUN, call: str = "c1") -> str:
    return RECEIPT.format(invocation_id(run, call))


async def test_capabilities_answer_exactly_three_fields(api: Any) -> None:
    """The capabilities document is exactly the schema, receipt schema and read_only."""
    _, client, tokens = api
    response = await client.get(CAPS, headers=bearer(tokens[RUN]))
    assert response.status_code == 200
    assert response.json() == {
        "schema_version": "canon.invocation-inspection-capabilities.v1",
        "receipt_schema": "canon.invocation-receipt.v1",
        "read_only": True,
    }
    assert response.headers["cache-control"] == "no-store"


async def test_receipt_of_a_ready_call(api: Any) -> None:
    """A READY call's receipt carries its bounded result, read_only and no business operation."""
    _, client, tokens = api
    response = await client.get(path(), headers=bearer(tokens[RUN]))
    assert response.status_code == 200
    body = response.json()
    assert body["invocation_id"] == invocation_id(RUN, "c1")
    assert (body["read_only"], body["business_operation_performed"]) == (True, False)
    assert body["result"]["agent_result"] == {"answer": 42}
    assert (body["journal_state"], body["result_source"]) == ("completed", "record")
    assert b"RAW" not in response.content


@pytest.mark.parametrize(
    ("method", "url", "auth", "status"),
    [
        ("GET", CAPS, None, 401),
        ("GET", "/v1/invocations/" + "A" * 64 + "/receipt", RUN, 400),
        ("GET", "/v1/invocations/" + "A" * 64 + "/receipt", None, 401),
        ("POST", "/v1/invocations/" + "A" * 64 + "/receipt", RUN, 404),
        ("GET", CAPS + "?x=1", RUN, 400),
        ("GET", RECEIPT.format("0" * 64), RUN, 404),
        ("POST", CAPS, RUN, 404),
        ("BREW", CAPS, RUN, 404),
        ("BREW", CAPS, None, 401),
        ("GET", CAPS, RUN, 200),
    ],
)
async def test_every_answer_says_no_store(
    api: Any, method: str, url: str, auth: str | None, status: int
) -> None:
    """Cache-Control: no-store is on every answer, errors and unknown methods included."""
    _, client, tokens = api
    headers = bearer(tokens[auth]) if auth else {}
    response = await client.request(method, url, headers=headers)
    assert response.status_code == status
    assert response.headers["cache-control"] == "no-store"


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer cr1:run-h:not-the-secret"},
        {"Authorization": "Basic cnVuLWg6eA=="},
        {"Authorization": "Bearer"},
    ],
    ids=["missing", "wrong", "basic", "empty"],
)
async def test_missing_or_wrong_token_is_unauthorized(api: Any, headers: dict[str, str]) -> None:
    """Without the run's Bearer token both endpoints answer 401 with only an error code."""
    _, client, _ = api
    for url in (CAPS, path()):
        response = await client.get(url, headers=headers)
        assert (response.status_code, response.json()) == (401, {"error": "unauthorized"})


async def test_token_in_the_query_string_is_not_accepted(api: Any) -> None:
    """A token passed as a query parameter is ignored: 401."""
    _, client, tokens = api
    response = await client.get(path(), params={"token": tokens[RUN]})
    assert (response.status_code, response.json()) == (401, {"error": "unauthorized"})


async def test_closed_run_receipts_stay_readable(api: Any) -> None:
    """Closing a run stops new calls, not inspection: its receipts still answer 200."""
    store, client, tokens = api
    await store.close_run(RUN)
    response = await client.get(path(), headers=bearer(tokens[RUN]))
    assert response.status_code == 200
    assert response.json()["tool_call_id"] == "c1"


async def test_revoked_token_is_unauthorized(api: Any) -> None:
    """A revoked token answers 401 on both endpoints, and on the run's progress."""
    store, client, tokens = api
    assert (await client.get(path(), headers=bearer(tokens[RUN]))).status_code == 200
    await store.revoke_token(RUN)
    for url in (path(), "/v1/invocations/inspection-capabilities", f"/v1/runs/{RUN}/progress"):
        response = await client.get(url, headers=bearer(tokens[RUN]))
        assert (response.status_code, response.json()) == (401, {"error": "unauthorized"})
        assert response.headers["cache-control"] == "no-store"


async def assert_only_authenticated(redis: Redis, before: dict[str, int]) -> None:
    """Since ``before`` the API only authenticated: no invocation was looked up."""
    after = await commandstats(redis)
    # Authentication alone: the token's hash and the run's entry. No invocation lookup.
    assert after.get("hget", 0) - before.get("hget", 0) == 1
    assert after.get("hgetall", 0) - before.get("hgetall", 0) == 1
    for command in ("hmget", "xrange", "exec"):
        assert after.get(command, 0) == before.get(command, 0)


@pytest.mark.parametrize(
    "segment",
    [
        invocation_id(RUN, "c1").upper(),
        invocation_id(RUN, "c1")[:63],
        invocation_id(RUN, "c1") + "0",
        "c1",
        "",
        "g" * 64,
        invocation_id(RUN, "c1")[:63] + "\n",
        "é" * 64,
    ],
    ids=["uppercase", "short", "long", "call-id", "empty", "not-hex", "newline", "unicode"],
)
async def test_malformed_id_is_invalid_request_before_storage(
    api: Any, redis: Redis, segment: str
) -> None:
    """A receipt path whose id is not 64 lowercase hex is 400 invalid_request with a fixed
    message that does not echo the id, answered before any record is read."""
    _, client, tokens = api
    url = "/v1/invocations/" + quote(segment) + "/receipt"
    before = await commandstats(redis)
    response = await client.get(url, headers=bearer(tokens[RUN]))
    assert (response.status_code, response.json()) == (
        400,
        {
            "error": "invalid_request",
            "message": "An invocation id is 64 lowercase hexadecimal characters.",
        },
    )
    assert response.headers["cache-control"] == "no-store"
    await assert_only_authenticated(redis, before)


async def test_malformed_id_needs_the_token_first(api: Any, redis: Redis) -> None:
    """Without a valid token a malformed id is 401 like any other request: the id check
    comes after authentication, so it tells an anonymous caller nothing."""
    _, client, _ = api
    for segment in (invocation_id(RUN, "c1").upper(), "a%0Ab"):
        url = "/v1/invocations/" + segment + "/receipt"
        for headers in ({}, {"Authorization": "Bearer cr1:run-h:not-the-secret"}):
            response = await client.get(url, headers=headers)
            assert (response.status_code, response.json()) == (401, {"error": "unauthorized"})


async def test_query_string_is_refused_before_the_id_is_checked(api: Any) -> None:
    """A malformed id with a query string gets the query-string refusal: that check is first."""
    _, client, tokens = api
    url = "/v1/invocations/" + invocation_id(RUN, "c1").upper() + "/receipt?route=other"
    response = await client.get(url, headers=bearer(tokens[RUN]))
    assert response.status_code == 400
    assert response.json()["message"] == "Invocation inspection does not accept query parameters."


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("GET", path() + "/"),
        ("GET", "/v1/invocations/a/" + invocation_id(RUN, "c1") + "/receipt"),
        ("GET", "/v1/invocations/" + invocation_id(RUN, "c1") + "/receipts"),
        ("GET", "/v1/other"),
        ("POST", path()),
        ("POST", "/v1/invocations/" + invocation_id(RUN, "c1").upper() + "/receipt"),
        ("DELETE", "/v1/invocations/c1/receipt"),
    ],
    ids=[
        "trailing-slash",
        "extra-segment",
        "other-suffix",
        "other-path",
        "post",
        "post-malformed",
        "delete-malformed",
    ],
)
async def test_other_shapes_are_not_found_before_storage(
    api: Any, redis: Redis, method: str, url: str
) -> None:
    """A request that is not a GET of one of the three routes' shapes is 404 not_found,
    whatever its id looks like, answered before any record is read."""
    _, client, tokens = api
    before = await commandstats(redis)
    response = await client.request(method, url, headers=bearer(tokens[RUN]))
    assert (response.status_code, response.json()) == (404, {"error": "not_found"})
    await assert_only_authenticated(redis, before)


@pytest.mark.parametrize("url", [CAPS + "?route=other", path() + "?route=other", path() + "?"])
async def test_query_string_is_refused_before_any_record_read(
    api: Any, redis: Redis, url: str
) -> None:
    """Any query string is 400 invalid_request, answered before the invocation is looked up."""
    _, client, tokens = api
    before = await commandstats(redis)
    response = await client.get(url, headers=bearer(tokens[RUN]))
    after = await commandstats(redis)
    if url.endswith("?"):
        # An empty query string is no query string at all.
        assert response.status_code == 200
        return
    assert response.status_code == 400
    assert response.json() == {
        "error": "invalid_request",
        "message": "Invocation inspection does not accept query parameters.",
    }
    assert after.get("hget", 0) - before.get("hget", 0) == 1
    for command in ("hmget", "xrange", "exec"):
        assert after.get(command, 0) == before.get(command, 0)


async def test_absent_expired_and_foreign_invocations_look_the_same(
    api: Any, make_store: Any
) -> None:
    """Absent, expired and another run's invocations all answer the same 404 body."""
    store, client, tokens = api
    short: Store = make_store(shards=4, ttl=timedelta(milliseconds=150))
    await short.writer.create(RUN, "brief", "search", b"{}")
    await asyncio.sleep(0.3)
    assert await store.get(RUN, "brief") is None

    answers = [
        await client.get(url, headers=bearer(tokens[RUN]))
        for url in (RECEIPT.format("ab" * 32), path(RUN, "brief"), path(OTHER, "c1"))
    ]
    assert {a.status_code for a in answers} == {404}
    assert {a.content for a in answers} == {answers[0].content}
    assert answers[0].json()["error"] == "invocation_not_found"
    foreign = await client.get(path(OTHER, "c1"), headers=bearer(tokens[OTHER]))
    assert foreign.status_code == 200


async def test_revoked_tool_gives_capability_changed(api: Any) -> None:
    """A tool revoked from the run since the call makes its receipt 409 capability_changed."""
    store, client, tokens = api
    await store.runs.revoke_tool(RUN, "search")
    response = await client.get(path(), headers=bearer(tokens[RUN]))
    assert response.status_code == 409
    assert response.json()["error"] == "capability_changed"
    assert "answer" not in response.text


async def test_receipts_are_served_while_execution_is_paused(api: Any) -> None:
    """Pausing execution does not pause inspection."""
    store, client, tokens = api
    await store.set_paused(True)
    assert await store.is_paused()
    for url in (CAPS, path()):
        assert (await client.get(url, headers=bearer(tokens[RUN]))).status_code == 200


async def test_current_materialized_receipt_is_served(api: Any, redis: Redis) -> None:
    """A materialized receipt at the record's version is served, observed now."""
    store, client, tokens = api
    await ReceiptWorker(store, consumer="w").run(burst=True)
    key = store.keys.receipt(RUN, invocation_id(RUN, "c1"))
    stored = msgspec.json.decode(await redis.hget(key, "receipt"))
    stored["result"]["scope"] = "materialized"
    await redis.hset(key, "receipt", msgspec.json.encode(stored))

    body = (await client.get(path(), headers=bearer(tokens[RUN]))).json()
    assert body["result"]["scope"] == "materialized"
    assert body["observed_at"] > stored["observed_at"]


async def test_older_materialized_receipt_is_bypassed(api: Any, redis: Redis) -> None:
    """A materialized receipt older than its record is not served; the record answers."""
    store, client, tokens = api
    await ReceiptWorker(store, consumer="w").run(burst=True)
    key = store.keys.receipt(RUN, invocation_id(RUN, "c1"))
    stored = msgspec.json.decode(await redis.hget(key, "receipt"))
    stored["result"]["scope"] = "stale"
    await redis.hset(key, mapping={"receipt": msgspec.json.encode(stored), "version": 2})

    body = (await client.get(path(), headers=bearer(tokens[RUN]))).json()
    assert body["result"]["scope"] == "s"
    assert await redis.hget(key, "version") == b"2"


async def test_store_failure_is_503(serve: Any, namespace: str) -> None:
    """When Redis cannot be reached the API answers 503 store_unavailable, no details."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    unreachable = Store.from_url(f"redis://127.0.0.1:{dead_port}/0", namespace=namespace)
    try:
        client = await serve(unreachable)
        async with client:
            response = await client.get(CAPS, headers=bearer("cr1:run-h:secret"))
    finally:
        await unreachable.aclose()
    assert (response.status_code, response.json()) == (503, {"error": "store_unavailable"})
    assert response.headers["cache-control"] == "no-store"


async def test_unexpected_failure_is_500_without_details(api: Any, redis: Redis) -> None:
    """An unexpected failure answers 500 internal_error with no trace or exception text."""
    store, client, tokens = api
    await redis.hset(store.keys.run(RUN), "deadline_ms", "not-a-number")
    response = await client.get(path(), headers=bearer(tokens[RUN]))
    assert (response.status_code, response.json()) == (500, {"error": "internal_error"})
    assert response.headers["cache-control"] == "no-store"


async def test_run_progress_is_served_for_the_tokens_own_run(api: Any) -> None:
    """GET /v1/runs/<run>/progress shows the run's view and facts; other runs are 404."""
    from projections import ProgressWorker

    store, client, tokens = api
    before = await client.get(f"/v1/runs/{RUN}/progress", headers=bearer(tokens[RUN]))
    await ProgressWorker(store).run(burst=True)
    after = await client.get(f"/v1/runs/{RUN}/progress", headers=bearer(tokens[RUN]))
    other = await client.get(f"/v1/runs/{OTHER}/progress", headers=bearer(tokens[RUN]))
    query = await client.get(f"/v1/runs/{RUN}/progress?x=1", headers=bearer(tokens[RUN]))

    assert before.status_code == 200 and before.json()["source"] == "records"
    assert [fact["tool_call_id"] for fact in before.json()["facts"]] == ["c1"]
    body = after.json()
    assert (after.status_code, body["source"], body["run_id"]) == (200, "view", RUN)
    assert body["schema_version"] == "canon.run-progress.v1" and body["read_only"] is True
    assert (body["invocations"], body["by_status"]) == (1, {"READY": 1})
    assert [fact["tool_call_id"] for fact in body["facts"]] == ["c1"]
    assert b"RAW" not in after.content
    assert (other.status_code, other.json()["error"]) == (404, "run_not_found")
    assert query.status_code == 400
    assert {r.headers["cache-control"] for r in (before, after, other, query)} == {"no-store"}
