"""A 401 from the receipt API tells the client how to authenticate (RFC 6750)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import httpx
import pytest

from eventstore.store import Store
from projections import create_app
from projections.http_api import ROUTES
from projections.worker.supervisor import ReceiptServer

RUN = "run-challenge"


def sample_path(route: str) -> str:
    """A concrete path of a route shape (``GET /v1/runs/<run id>/progress``)."""
    path = route.split(" ", 1)[1]
    return path.replace("<invocation id>", "a" * 64).replace("<run id>", RUN)


@pytest.mark.parametrize("authorization", [None, "Bearer not-a-token", "Basic dXNlcjpwdw=="])
async def test_every_401_carries_a_bearer_challenge(
    make_store: Any, authorization: str | None
) -> None:
    """Every route answers a missing, wrong or non-Bearer credential with 401 and
    ``WWW-Authenticate: Bearer``; a valid token gets no challenge."""
    store: Store = make_store(shards=2)
    token = (await store.open_run(RUN, deadline=timedelta(minutes=5))).access_token
    server = ReceiptServer(create_app(store))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not task.done(), "the server did not start"
            await asyncio.sleep(0.005)
        headers = {} if authorization is None else {"Authorization": authorization}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
            for route in ROUTES:
                response = await client.get(sample_path(route), headers=headers)
                assert response.status_code == 401, route
                assert response.headers["www-authenticate"].startswith("Bearer"), route
            allowed = await client.get(
                sample_path(ROUTES[0]), headers={"Authorization": f"Bearer {token}"}
            )
            assert allowed.status_code == 200 and "www-authenticate" not in allowed.headers
    finally:
        server.stop()
        await asyncio.wait_for(task, 10)
