"""``canon replay``, ``export`` and ``inspect`` show a failed call's failure detail to operators."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from eventstore import RunContext, Store, ToolBoundary
from machine.ids import invocation_id
from tests.integration.audit.test_replay import RUN, run_cli, store
from tests.integration.boundary.test_failure_detail import MARKER, BackendDown
from tests.integration.receipts.test_inspect_cli import canon
from tests.support.calls import TOOL, envelope
from tests.support.tools import FakeTool

__all__ = ["store"]  # the fixture, re-used from the replay tests


async def failed_call(store: Store) -> str:
    """Open the run and fail one call in its executor; return its tool call id."""
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    tool = FakeTool(raise_in_executor=BackendDown(f"no index {MARKER}"))
    await ToolBoundary(store, {TOOL: tool.spec()}).invoke(
        RunContext(RUN), envelope("c1", run_id=RUN)
    )
    return "c1"


async def test_replay_shows_the_detail_under_the_timeline(
    store: Store, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The human replay has a harness-only section with type, message and traceback."""
    call = await failed_call(store)
    code, out, _ = await run_cli(capsys, redis_url, namespace, "replay", RUN, call)
    assert code == 0, out
    section = out[out.index("failure detail (harness-only") :]
    assert f"{BackendDown.__module__}.BackendDown" in section
    assert f"message  no index {MARKER}" in section
    assert "Traceback (most recent call last):" in section and "INTACT" in section
    assert "failure_detail" in out  # the Failed step names its payload field


async def test_replay_json_carries_the_decoded_detail(
    store: Store, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--json`` holds the detail object and its stored size beside the verdict."""
    call = await failed_call(store)
    code, out, _ = await run_cli(capsys, redis_url, namespace, "replay", RUN, call, "--json")
    (replay,) = json.loads(out)["invocations"]
    assert code == 0 and replay["verdict"]["intact"] is True
    assert replay["failure_detail"]["message"] == f"no index {MARKER}"
    assert replay["failure_detail"]["cut_bytes"] == 0
    assert replay["failure_detail_bytes"] > 0


async def test_export_gives_the_size_and_with_payloads_the_detail(
    store: Store, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --with-payloads only its size; with it, the stored JSON as UTF-8 text."""
    call = await failed_call(store)
    code, out, _ = await run_cli(capsys, redis_url, namespace, "export", RUN)
    (record,) = [json.loads(line) for line in out.splitlines() if '"kind":"record"' in line]
    assert code == 0 and MARKER not in out
    size = record["stored_payload_bytes"]["failure_detail"]
    assert size > 0 and "payloads" not in record
    assert len(record["fields"]["failure_detail_sha256"]) == 64

    code, out, _ = await run_cli(capsys, redis_url, namespace, "export", RUN, "--with-payloads")
    (record,) = [json.loads(line) for line in out.splitlines() if '"kind":"record"' in line]
    payload = record["payloads"]["failure_detail"]
    assert code == 0 and payload["encoding"] == "utf-8" and len(payload["text"].encode()) == size
    assert json.loads(payload["text"])["message"] == f"no index {MARKER}"
    assert record["tool_call_id"] == call


async def test_inspect_shows_the_detail_to_an_operator_only_when_asked(
    store: Store, redis_url: str, namespace: str
) -> None:
    """With ``--run-id`` and ``--with-failure-detail``: the receipt and the labelled detail.

    Never for a run token: that is a usage error.
    """
    await failed_call(store)
    connection = (f"--redis-url={redis_url}", f"--namespace={namespace}")
    inv = invocation_id(RUN, "c1")
    plain = await canon("inspect", inv, f"--run-id={RUN}", *connection)
    shown = await canon("inspect", inv, f"--run-id={RUN}", "--with-failure-detail", *connection)
    by_token = await canon(
        "inspect", inv, "--run-token=cr1:x", "--with-failure-detail", *connection
    )

    assert plain[0] == 0 and MARKER not in plain[1]
    assert json.loads(plain[1])["invocation_id"] == inv
    code, out, err = shown
    document: dict[str, Any] = json.loads(out)
    assert (code, err) == (0, "")
    assert document["receipt"] == json.loads(plain[1]) | {
        "observed_at": document["receipt"]["observed_at"]
    }
    detail = document["harness_only"]["failure_detail"]
    assert detail["message"] == f"no index {MARKER}" and detail["traceback"]
    assert document["harness_only"]["failure_detail_bytes"] > 0
    assert MARKER not in json.dumps(document["receipt"])
    assert by_token[0] == 2 and "--run-id" in by_token[2] and by_token[1] == ""
