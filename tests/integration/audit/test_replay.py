"""``canon replay``: each invocation's timeline, its re-fold and a verdict, read-only.

Also holds the helpers the other audit-command tests share (``populate``, ``run_cli``).
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from redis.asyncio import Redis

from canon.cli import main
from eventstore.store import Store
from machine.codes import ErrorCode, EvidenceStatus
from machine.events import Failed, decode_event, event_hash
from machine.ids import invocation_id

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-audit"
REQUEST = b'{"query":"marker-request-7c1"}'
RAW = b"\xff\xfe marker-raw-7c1 not utf-8"
RESULT = b'{"summary":"marker-result-7c1"}'
#: tool_call_id -> (status, evidence status) after :func:`populate`.
CALLS = {
    "call-ready": ("READY", "EVIDENCE_FOUND"),
    "call-none": ("READY", "NO_EVIDENCE"),
    "call-fail": ("ERROR", "ERROR"),
    "call-open": ("PROJECTING", "PENDING"),
}


@pytest.fixture
async def store(make_open_store: Any) -> Store:
    """A store on the test's namespace, closed after the test."""
    store: Store = await make_open_store(shards=4, ttl=timedelta(minutes=10))
    return store


async def populate(store: Store, run_id: str = RUN) -> None:
    """Open a run and drive one invocation to each outcome listed in :data:`CALLS`."""
    await store.open_run(run_id, deadline=timedelta(minutes=5))
    writer = store.writer
    head = await writer.create(run_id, "call-ready", "search", REQUEST)
    head = await writer.start_projecting(head, RAW)
    await writer.complete(head, RESULT, EvidenceStatus.EVIDENCE_FOUND, "docs:title")
    head = await writer.create(run_id, "call-none", "lookup", REQUEST)
    head = await writer.start_projecting(head, b'{"hits":[]}')
    await writer.complete(head, b'{"ids":[]}', EvidenceStatus.NO_EVIDENCE, "docs:exact-id")
    head = await writer.create(run_id, "call-fail", "flaky", REQUEST)
    await writer.fail(head, ErrorCode.EXECUTION_FAILED)
    head = await writer.create(run_id, "call-open", "search", REQUEST)
    await writer.start_projecting(head, RAW)


async def run_cli(
    capsys: pytest.CaptureFixture[str], redis_url: str, namespace: str, *argv: str
) -> tuple[int, str, str]:
    """Run ``canon`` in-process (in a worker thread, it runs its own loop); exit, out, err."""
    capsys.readouterr()
    code = await asyncio.to_thread(
        main, [*argv, "--redis-url", redis_url, "--namespace", namespace]
    )
    out, err = capsys.readouterr()
    return code, out, err


async def replay_json(
    capsys: pytest.CaptureFixture[str], redis_url: str, namespace: str, *argv: str
) -> tuple[int, dict[str, Any]]:
    """Run ``canon replay --json`` and return its exit code and document."""
    code, out, _ = await run_cli(capsys, redis_url, namespace, "replay", *argv, "--json")
    return code, json.loads(out)


