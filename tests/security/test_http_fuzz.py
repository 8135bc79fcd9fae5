"""Hostile readers against the receipt API: random paths, methods, query strings, headers and
tokens (other runs' tokens with tweaked characters, Bearer variants, overlong and unicode
headers, traversal, encoded slashes, uppercase hex). Never a 500, never another run's data,
and only the exact token of a run in one Bearer header is ever accepted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventstore.store import Store
from machine.codes import ErrorCode, EvidenceStatus
from machine.ids import invocation_id
from projections import ReceiptWorker, create_app
from projections.worker.supervisor import ReceiptServer, run_workers
from tests.security.hostile import authorization_values, paths

RUNS = ("run-alpha", "run-bravo")
CALLS = ("c1", "c2", "c3")
ALLOWED_STATUS = {200, 400, 401, 404, 409}


@dataclass(frozen=True)
class Run:
    """One run's token and everything that identifies its data."""

    run_id: str
    token: str
    invocation_ids: tuple[str, ...]
    tool_call_ids: tuple[str, ...]
    results: tuple[str, ...]

    @property
    def secrets(self) -> tuple[str, ...]:
        """Fragments of this run's data that no other run's reader may see."""
        return (self.run_id, *self.invocation_ids, *self.tool_call_ids, *self.results)


@pytest.fixture
async def world(make_store: Any) -> AsyncIterator[tuple[Store, dict[str, Run]]]:
    """Two runs with READY and ERROR calls, receipts materialized for the first call only."""
    store: Store = make_store(shards=4)
    runs = {}
    for run_id in RUNS:
        token = (await store.open_run(run_id, deadline=timedelta(minutes=5))).access_token
        tag = run_id.removeprefix("run-")
        calls = tuple(f"{tag}-{call}" for call in CALLS)
        results = tuple(f"RESULT-OF-{tag}-{n}" for n in range(len(calls)))
        for call, result in zip(calls[:2], results, strict=False):
            head = await store.writer.create(run_id, call, "search", b'{"q":1}')
            head = await store.writer.start_projecting(head, b'{"raw":1}')
            body = msgspec.json.encode({"answer": result})
            await store.writer.complete(head, body, EvidenceStatus.EVIDENCE_FOUND, "s")
        head = await store.writer.create(run_id, calls[2], "search", b'{"q":2}')
        await store.writer.fail(head, ErrorCode.EXECUTION_FAILED)
        runs[run_id] = Run(
            run_id=run_id,
            token=token,
            invocation_ids=tuple(invocation_id(run_id, call) for call in calls),
            tool_call_ids=calls,
            results=results,
        )
    await run_workers([ReceiptWorker(store, min_idle_ms=0)], burst=True, handle_signals=False)
    yield store, runs


@dataclass
class Answer:
    """An HTTP answer as the app sent it."""

    status: int
    headers: dict[bytes, bytes]
    body: bytes


