"""Operators decide governed calls over HTTP, under the operator token only: one call
(``POST /v1/runs/<run>/invocations/<id>/approval``) or a batch (``POST /v1/approvals``)
under one decision id. A run's token never decides, a bad body is a 400 with a stable code
and decides nothing, and no answer carries a payload."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from eventstore.decisions import new_approval_id
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.codes import ErrorCode, Stage
from machine.ids import invocation_id
from projections.console import Console, OperatorAuth
from projections.console.auth import CLIENT_BURST, LoginThrottle
from tests.support.console_run import OPERATOR_TOKEN, bearer, serving

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-decide"
OTHER_RUN = "run-decide-2"
REQUEST = b'{"amount":5,"note":"REQUEST-PAYLOAD-MARKER"}'
OPERATOR = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
APPROVE = {"decision": "approve", "reason": "checked the invoice", "by": "ana"}


def approval_path(run_id: str, call: str) -> str:
    return f"/v1/runs/{run_id}/invocations/{invocation_id(run_id, call)}/approval"


async def waiting(store: Store, run_id: str, *calls: str) -> str:
    """Open the run (once) and record each call as a governed call awaiting a decision;
    returns the run's agent token (empty when the run was open already)."""
    token = ""
    if await store.run_info(run_id) is None:
        token = (await store.open_run(run_id, deadline=timedelta(minutes=10))).access_token
    for call in calls:
        await store.writer.request_approval(
            run_id,
            call,
            "refund",
            REQUEST,
            approval_id=new_approval_id(),
            approval_expires_at_ms=now_ms() + 600_000,
            requested_by="agent",
        )
    return token


async def stage_of(store: Store, run_id: str, call: str) -> Stage:
    record = await store.reader.get(run_id, call)
    assert record is not None
    return record.state.stage


async def test_the_operator_approves_and_the_first_decision_wins(make_store: Any) -> None:
    """An approval is 200 with the decision (made now) and the record APPROVED with the
    approver and reason; a later denial is 200 answering the first decision (made_now
    false) and changes nothing; a denial of another call ends it APPROVAL_DENIED. One
    ``approval_decided`` line per decision made, without its reason; no payload."""
    store: Store = make_store(shards=2)
    await waiting(store, RUN, "pay-1", "pay-2")
    async with serving(store) as base, httpx.AsyncClient(base_url=base, headers=OPERATOR) as http:
        with capture_logs() as logs:
            approved = await http.post(approval_path(RUN, "pay-1"), json=APPROVE)
            again = await http.post(
                approval_path(RUN, "pay-1"),
                json={"decision": "deny", "reason": "too late"},
                headers=bearer("bo"),
            )
            denied = await http.post(
                approval_path(RUN, "pay-2"),
                json={"decision": "deny", "reason": "duplicate payment"},
                headers=bearer("bo"),
            )
    assert approved.status_code == 200, approved.text
    body = approved.json()
    assert body == {
        "schema_version": "canon.approval-decision.v1",
        "run_id": RUN,
        "tool_call_id": "pay-1",
        "invocation_id": invocation_id(RUN, "pay-1"),
        "approval_id": body["approval_id"],
        "outcome": "approved",
        "decided_by": "ana",
        "reason": "checked the invoice",
        "decision_id": body["decision_id"],
        "made_now": True,
        "approvals": 1,
        "approvals_required": 1,
    }
    assert again.status_code == 200
    assert again.json()["made_now"] is False
    assert (again.json()["outcome"], again.json()["decided_by"]) == ("approved", "ana")
    assert again.json()["decision_id"] == body["decision_id"]
    assert denied.status_code == 200 and denied.json()["outcome"] == "denied"

    record = await store.reader.get(RUN, "pay-1")
    assert record is not None and record.state.stage is Stage.APPROVED
    assert (record.state.decided_by, record.state.decision_reason) == ("ana", "checked the invoice")
    assert record.state.decision_id == body["decision_id"]
    second = await store.reader.get(RUN, "pay-2")
    assert second is not None and second.state.error_code is ErrorCode.APPROVAL_DENIED
    decided = [entry for entry in logs if entry["event"] == "approval_decided"]
    assert [(entry["outcome"], entry["door"]) for entry in decided] == [
        ("approved", "http"),
        ("denied", "http"),
    ]
    assert "checked the invoice" not in repr(logs)
    for answer in (approved, again, denied):
        assert "PAYLOAD-MARKER" not in answer.text
        assert answer.headers["cache-control"] == "no-store"