async def test_replay_of_an_untouched_run_is_intact_and_exits_0(
    store: Store, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every invocation of an untouched run replays intact, with all four verdicts true."""
    await populate(store)
    code, document = await replay_json(capsys, redis_url, namespace, RUN)
    assert code == 0
    assert document["intact"] is True
    replays = {replay["tool_call_id"]: replay for replay in document["invocations"]}
    assert set(replays) == set(CALLS)
    for call, (status, evidence) in CALLS.items():
        replay = replays[call]
        assert replay["invocation_id"] == invocation_id(RUN, call)
        assert replay["problems"] == []
        assert all(replay["verdict"].values())
        assert replay["record"] == replay["folded"]
        assert (replay["folded"]["status"], replay["folded"]["evidence_status"]) == (
            status,
            evidence,
        )


async def test_timeline_shows_version_event_time_sizes_digests_and_state_after(
    store: Store, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The timeline of a READY call lists each event with its payload size, digest and state."""
    await populate(store)
    code, document = await replay_json(capsys, redis_url, namespace, RUN, "call-ready")
    assert code == 0
    (replay,) = document["invocations"]
    steps = replay["timeline"]
    assert [step["version"] for step in steps] == [1, 2, 3]
    assert [step["event_type"] for step in steps] == [
        "Preflighted",
        "ProjectingStarted",
        "Completed",
    ]
    assert [step["payload_field"] for step in steps] == ["request", "raw", "result"]
    assert [step["payload_bytes"] for step in steps] == [len(REQUEST), len(RAW), len(RESULT)]
    stored = await store.events(RUN, "call-ready")
    assert [step["event_hash"] for step in steps] == [event_hash(s.data) for s in stored]
    assert [step["state"]["stage"] for step in steps] == ["EXECUTING", "PROJECTING", "READY"]
    assert steps[2]["detail"] == "EVIDENCE_FOUND"
    assert all(isinstance(step["at_ms"], int) for step in steps)


async def test_human_replay_answers_what_happened_to_the_call(
    store: Store, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The human output names the tool, the outcome, each event and the verdict."""
    await populate(store)
    code, out, err = await run_cli(capsys, redis_url, namespace, "replay", RUN, "call-fail")
    assert code == 0, err
    assert invocation_id(RUN, "call-fail") in out
    assert "tool flaky" in out and "status ERROR" in out and "error EXECUTION_FAILED" in out
    assert "Preflighted" in out and "Failed EXECUTION_FAILED" in out
    assert "every transition legal" in out
    assert "INTACT" in out and "NOT INTACT" not in out
    assert "marker-request-7c1" not in out


async def test_a_run_is_one_line_per_call_and_events_on_request(
    store: Store, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``canon replay RUN`` lists each call on one line (call, tool, status, evidence, code,
    verdict) and no timeline; ``--events`` shows every call's timeline as one call's
    replay does."""
    await populate(store)
    code, out, _ = await run_cli(capsys, redis_url, namespace, "replay", RUN)
    assert code == 0
    rows = [line for line in out.splitlines() if "call-" in line]
    assert len(rows) == len(CALLS)
    for call, (status, evidence) in CALLS.items():
        (row,) = [line for line in rows if f" {call} " in line]
        assert status in row and evidence in row and "INTACT" in row
    assert "EXECUTION_FAILED" in next(line for line in rows if " call-fail " in line)
    assert "Preflighted" not in out and "4 invocation(s) replayed, 0 not intact" in out
    assert "--events" in out  # says how to see the events

    code, events, _ = await run_cli(capsys, redis_url, namespace, "replay", RUN, "--events")
    assert code == 0
    assert events.count("Preflighted") == len(CALLS) and "every transition legal" in events


async def test_replay_never_prints_payload_bytes(
    store: Store, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Neither output form of replay contains a byte of any request, raw or result."""
    await populate(store)
    for argv in ((RUN,), (RUN, "--json")):
        code, out, _ = await run_cli(capsys, redis_url, namespace, "replay", *argv)
        assert code == 0
        assert "marker-" not in out


async def test_replay_reads_a_schema0_event_through_its_upcaster(
    store: Store, redis: Redis, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A journal holding a legacy schema 0 Failed replays intact; its hash is of stored bytes."""
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    head = await store.writer.create(RUN, "call-legacy", "search", REQUEST)
    legacy = {
        "type": "Failed",
        "code": "EXECUTION_FAILED",
        "event_id": "0" * 32,
        "version": 2,
        "at_ms": 1_700_000_000_000,
        "prev_hash": head.last_hash,
        "schema": 0,
    }
    data = msgspec.json.encode(legacy)
    hash_ = event_hash(data)
    assert isinstance(decode_event(data), Failed)
    record = store.keys.record(RUN, "call-legacy")
    # What the old writer stored: the stream entry and the folded record fields.
    await redis.xadd(store.keys.stream(RUN, "call-legacy"), {"e": data, "h": hash_})
    await redis.hset(
        record,
        mapping={
            "stage": "ERROR",
            "status": "ERROR",
            "evidence_status": "ERROR",
            "version": 2,
            "last_hash": hash_,
            "updated_at_ms": legacy["at_ms"],
            "error_code": "EXECUTION_FAILED",
            "e2": legacy["event_id"],
        },
    )
    code, document = await replay_json(capsys, redis_url, namespace, RUN, "call-legacy")
    assert code == 0, document["invocations"][0]["problems"]
    step = document["invocations"][0]["timeline"][1]
    assert (step["stored_schema"], step["event_type"], step["detail"]) == (
        0,
        "Failed",
        "EXECUTION_FAILED",
    )
    assert document["invocations"][0]["folded"]["last_hash"] == hash_


async def test_replay_of_an_unknown_run_exits_1(
    redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run with no invocation left is reported on stderr with exit 1, not as intact."""
    code, out, err = await run_cli(capsys, redis_url, namespace, "replay", "no-such-run")
    assert (code, out) == (1, "")
    assert "no invocation found" in err


async def test_unsafe_ids_are_a_usage_error(
    redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An id that may not reach a key gives exit 2 and one line on stderr."""
    code, _, err = await run_cli(capsys, redis_url, namespace, "replay", "run:1")
    assert code == 2
    assert err.count("\n") == 1 and "safe id" in err


async def test_unreachable_server_is_one_line_without_url_or_password(
    namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A refused connection gives exit 3 and one stderr line naming the server (host and
    port), never the URL with its user or password."""
    url = "redis://auditor:s3cret-pw@127.0.0.1:1/0"
    code, out, err = await run_cli(capsys, url, namespace, "replay", RUN)
    assert code == 3
    assert "refused" in err
    assert out == ""
    assert err.count("\n") == 1 and "unavailable" in err
    assert "s3cret-pw" not in err and "auditor" not in err and "Traceback" not in err
    assert "127.0.0.1:1" in err and url not in err


def test_no_configured_server_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --redis-url or REDIS_URL, replay exits 2 with one line, starting no server."""
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert main(["replay", RUN]) == 2
    assert "no Redis configured" in capsys.readouterr().err


async def test_invalid_namespace_is_a_usage_error(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A namespace that is not a safe id gives exit 2 and one line on stderr."""
    code, _, err = await run_cli(capsys, redis_url, "bad:namespace", "replay", RUN)
    assert code == 2
    assert "invalid settings" in err and err.count("\n") == 1


async def test_a_deleted_event_shows_on_its_step_and_leaves_the_record_unjudged(
    store: Store, redis: Redis, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """With ProjectingStarted deleted, Completed is a broken link and illegal; no record verdict."""
    await populate(store)
    stream = store.keys.stream(RUN, "call-ready")
    await redis.xdel(stream, (await redis.xrange(stream))[1][0])
    code, document = await replay_json(capsys, redis_url, namespace, RUN, "call-ready")
    assert code == 1
    (replay,) = document["invocations"]
    steps = replay["timeline"]
    assert [step["version"] for step in steps] == [1, 3]
    assert steps[1]["fold_error"] == "broken_chain, illegal_transition"
    assert steps[1]["state"] is None
    verdict = replay["verdict"]
    assert (verdict["chain_intact"], verdict["transitions_legal"]) == (False, False)
    assert (verdict["record_matches_fold"], verdict["payload_digests_match"]) == (None, None)
    assert replay["folded"]["stage"] == "EXECUTING"
