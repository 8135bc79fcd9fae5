"""``canon keys``: a keyring file made and rotated without ever printing a key, new runs
under the new key while old runs keep reading, ``rewrap`` moving old runs to the current
key without touching a payload, and a bad CANON_KEYS refused in one clear line."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path
from typing import Any

import pytest

from canon.cli import main
from eventstore import RunContext, Store, ToolBoundary
from eventstore.keyring import Keyring, UnknownKey
from eventstore.sealing import DATA_KEY_FIELD
from tests.integration.encryption.test_encryption import Marked
from tests.support.calls import envelope, open_run

pytestmark = pytest.mark.backends("single", "cluster")


async def run_cli(
    capsys: pytest.CaptureFixture[str], *argv: str, redis: tuple[str, str] | None = None
) -> tuple[int, str, str]:
    """Run ``canon`` in-process (in a thread: it runs its own loop); exit, out, err."""
    capsys.readouterr()
    extra = ["--redis-url", redis[0], "--namespace", redis[1]] if redis else []
    code = await asyncio.to_thread(main, [*argv, *extra])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.not_on_cluster("writes only a local file")
async def test_keys_new_writes_an_owner_only_file_and_never_prints_a_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new file is 0600; a second ``new`` refuses to overwrite it; ``--add`` rotates."""
    path = tmp_path / "keys.json"
    code, out, err = await run_cli(capsys, "keys", "new", "--file", str(path))
    assert code == 0, err
    document = json.loads(path.read_text())
    assert document["current"] == "k1"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert document["keys"]["k1"] not in out + err
    code, _, err = await run_cli(capsys, "keys", "new", "--file", str(path))
    assert code == 2 and "exists" in err
    code, out, err = await run_cli(
        capsys, "keys", "new", "--file", str(path), "--add", "--id", "k2"
    )
    assert code == 0, err
    rotated = json.loads(path.read_text())
    assert rotated["current"] == "k2" and rotated["keys"]["k1"] == document["keys"]["k1"]
    assert rotated["keys"]["k2"] not in out + err


async def test_rotation_then_rewrap_moves_old_runs_to_the_current_key(
    make_store: Any,
    redis: Any,
    redis_url: str,
    namespace: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Runs written under k1 read on after k2 becomes current; new runs use k2; rewrap
    puts the old runs under k2, so a keyring of k2 alone reads everything."""
    path = tmp_path / "keys.json"
    assert (await run_cli(capsys, "keys", "new", "--file", str(path)))[0] == 0
    old: Store = make_store(keys=Keyring.from_file(path))
    await open_run(old, "run-old")
    old_ctx = RunContext("run-old")
    await ToolBoundary(old, Marked().spec()).invoke(old_ctx, envelope("c1", run_id="run-old"))
    assert (await run_cli(capsys, "keys", "new", "--file", str(path), "--add", "--id", "k2"))[
        0
    ] == 0
    new: Store = make_store(keys=Keyring.from_file(path))
    await open_run(new, "run-new")
    new_ctx = RunContext("run-new")
    await ToolBoundary(new, Marked().spec()).invoke(new_ctx, envelope("c1", run_id="run-new"))
    wrapped = {
        run: await redis.hget(new.keys.run(run), DATA_KEY_FIELD) for run in ("run-old", "run-new")
    }
    assert wrapped["run-old"].startswith(b"k1:") and wrapped["run-new"].startswith(b"k2:")
    assert await new.get("run-old", "c1") is not None
    sealed = await redis.hget(new.keys.record("run-old", "c1"), "request")

    monkeypatch.setenv("CANON_KEYS", str(path))
    code, out, err = await run_cli(capsys, "keys", "rewrap", redis=(redis_url, namespace))
    assert code == 0, err
    assert "1 run data key(s) re-wrapped with key k2; 1 already were" in out
    assert (await redis.hget(new.keys.run("run-old"), DATA_KEY_FIELD)).startswith(b"k2:")
    assert await redis.hget(new.keys.record("run-old", "c1"), "request") == sealed
    k2_only = json.loads(path.read_text())
    del k2_only["keys"]["k1"]
    only_new: Store = make_store(keys=Keyring.from_json(json.dumps(k2_only)))
    for run in ("run-old", "run-new"):
        record = await only_new.get(run, "c1")
        assert record is not None and record.request == b'{"q":1}'
    k1_only = json.loads(path.read_text())
    k1_only["current"] = "k1"
    del k1_only["keys"]["k2"]
    with pytest.raises(UnknownKey, match="k2"):
        await make_store(keys=Keyring.from_json(json.dumps(k1_only))).get("run-old", "c1")


async def test_a_bad_canon_keys_is_one_clear_line(
    redis_url: str,
    namespace: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A command given a keyring that is not one exits 2 with one line, no traceback."""
    path = tmp_path / "keys.json"
    path.write_text('{"current": "k1", "keys": {"k1": "c2hvcnQ="}}')
    monkeypatch.setenv("CANON_KEYS", str(path))
    code, out, err = await run_cli(capsys, "replay", "run-a", redis=(redis_url, namespace))
    assert code == 2 and out == ""
    assert err.strip().splitlines() == ["canon: error: key k1 is not 32 bytes (AES-256)"]
