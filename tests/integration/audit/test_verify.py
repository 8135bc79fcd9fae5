"""``canon verify`` over a namespace, and the tamper tests every audit command must catch."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from redis.asyncio import Redis

from canon.cli import main
from eventstore.store import Store
from eventstore.wire.keys import shard_of
from machine.events import decode_event, encode_event, event_hash
from machine.ids import invocation_id
from tests.integration.audit.test_replay import CALLS, RUN, populate, replay_json, run_cli, store

__all__ = ["store"]  # the fixture, re-used from the replay tests

Tamper = Callable[[Store, Redis], Awaitable[None]]


async def verify_json(
    capsys: pytest.CaptureFixture[str], redis_url: str, namespace: str, *argv: str
) -> tuple[int, list[dict[str, Any]], dict[str, Any]]:
    """Run ``canon verify --json``; return exit code, problem lines and the summary line."""
    code, out, _ = await run_cli(capsys, redis_url, namespace, "verify", "--json", *argv)
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[-1]["kind"] == "summary"
    return code, [line for line in lines if line["kind"] == "problem"], lines[-1]


async def change_status(store: Store, redis: Redis) -> None:
    """Change one record field: a READY record claims ERROR."""
    await redis.hset(store.keys.record(RUN, "call-ready"), "status", "ERROR")


async def delete_middle_entry(store: Store, redis: Redis) -> None:
    """Delete the second event of a three-event stream (XDEL)."""
    stream = store.keys.stream(RUN, "call-ready")
    entries = await redis.xrange(stream)
    await redis.xdel(stream, entries[1][0])


async def persist_record(store: Store, redis: Redis) -> None:
    """Remove the record's TTL (PERSIST): it would never expire."""
    assert await redis.persist(store.keys.record(RUN, "call-ready"))


async def persist_stream(store: Store, redis: Redis) -> None:
    """Remove the stream's TTL (PERSIST): the journal would outlive its record."""
    assert await redis.persist(store.keys.stream(RUN, "call-ready"))


async def shorten_stream_ttl(store: Store, redis: Redis) -> None:
    """Give the stream its own, earlier expiry: record and stream no longer expire together."""
    assert await redis.pexpire(store.keys.stream(RUN, "call-ready"), 60_000)


async def _rewrite_last_event(store: Store, redis: Redis, *, rehash: bool) -> None:
    stream = store.keys.stream(RUN, "call-ready")
    entry_id, fields = (await redis.xrange(stream))[-1]
    data = encode_event(msgspec.structs.replace(decode_event(fields[b"e"]), result_sha256="f" * 64))
    # The rewritten entry carries a stored hash beside it, as entries before schema 2 did:
    # the new bytes' hash, or the hash of the bytes it replaced.
    stored_hash = event_hash(data) if rehash else event_hash(fields[b"e"])
    await redis.xdel(stream, entry_id)
    await redis.xadd(stream, {"e": data, "h": stored_hash})


async def alter_digest_and_rehash(store: Store, redis: Redis) -> None:
    """Rewrite the Completed event with another result digest and a matching event hash."""
    await _rewrite_last_event(store, redis, rehash=True)


async def alter_digest_keep_hash(store: Store, redis: Redis) -> None:
    """Rewrite the Completed event with another result digest, leaving the stored hash."""
    await _rewrite_last_event(store, redis, rehash=False)


async def append_after_terminal(store: Store, redis: Redis) -> None:
    """Append a well-chained ProjectingStarted after Completed: an illegal transition."""
    stream = store.keys.stream(RUN, "call-ready")
    _, fields = (await redis.xrange(stream))[-1]
    event = {
        "type": "ProjectingStarted",
        "raw_sha256": "a" * 64,
        "raw_bytes": 1,
        "event_id": "1" * 32,
        "version": 4,
        "at_ms": 1,
        "prev_hash": event_hash(fields[b"e"]),
        "schema": 1,
    }
    data = msgspec.json.encode(event)
    await redis.xadd(stream, {"e": data, "h": event_hash(data)})


async def delete_record(store: Store, redis: Redis) -> None:
    """Delete the record, leaving its stream."""
    await redis.delete(store.keys.record(RUN, "call-ready"))


async def delete_stream(store: Store, redis: Redis) -> None:
    """Delete the stream, leaving its record."""
    await redis.delete(store.keys.stream(RUN, "call-ready"))