async def test_a_run_token_never_decides(make_store: Any) -> None:
    """The run's own agent token is 403 operator_token_required (logged, not counted as a
    guess); a wrong token or none is 401 with a Bearer challenge; nothing is decided."""
    store: Store = make_store(shards=2)
    agent_token = await waiting(store, RUN, "pay-1")
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as http:
        with capture_logs() as logs:
            agent = await http.post(
                approval_path(RUN, "pay-1"),
                json=APPROVE,
                headers={"Authorization": f"Bearer {agent_token}"},
            )
            batch = await http.post(
                "/v1/approvals",
                json={**APPROVE, "calls": [{"run_id": RUN, "tool_call_id": "pay-1"}]},
                headers={"Authorization": f"Bearer {agent_token}"},
            )
        wrong = await http.post(
            approval_path(RUN, "pay-1"),
            json=APPROVE,
            headers={"Authorization": "Bearer not-the-operator-token"},
        )
        anonymous = await http.post(approval_path(RUN, "pay-1"), json=APPROVE)
    for answer in (agent, batch):
        assert answer.status_code == 403
        assert answer.json()["error"] == "operator_token_required"
    for answer in (wrong, anonymous):
        assert answer.status_code == 401 and answer.json() == {"error": "unauthorized"}
        assert answer.headers["www-authenticate"].startswith("Bearer")
    refused = [entry for entry in logs if entry["event"] == "decision_refused"]
    assert [(entry["reason"], entry["run_id"]) for entry in refused] == [("run_token", RUN)] * 2
    assert agent_token not in repr(logs)
    assert await stage_of(store, RUN, "pay-1") is Stage.AWAITING_APPROVAL


UNSUPPORTED = "unsupported_media_type"
#: Bodies a decision route refuses: (content, content type, status, error code).
BAD_BODIES: dict[str, tuple[bytes, str, int, str]] = {
    "not JSON": (b"decision=approve", "application/json", 400, "invalid_json"),
    "not UTF-8": (b'{"decision": "\xff"}', "application/json", 400, "invalid_json"),
    "a member twice": (
        b'{"decision":"approve","decision":"deny","reason":"r","by":"b"}',
        "application/json",
        400,
        "invalid_json",
    ),
    "NaN": (b'{"decision":NaN}', "application/json", 400, "invalid_json"),
    "an array": (b"[]", "application/json", 400, "invalid_body"),
    "missing reason": (
        b'{"decision":"approve","by":"ana"}',
        "application/json",
        400,
        "missing_field",
    ),
    "unknown field": (
        json.dumps({**APPROVE, "force": True}).encode(),
        "application/json",
        400,
        "unknown_field",
    ),
    "other decision": (
        json.dumps({**APPROVE, "decision": "yes"}).encode(),
        "application/json",
        400,
        "invalid_decision",
    ),
    "empty reason": (
        json.dumps({**APPROVE, "reason": "  "}).encode(),
        "application/json",
        400,
        "invalid_reason",
    ),
    "reason with a line break": (
        json.dumps({**APPROVE, "reason": "a\nb"}).encode(),
        "application/json",
        400,
        "invalid_reason",
    ),
    "reason too long": (
        json.dumps({**APPROVE, "reason": "x" * 1001}).encode(),
        "application/json",
        400,
        "invalid_reason",
    ),
    "edit without arguments": (
        json.dumps({**APPROVE, "decision": "edit"}).encode(),
        "application/json",
        400,
        "invalid_arguments",
    ),
    "arguments without an edit": (
        json.dumps({**APPROVE, "arguments": {"amount": 1}}).encode(),
        "application/json",
        400,
        "invalid_arguments",
    ),
    "over 16 KiB": (
        json.dumps({**APPROVE, "pad": "x" * 17_000}).encode(),
        "application/json",
        400,
        "body_too_large",
    ),
    "a form": (b"decision=approve", "application/x-www-form-urlencoded", 415, UNSUPPORTED),
    "latin-1": (
        json.dumps(APPROVE).encode(),
        "application/json; charset=latin-1",
        415,
        UNSUPPORTED,
    ),
}