async def call_app(
    app: Any, method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]]
) -> Answer:
    """Call the ASGI app directly with a hand-built scope (no client normalizes anything)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode("utf-8", "surrogatepass"),
        "query_string": query,
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8080),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return Answer(start["status"], dict(start.get("headers", [])), body)


def accepted_run(values: list[bytes], runs: dict[str, Run]) -> Run | None:
    """The run a request may act as: exactly one Authorization header whose scheme is
    Bearer (any case) followed by a space and exactly that run's token (whitespace around
    it ignored)."""
    if len(values) != 1:
        return None
    scheme, _, token = values[0].decode("latin-1").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return next((run for run in runs.values() if token.strip() == run.token), None)


def assert_no_foreign_data(answer: Answer, reader: Run | None, runs: dict[str, Run]) -> None:
    """Nothing of a run other than ``reader`` is in the answer."""
    text = answer.body.decode("utf-8", "replace") + repr(answer.headers)
    for run in runs.values():
        if run is reader:
            continue
        leaked = [secret for secret in run.secrets if secret in text]
        assert not leaked, (run.run_id, leaked, text[:300])


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
async def test_hostile_requests_never_fail_or_leak(
    world: tuple[Store, dict[str, Run]], data: st.DataObject
) -> None:
    """Any method, path, query and headers: an allowed status (never 500), no-store,
    JSON, 401 unless exactly one run's token is presented, and no other run's data."""
    store, runs = world
    app = create_app(store)
    method = data.draw(st.sampled_from(["GET", "GET", "GET", "POST", "HEAD", "DELETE", "BREW"]))
    path = data.draw(paths(runs))
    query = data.draw(st.one_of(st.just(b""), st.just(b""), st.binary(max_size=30)))
    authorizations = data.draw(authorization_values(runs))
    extra = data.draw(
        st.lists(
            st.tuples(
                st.sampled_from([b"cookie", b"x-run-id", b"x-forwarded-for", b"host"]),
                st.binary(max_size=40),
            ),
            max_size=3,
        )
    )
    headers = [(b"authorization", value) for value in authorizations] + extra

    answer = await call_app(app, method, path, query, headers)

    assert answer.status in ALLOWED_STATUS, (answer.status, answer.body)
    assert answer.headers[b"cache-control"] == b"no-store"
    assert_no_foreign_data(answer, reader := accepted_run(authorizations, runs), runs)
    if reader is None:
        assert answer.status == 401 and msgspec.json.decode(answer.body) == {
            "error": "unauthorized"
        }
    else:
        msgspec.json.decode(answer.body)
    if answer.status == 200 and b"receipt_schema" not in answer.body:
        document = msgspec.json.decode(answer.body)  # a receipt or a run's progress
        assert reader is not None and document["run_id"] == reader.run_id
        if "invocation_id" in document:
            assert document["invocation_id"] in reader.invocation_ids


async def test_every_run_reads_its_own_receipts_only(world: tuple[Store, dict[str, Run]]) -> None:
    """Each run's token reads each of its own receipts and its own progress (200) and gets
    404 for every invocation and the progress of the other run, as for absent ones."""
    store, runs = world
    app = create_app(store)
    for reader in runs.values():
        auth = [(b"authorization", f"Bearer {reader.token}".encode())]
        for run in runs.values():
            for invocation in run.invocation_ids:
                path = f"/v1/invocations/{invocation}/receipt"
                answer = await call_app(app, "GET", path, b"", auth)
                if run is reader:
                    assert answer.status == 200
                    assert msgspec.json.decode(answer.body)["invocation_id"] == invocation
                else:
                    assert answer.status == 404
                    assert msgspec.json.decode(answer.body)["error"] == "invocation_not_found"
                assert_no_foreign_data(answer, reader, runs)
            answer = await call_app(app, "GET", f"/v1/runs/{run.run_id}/progress", b"", auth)
            assert answer.status == (200 if run is reader else 404)
            assert_no_foreign_data(answer, reader, runs)


async def raw_request(port: int, request: bytes) -> tuple[int, bytes]:
    """Send raw bytes to the server; return the status code and the whole answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    status_line = answer.split(b"\r\n", 1)[0]
    return int(status_line.split()[1]), answer


async def test_hostile_requests_over_a_real_socket(world: tuple[Store, dict[str, Run]]) -> None:
    """Through uvicorn on a loopback port: encoded slashes, traversal, an overlong header,
    a non-UTF-8 path, duplicated Authorization and a token in the query string never give a
    500 or the other run's data."""
    store, runs = world
    alpha, bravo = runs["run-alpha"], runs["run-bravo"]
    server = ReceiptServer(create_app(store))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not task.done(), "the server did not start"
            await asyncio.sleep(0.005)
        own = f"Authorization: Bearer {alpha.token}\r\n".encode()
        target = bravo.invocation_ids[0]
        traversal = f"{alpha.invocation_ids[0]}/../{target}"
        lines = [
            f"/v1/invocations/{target}%2Freceipt",
            f"/v1/invocations/{traversal}/receipt",
            f"/v1/invocations/{target}/receipt?token={bravo.token}",
            f"/v1/invocations/{target.upper()}/receipt",
            f"/v1/runs/{bravo.run_id}/progress",
            f"/v1/runs/{alpha.run_id}/../{bravo.run_id}/progress",
        ]
        requests = [f"GET {line} HTTP/1.1\r\n".encode() + own for line in lines]
        requests += [
            f"GET /v1/invocations/{target}/receipt HTTP/1.1\r\n".encode()
            + own
            + f"Authorization: Bearer {bravo.token}\r\n".encode(),
            f"GET /v1/invocations/{target}/receipt HTTP/1.1\r\n".encode()
            + b"Authorization: Bearer "
            + b"A" * 70_000
            + b"\r\n",
            b"GET /v1/invocations/\xff\xfe/receipt HTTP/1.1\r\n" + own,
        ]
        for request in requests:
            status, answer = await raw_request(
                server.port, request + b"Host: x\r\nConnection: close\r\n\r\n"
            )
            assert status != 500 and status < 500, answer[:200]
            body = answer.split(b"\r\n\r\n", 1)[-1].decode("utf-8", "replace")
            assert not [secret for secret in bravo.secrets if secret in body], body
    finally:
        server.stop()
        await asyncio.wait_for(task, 10)