TAMPERS: list[tuple[Tamper, str]] = [
    (change_status, "tampered_field:status"),
    (delete_middle_entry, "broken_chain:2"),
    (persist_record, "key_without_ttl:record"),
    (persist_stream, "key_without_ttl:stream"),
    (shorten_stream_ttl, "expiry_mismatch"),
    (alter_digest_and_rehash, "payload_digest_mismatch:result"),
    (alter_digest_keep_hash, "hash_mismatch:3"),
    (append_after_terminal, "illegal_transition:4"),
    (delete_record, "stream_without_record"),
    (delete_stream, "record_without_stream"),
]
IDS = [tamper.__name__ for tamper, _ in TAMPERS]


async def test_untouched_namespace_verifies_clean_with_counts_by_status(
    store: Store, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An untouched namespace exits 0, lists no problem and counts records by status."""
    await populate(store)
    code, problems, summary = await verify_json(capsys, redis_url, namespace)
    assert (code, problems) == (0, [])
    assert summary["complete"] is True and summary["next_cursor"] == 0
    assert summary["invocations"] == len(CALLS)
    assert summary["by_status"] == {"ERROR": 1, "PROJECTING": 1, "READY": 2}


async def test_verify_ignores_other_namespaces(
    store: Store, redis: Redis, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tampered record of another namespace is not this namespace's problem."""
    await populate(store)
    await change_status(store, redis)
    code, problems, summary = await verify_json(capsys, redis_url, namespace + "x")
    assert (code, problems, summary["invocations"]) == (0, [], 0)


@pytest.mark.parametrize(("tamper", "reason"), TAMPERS, ids=IDS)
async def test_verify_reports_each_tamper_with_its_reason(
    tamper: Tamper,
    reason: str,
    store: Store,
    redis: Redis,
    redis_url: str,
    namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each tamper is listed with the tampered invocation's id and its reason; exit 1."""
    await populate(store)
    await tamper(store, redis)
    code, problems, summary = await verify_json(capsys, redis_url, namespace)
    assert code == 1
    reasons = {(p["invocation_id"], p["reason"]) for p in problems}
    assert (invocation_id(RUN, "call-ready"), reason) in reasons
    assert {p["tool_call_id"] for p in problems} == {"call-ready"}
    assert summary["problems"] == len(problems)


@pytest.mark.parametrize(("tamper", "reason"), TAMPERS, ids=IDS)
async def test_replay_reports_each_tamper_with_its_reason(
    tamper: Tamper,
    reason: str,
    store: Store,
    redis: Redis,
    redis_url: str,
    namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Replaying the run after each tamper shows the reason on that call only; exit 1."""
    await populate(store)
    await tamper(store, redis)
    code, document = await replay_json(capsys, redis_url, namespace, RUN)
    assert code == 1
    assert document["intact"] is False
    broken = {r["tool_call_id"]: r for r in document["invocations"] if not r["verdict"]["intact"]}
    assert set(broken) == {"call-ready"}
    assert reason in broken["call-ready"]["problems"]


async def test_verify_reports_keys_outside_the_layout(
    store: Store, redis: Redis, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record under another shard's tag, or an ``inv`` key without a call id part, is
    reported."""
    await populate(store)
    wrong = (shard_of(RUN, store.keys.shards) + 1) % store.keys.shards
    await redis.hset(f"{store.keys.tag(wrong)}:inv:{RUN}:call-moved", "status", "READY")
    await redis.hset(f"{store.keys.tag(0)}:inv:no-call-part", "status", "READY")
    code, problems, _ = await verify_json(capsys, redis_url, namespace)
    assert code == 1
    assert {(p["tool_call_id"], p["reason"]) for p in problems} == {
        ("call-moved", "misplaced_key"),
        ("", "unrecognized_key"),
    }


async def test_verify_reports_a_key_with_an_unsafe_id_as_misplaced(
    store: Store, redis: Redis, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record key whose call id no writer would accept (a space, a brace) is reported as
    misplaced; verify does not stop at it."""
    await populate(store)
    await redis.hset(f"{store.keys.tag_of(RUN)}:inv:{RUN}:bad {{call}}", "status", "READY")
    code, problems, _ = await verify_json(capsys, redis_url, namespace)
    assert code == 1
    assert [(p["tool_call_id"], p["reason"]) for p in problems] == [("bad {call}", "misplaced_key")]


async def test_human_verify_names_invocation_and_reason(
    store: Store, redis: Redis, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --json each problem is one line with the invocation id and the reason."""
    await populate(store)
    await persist_record(store, redis)
    code, out, _ = await run_cli(capsys, redis_url, namespace, "verify")
    assert code == 1
    line = next(line for line in out.splitlines() if line.startswith("PROBLEM"))
    assert invocation_id(RUN, "call-ready") in line and "reason=key_without_ttl:record" in line
    assert "1 problem(s)" in out


async def test_human_replay_shows_the_failed_check_and_reason(
    store: Store, redis: Redis, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The human replay of a tampered call marks the failed check and prints NOT INTACT."""
    await populate(store)
    await change_status(store, redis)
    code, out, _ = await run_cli(capsys, redis_url, namespace, "replay", RUN, "call-ready")
    assert code == 1
    assert "✗ record equals the fold of its journal" in out
    assert "problem: tampered_field:status" in out
    assert "NOT INTACT" in out


async def test_verify_resumes_from_a_cursor_until_complete(
    store: Store, redis: Redis, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --max-keys, verify stops early with a cursor; resuming from it covers the rest."""
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    calls = [f"call-{n:02d}" for n in range(30)]
    for call in calls:
        await store.writer.create(RUN, call, "search", b"{}")
    await redis.hset(store.keys.record(RUN, "call-17"), "tool", "other")
    cursor, rounds, seen, flagged = "0", 0, 0, set()
    while True:
        code, problems, summary = await verify_json(
            capsys, redis_url, namespace, "--batch", "5", "--max-keys", "10", "--cursor", cursor
        )
        rounds += 1
        seen += summary["invocations"]
        flagged |= {(p["tool_call_id"], p["reason"]) for p in problems}
        if summary["complete"]:
            break
        assert code == 1 and summary["next_cursor"] != 0
        cursor = str(summary["next_cursor"])
    assert rounds > 1
    assert seen >= len(calls)  # SCAN may return a key twice, never miss one
    assert flagged == {("call-17", "tampered_field:tool")}


def test_verify_refuses_a_negative_cursor(capsys: pytest.CaptureFixture[str]) -> None:
    """A bad --cursor is a usage error (exit 2, one line), not a traceback."""
    code = main(["verify", "--cursor", "-1", "--redis-url", "redis://127.0.0.1:1/0"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--cursor" in err and "Traceback" not in err


async def test_a_cursor_past_the_end_checks_nothing_and_says_so(
    store: Store, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A resumed scan that checked nothing is never CLEAN: it says so and exits 1."""
    await populate(store)
    code, out, err = await run_cli(capsys, redis_url, namespace, "verify", "--cursor", "999999999")
    assert "CLEAN" not in out and err == ""
    _, _, summary = await verify_json(capsys, redis_url, namespace, "--cursor", "999999999")
    if summary["invocations"] == 0:
        assert code == 1 and "NOTHING CHECKED" in out and "after cursor 999999999" in out
    else:  # SCAN masks a large cursor into its table: the keys after it were checked
        assert code == 0 and "no problem from cursor 999999999 to the end" in out


async def test_a_resumed_scan_is_not_called_clean(
    store: Store, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """From a cursor an earlier run printed, a scan without problems is no proof of the
    whole namespace: it says which part it checked."""
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    for n in range(30):
        await store.writer.create(RUN, f"call-{n:02d}", "search", b"{}")
    _, _, first = await verify_json(capsys, redis_url, namespace, "--batch", "5", "--max-keys", "5")
    assert not first["complete"]
    cursor = str(first["next_cursor"])
    code, out, _ = await run_cli(capsys, redis_url, namespace, "verify", "--cursor", cursor)
    assert code == 0 and "CLEAN" not in out
    assert f"no problem from cursor {cursor} to the end" in out


async def test_an_empty_namespace_is_not_called_clean(
    redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing to check is said as such (a mistyped --namespace shows), exit 0."""
    code, out, _ = await run_cli(capsys, redis_url, namespace + "-empty", "verify")
    assert code == 0 and "CLEAN" not in out
    assert f"nothing to check: namespace {namespace}-empty holds no invocation records" in out