async def test_bad_bodies_are_refused_with_stable_codes_and_decide_nothing(
    make_store: Any,
) -> None:
    """Each malformed body is refused with its own code and a fixed message that never
    echoes what was sent; the call still waits; no error is logged."""
    store: Store = make_store(shards=2)
    await waiting(store, RUN, "pay-1")
    path = approval_path(RUN, "pay-1")
    async with serving(store) as base, httpx.AsyncClient(base_url=base, headers=OPERATOR) as http:
        with capture_logs() as logs:
            for name, (content, content_type, status, code) in BAD_BODIES.items():
                answer = await http.post(
                    path, content=content, headers={"Content-Type": content_type}
                )
                assert (answer.status_code, answer.json()["error"]) == (status, code), name
                assert "xxxx" not in answer.text and "yes" not in answer.text, name
            query = await http.post(path + "?x=1", json=APPROVE)
            assert (query.status_code, query.json()["error"]) == (400, "invalid_request")
    assert not [entry for entry in logs if entry["log_level"] in ("error", "critical")]
    assert await stage_of(store, RUN, "pay-1") is Stage.AWAITING_APPROVAL


async def test_calls_that_cannot_be_decided(make_store: Any) -> None:
    """A call that is not governed is 409 not_awaiting_approval with its stage; an unknown
    call, an unknown run or an unsafe run id is 404 invocation_not_found; an id that is
    not 64 lowercase hex is 400; GET on a decision route stays 404 for a run's token."""
    store: Store = make_store(shards=2)
    agent_token = await waiting(store, RUN, "pay-1")
    await store.writer.create(RUN, "plain", "search", b"{}")
    async with serving(store) as base, httpx.AsyncClient(base_url=base, headers=OPERATOR) as http:
        plain = await http.post(approval_path(RUN, "plain"), json=APPROVE)
        unknown = await http.post(approval_path(RUN, "nope"), json=APPROVE)
        other_run = await http.post(
            f"/v1/runs/run-absent/invocations/{invocation_id(RUN, 'pay-1')}/approval",
            json=APPROVE,
        )
        unsafe = await http.post(
            f"/v1/runs/.x/invocations/{invocation_id(RUN, 'pay-1')}/approval", json=APPROVE
        )
        upper = await http.post(
            f"/v1/runs/{RUN}/invocations/{invocation_id(RUN, 'pay-1').upper()}/approval",
            json=APPROVE,
        )
        read = await http.get(
            approval_path(RUN, "pay-1"), headers={"Authorization": f"Bearer {agent_token}"}
        )
    assert plain.status_code == 409
    assert plain.json()["error"] == "not_awaiting_approval"
    assert plain.json()["stage"] == Stage.EXECUTING.value
    for answer in (unknown, other_run, unsafe):
        assert answer.status_code == 404 and answer.json()["error"] == "invocation_not_found"
    assert upper.status_code == 400 and upper.json()["error"] == "invalid_request"
    assert read.status_code == 404 and read.json()["error"] == "not_found"
    assert await stage_of(store, RUN, "pay-1") is Stage.AWAITING_APPROVAL


