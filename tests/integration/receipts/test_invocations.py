"""``GET /v1/runs/<run id>/invocations``: every call of the token's run, in order, READY and
ERROR alike, with ids, tool, status, evidence, code and times, and never a payload."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest

from eventstore.store import Store
from machine.ids import invocation_id
from tests.support.console_run import FAILED_CALL, RUN, populate, serving

pytestmark = pytest.mark.backends("single", "cluster")

PATH = f"/v1/runs/{RUN}/invocations"


async def test_the_run_token_lists_every_call_in_order_without_payloads(make_store: Any) -> None:
    """READY, ERROR and in-flight calls in creation order; no payload byte in the answer."""
    store: Store = make_store(shards=2)
    token = await populate(store)
    async with serving(store, console=False) as base, httpx.AsyncClient(base_url=base) as client:
        response = await client.get(PATH, headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200
    assert response.headers["cache-control"] == "no-store"
    assert "PAYLOAD-MARKER" not in response.text
    document = response.json()
    assert document["schema_version"] == "canon.run-invocations.v1"
    assert document["run_id"] == RUN and document["read_only"] is True
    calls = document["invocations"]
    assert [c["tool_call_id"] for c in calls] == ["c1", "c2", FAILED_CALL, "c-flight"]
    assert [c["status"] for c in calls] == ["READY", "READY", "ERROR", "PROJECTING"]
    # Where each stands beside its status: the one in flight is still held by its process.
    assert [c["stage"] for c in calls] == ["ready", "ready", "error", "dispatching"]
    failed = calls[2]
    assert failed["invocation_id"] == invocation_id(RUN, FAILED_CALL)
    assert failed["tool"] == "fetch" and failed["error_code"] == "EXECUTION_FAILED"
    assert failed["evidence_status"] is None and failed["finished_at"].endswith("Z")
    assert calls[0]["evidence_status"] == "EVIDENCE_FOUND" and calls[0]["error_code"] is None
    assert calls[3]["finished_at"] is None
    assert set(failed) == {
        "invocation_id",
        "tool_call_id",
        "tool",
        "status",
        "stage",
        "evidence_status",
        "error_code",
        "created_at",
        "finished_at",
    }


async def test_another_run_or_no_token_sees_nothing(make_store: Any) -> None:
    """Another run's token gets 404 run_not_found; no token 401 with a Bearer challenge;
    a query string 400."""
    store: Store = make_store(shards=2)
    token = await populate(store)
    other = (await store.open_run("run-other", deadline=timedelta(minutes=5))).access_token
    async with serving(store, console=False) as base, httpx.AsyncClient(base_url=base) as client:
        foreign = await client.get(PATH, headers={"Authorization": f"Bearer {other}"})
        assert foreign.status_code == 404 and foreign.json()["error"] == "run_not_found"
        anonymous = await client.get(PATH)
        assert anonymous.status_code == 401
        assert anonymous.headers["www-authenticate"].startswith("Bearer")
        query = await client.get(PATH + "?all=1", headers={"Authorization": f"Bearer {token}"})
        assert query.status_code == 400
