"""``canon export RUN_ID``: JSON Lines of records and events; payloads only when asked."""

from __future__ import annotations

import base64
import json
import pathlib
from typing import Any

import pytest
from redis.asyncio import Redis

from eventstore.store import Store
from machine.events import event_hash
from machine.ids import invocation_id
from tests.integration.audit.test_replay import (
    CALLS,
    RAW,
    REQUEST,
    RESULT,
    RUN,
    populate,
    run_cli,
    store,
)

pytestmark = pytest.mark.backends("single", "cluster")

__all__ = ["store"]  # the fixture, re-used from the replay tests


async def export_lines(
    capsys: pytest.CaptureFixture[str], redis_url: str, namespace: str, *argv: str
) -> tuple[int, list[dict[str, Any]]]:
    """Run ``canon export`` and parse its JSON Lines."""
    code, out, _ = await run_cli(capsys, redis_url, namespace, "export", *argv)
    return code, [json.loads(line) for line in out.splitlines()]


async def test_export_lists_header_run_records_events_and_end_in_order(
    store: Store, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Export writes a header, the run, each record followed by its events, then the counts."""
    await populate(store)
    code, lines = await export_lines(capsys, redis_url, namespace, RUN)
    assert code == 0
    kinds = [line["kind"] for line in lines]
    assert kinds[:2] == ["export", "run"] and kinds[-1] == "end"
    assert lines[0]["format"] == "canon.export.v1" and lines[0]["with_payloads"] is False
    assert lines[1]["present"] is True and lines[1]["invocations"] == len(CALLS)
    assert "token_sha256" not in json.dumps(lines[1])
    records = [line for line in lines if line["kind"] == "record"]
    assert {r["tool_call_id"] for r in records} == set(CALLS)
    for record in records:
        assert record["invocation_id"] == invocation_id(RUN, record["tool_call_id"])
        assert record["fields"]["status"] == CALLS[record["tool_call_id"]][0]
        assert record["problems"] == []
        assert record["record_pttl_ms"] > 0
    events = [line for line in lines if line["kind"] == "event"]
    assert lines[-1] == {"kind": "end", "invocations": len(CALLS), "events": len(events)}
    ready = invocation_id(RUN, "call-ready")
    stored = await store.events(RUN, "call-ready")
    exported = [e for e in events if e["invocation_id"] == ready]
    assert [e["computed_hash"] for e in exported] == [event_hash(s.data) for s in stored]
    assert [e["event"]["version"] for e in exported] == [1, 2, 3]


async def test_export_without_the_flag_carries_no_payload_byte(
    store: Store, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --with-payloads no request, raw or result byte appears, only their sizes."""
    await populate(store)
    code, out, _ = await run_cli(capsys, redis_url, namespace, "export", RUN)
    assert code == 0
    assert "marker-" not in out and '"payloads"' not in out
    record = next(
        json.loads(line) for line in out.splitlines() if '"tool_call_id":"call-ready"' in line
    )
    assert record["stored_payload_bytes"] == {
        "request": len(REQUEST),
        "raw": len(RAW),
        "result": len(RESULT),
    }


async def test_export_with_payloads_gives_text_or_base64(
    store: Store, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --with-payloads, UTF-8 payloads come as text and other bytes as base64."""
    await populate(store)
    code, lines = await export_lines(capsys, redis_url, namespace, RUN, "--with-payloads")
    assert code == 0
    assert lines[0]["with_payloads"] is True
    record = next(
        line for line in lines if line["kind"] == "record" and line["tool_call_id"] == "call-ready"
    )
    payloads = record["payloads"]
    assert payloads["request"] == {"encoding": "utf-8", "text": REQUEST.decode()}
    assert payloads["result"] == {"encoding": "utf-8", "text": RESULT.decode()}
    assert payloads["raw"]["encoding"] == "base64"
    assert base64.b64decode(payloads["raw"]["data"]) == RAW


async def test_export_to_a_file_writes_the_same_lines(
    store: Store,
    redis_url: str,
    namespace: str,
    tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--output FILE`` writes the JSON Lines there and nothing to stdout."""
    await populate(store)
    target = tmp_path / "audit.jsonl"
    code, out, _ = await run_cli(
        capsys, redis_url, namespace, "export", RUN, "--output", str(target)
    )
    assert (code, out) == (0, "")
    lines = [json.loads(line) for line in target.read_text("utf-8").splitlines()]
    assert lines[-1]["kind"] == "end" and lines[-1]["invocations"] == len(CALLS)


async def test_export_carries_each_record_integrity_problems(
    store: Store, redis: Redis, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tampered record is exported as stored, with its problems listed beside it."""
    await populate(store)
    await redis.hset(store.keys.record(RUN, "call-none"), "evidence_status", "EVIDENCE_FOUND")
    code, lines = await export_lines(capsys, redis_url, namespace, RUN)
    assert code == 0
    record = next(line for line in lines if line.get("tool_call_id") == "call-none")
    assert record["fields"]["evidence_status"] == "EVIDENCE_FOUND"
    assert record["problems"] == ["tampered_field:evidence_status"]


async def test_export_of_an_unknown_run_exits_1(
    redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing to export is exit 1 with a line on stderr; the header still says what was asked."""
    code, out, err = await run_cli(capsys, redis_url, namespace, "export", "no-such-run")
    assert code == 1
    assert "no run or invocation found" in err
    assert json.loads(out.splitlines()[1]) == {
        "kind": "run",
        "run_id": "no-such-run",
        "present": False,
    }