async def test_a_batch_decides_exactly_the_listed_calls_under_one_decision_id(
    make_store: Any,
) -> None:
    """A batch across two runs decides the calls it lists and no other, each record holding
    the batch's one decision id; an already decided call answers its first decision and an
    unknown one invocation_not_found, in the order listed."""
    store: Store = make_store(shards=2)
    await waiting(store, RUN, "pay-1", "pay-2", "pay-3", "left-alone")
    await waiting(store, OTHER_RUN, "pay-9")
    async with serving(store) as base, httpx.AsyncClient(base_url=base, headers=OPERATOR) as http:
        first = await http.post(approval_path(RUN, "pay-3"), json=APPROVE)
        listed = [
            (RUN, "pay-1"),
            (OTHER_RUN, "pay-9"),
            (RUN, "pay-3"),
            (RUN, "nope"),
            (RUN, "pay-2"),
        ]
        batch = await http.post(
            "/v1/approvals",
            json={
                "decision": "deny",
                "reason": "a duplicate batch",
                "calls": [{"run_id": run, "tool_call_id": call} for run, call in listed],
            },
            headers=bearer("bo"),
        )
    assert batch.status_code == 200, batch.text
    document = batch.json()
    decision_id = document["decision_id"]
    assert decision_id != first.json()["decision_id"]
    rows = document["decisions"]
    assert [(row["run_id"], row["tool_call_id"]) for row in rows] == listed
    assert [row.get("outcome") for row in rows] == ["denied", "denied", "approved", None, "denied"]
    assert [row.get("made_now") for row in rows] == [True, True, False, None, True]
    assert rows[3]["error"] == "invocation_not_found"
    assert rows[2]["decided_by"] == "ana"
    for run_id, call in (listed[0], listed[1], listed[4]):
        record = await store.reader.get(run_id, call)
        assert record is not None and record.state.error_code is ErrorCode.APPROVAL_DENIED
        assert record.state.decision_id == decision_id
        assert (record.state.decided_by, record.state.decision_reason) == (
            "bo",
            "a duplicate batch",
        )
    assert await stage_of(store, RUN, "left-alone") is Stage.AWAITING_APPROVAL
    assert await stage_of(store, RUN, "pay-3") is Stage.APPROVED
    assert "PAYLOAD-MARKER" not in batch.text


async def test_a_bad_batch_decides_nothing(make_store: Any) -> None:
    """No calls, over 100, one listed twice, an unsafe id or a malformed entry: 400
    invalid_calls before any call is decided (the valid ones listed first included)."""
    store: Store = make_store(shards=2)
    await waiting(store, RUN, "pay-1")
    good = {"run_id": RUN, "tool_call_id": "pay-1"}
    bad_lists: list[Any] = [
        [],
        [good] + [{"run_id": RUN, "tool_call_id": f"c{n}"} for n in range(100)],
        [good, good],
        [good, {"run_id": "bad:run", "tool_call_id": "x"}],
        [good, {"run_id": RUN, "tool_call_id": "has space"}],
        [good, {"run_id": RUN}],
        [good, {"run_id": RUN, "tool_call_id": "x", "more": 1}],
        [good, "pay-2"],
        {"run_id": RUN, "tool_call_id": "pay-1"},
    ]
    async with serving(store) as base, httpx.AsyncClient(base_url=base, headers=OPERATOR) as http:
        for calls in bad_lists:
            answer = await http.post("/v1/approvals", json={**APPROVE, "calls": calls})
            assert answer.status_code == 400, calls
            assert answer.json()["error"] == "invalid_calls", calls
        no_calls = await http.post("/v1/approvals", json=APPROVE)
        assert no_calls.json()["error"] == "missing_field"
    assert await stage_of(store, RUN, "pay-1") is Stage.AWAITING_APPROVAL


async def test_without_an_operator_token_there_is_no_decision_route(make_store: Any) -> None:
    """With no console (no operator token) a POST is what it always was: 401 without a
    run's token, 404 not_found with one."""
    store: Store = make_store(shards=2)
    agent_token = await waiting(store, RUN, "pay-1")
    async with serving(store, console=False) as base, httpx.AsyncClient(base_url=base) as http:
        anonymous = await http.post("/v1/approvals", json=APPROVE, headers=OPERATOR)
        agent = await http.post(
            approval_path(RUN, "pay-1"),
            json=APPROVE,
            headers={"Authorization": f"Bearer {agent_token}"},
        )
    assert anonymous.status_code == 401
    assert agent.status_code == 404 and agent.json()["error"] == "not_found"
    assert await stage_of(store, RUN, "pay-1") is Stage.AWAITING_APPROVAL


async def test_wrong_tokens_use_up_the_consoles_allowance(make_store: Any) -> None:
    """Wrong tokens sent to a decision route count against the console's limit on failed
    logins: past it the route is 429 with Retry-After, and so is the console's login."""
    store: Store = make_store(shards=2)
    await waiting(store, RUN, "pay-1")
    app = Console(
        store, OperatorAuth(OPERATOR_TOKEN), throttle=LoginThrottle(clock=lambda: 1_000.0)
    )
    wrong = {"Authorization": "Bearer a-wrong-token-long-enough"}
    async with serving(store, app=app) as base, httpx.AsyncClient(base_url=base) as http:
        for _ in range(CLIENT_BURST):
            answer = await http.post(approval_path(RUN, "pay-1"), json=APPROVE, headers=wrong)
            assert answer.status_code == 401
        limited = await http.post(approval_path(RUN, "pay-1"), json=APPROVE, headers=OPERATOR)
        login = await http.post("/console/login", data={"token": OPERATOR_TOKEN})
    assert limited.status_code == 429 and limited.json()["error"] == "too_many_attempts"
    assert int(limited.headers["retry-after"]) > 0
    assert login.status_code == 429
    assert await stage_of(store, RUN, "pay-1") is Stage.AWAITING_APPROVAL


async def test_a_decision_is_the_operator_the_token_names_whatever_the_body_says(
    make_store: Any,
) -> None:
    """bo's token with ``"by": "mallory"`` in the body: the decision is recorded as bo's,
    and the answer says so."""
    store: Store = make_store(shards=2)
    await waiting(store, RUN, "pay-1")
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as http:
        answer = await http.post(
            approval_path(RUN, "pay-1"),
            json={"decision": "approve", "reason": "ok", "by": "mallory"},
            headers=bearer("bo"),
        )
    assert answer.status_code == 200, answer.text
    assert answer.json()["decided_by"] == "bo"
    record = await store.reader.get(RUN, "pay-1")
    assert record is not None and record.state.decided_by == "bo"


async def test_the_requester_is_refused_and_the_others_decide(make_store: Any) -> None:
    """A call requested by cy: cy's approval is 403 requester_cannot_approve and changes
    nothing; ana's goes through."""
    store: Store = make_store(shards=2)
    await store.open_run(RUN, deadline=timedelta(minutes=10))
    await store.writer.request_approval(
        RUN,
        "mine",
        "refund",
        REQUEST,
        approval_id=new_approval_id(),
        approval_expires_at_ms=now_ms() + 600_000,
        requested_by="cy",
    )
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as http:
        own = await http.post(approval_path(RUN, "mine"), json=APPROVE, headers=bearer("cy"))
        assert (own.status_code, own.json()["error"]) == (403, "requester_cannot_approve")
        assert await stage_of(store, RUN, "mine") is Stage.AWAITING_APPROVAL
        other = await http.post(approval_path(RUN, "mine"), json=APPROVE, headers=bearer("ana"))
    assert other.status_code == 200 and other.json()["decided_by"] == "ana"


async def test_an_edit_over_http_supersedes_the_call(make_store: Any) -> None:
    """``"decision": "edit"`` with the edited arguments: the original denied as superseded
    by the operator the token names, the edited call waiting; an object naming a member
    twice is refused (400, the message every door gives) and nothing is written."""
    store: Store = make_store(shards=2)
    await waiting(store, RUN, "pay-1")
    path = approval_path(RUN, "pay-1")
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as http:
        twice = await http.post(
            path,
            content=b'{"decision":"edit","reason":"cap","arguments":{"amount":1,"amount":9}}',
            headers={**bearer("bo"), "Content-Type": "application/json"},
        )
        assert twice.status_code == 400 and "names a member twice" in twice.json()["message"]
        assert await store.get(RUN, "pay-1.edit1") is None
        edit = await http.post(
            path,
            json={"decision": "edit", "reason": "cap", "arguments": {"amount": 1}},
            headers=bearer("bo"),
        )
    assert edit.status_code == 200, edit.text
    document = edit.json()
    assert (document["outcome"], document["decided_by"]) == ("denied", "bo")
    assert document["edited"] == {
        "tool_call_id": "pay-1.edit1",
        "invocation_id": invocation_id(RUN, "pay-1.edit1"),
    }
    edited = await store.get(RUN, "pay-1.edit1")
    assert edited is not None and edited.state.stage is Stage.AWAITING_APPROVAL
    assert edited.request == b'{"amount":1}'
