"""The demo's last block names the exact commands, with the right server and namespace."""

from __future__ import annotations

import io
import pathlib
import sys

import pytest
from rich.console import Console

from canon.demo.look import Where, canon_command, look_commands, print_look, shown_url


def render(where: Where) -> str:
    """The block as printed on an 80-column console."""
    buffer = io.StringIO()
    print_look(Console(file=buffer, width=80, color_system=None), where)
    return buffer.getvalue()


def test_a_password_in_the_url_is_never_printed() -> None:
    """The user's URL is shown with PASSWORD in place of the password."""
    where = Where(namespace="demo", redis_url="redis://ops:s3cret@db.example:6380/0")
    where.run_id, where.failed_call, where.runs = "run-1", "call_041", ["run-1"]
    text = render(where)
    assert "s3cret" not in text
    assert "canon replay run-1 call_041 --redis-url redis://ops:PASSWORD@db.example:6380/0" in text
    assert shown_url("redis://db.example:6380/0") == "redis://db.example:6380/0"


def test_a_stopped_embedded_server_is_replaced_by_a_served_one(tmp_path: pathlib.Path) -> None:
    """After an embedded run the block says how to serve the kept data and uses URL for it;
    a server that still runs is named by its own URL."""
    where = Where(namespace="demo", embedded_url="redis://127.0.0.1:4000/0", data_dir=tmp_path)
    where.run_id, where.runs = "run-1", ["run-1"]
    text = render(where)
    assert f"canon serve --data-dir {tmp_path}" in text
    assert "canon status --redis-url URL --namespace demo" in text
    assert "redis://127.0.0.1:4000/0" not in text.split("look at what")[1]
    where.kept_running = True
    assert all("127.0.0.1:4000" in command for command, _ in look_commands(where))


def test_a_url_from_the_environment_is_named_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    """With REDIS_URL set the commands say "$REDIS_URL", not its value."""
    monkeypatch.setenv("REDIS_URL", "redis://u:pw@10.0.0.1:6379/0")
    where = Where(namespace="demo", run_id="run-1", runs=["run-1"])
    text = render(where)
    assert '--redis-url "$REDIS_URL"' in text and "10.0.0.1" not in text and "pw@" not in text


def test_the_run_whose_budget_ran_out_gets_its_own_replay() -> None:
    """The block names the replay of the run whose budget ran out, after the first run's
    two, with the same server and namespace, and says it lists that run's refusals."""
    where = Where(namespace="demo", redis_url="redis://127.0.0.1:6379/0")
    where.run_id, where.failed_call = "support-1-0", "call_041"
    where.budget_run, where.runs = "billing-1-2", ["support-1-0", "billing-1-2"]
    commands = look_commands(where)
    assert [command.split()[:3] for command, _ in commands[:3]] == [
        ["canon", "replay", "support-1-0"],
        ["canon", "replay", "support-1-0"],
        ["canon", "replay", "billing-1-2"],
    ]
    command, what = commands[2]
    assert command.endswith("--redis-url redis://127.0.0.1:6379/0 --namespace demo")
    assert "refused" in what


@pytest.fixture
def venv_canon(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """This process runs as a virtualenv's ``bin/canon`` (its argv[0])."""
    script = tmp_path / "venv" / "bin" / "canon"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "argv", [str(script), "demo"])
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    return script


def test_a_canon_no_shell_finds_is_printed_by_its_path(
    venv_canon: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run as scripts/demo.sh runs it (.venv/bin/canon, not on PATH), every command starts
    with that canon's path, so it works as printed in any shell."""
    monkeypatch.setenv("PATH", str(venv_canon.parent.parent))  # no canon there
    assert canon_command() == str(venv_canon)
    where = Where(namespace="demo", redis_url="redis://127.0.0.1:6379/0", canon=canon_command())
    where.run_id, where.runs = "run-1", ["run-1"]
    assert all(command.startswith(f"{venv_canon} ") for command, _ in look_commands(where))


def test_an_activated_virtualenv_still_prints_the_path(
    venv_canon: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a shell that activated the virtualenv, canon is on PATH there only: "in another
    terminal" it would not be, so the path is printed all the same."""
    monkeypatch.setenv("PATH", str(venv_canon.parent))
    monkeypatch.setenv("VIRTUAL_ENV", str(venv_canon.parent.parent))
    assert canon_command() == str(venv_canon)


def test_a_canon_every_shell_finds_is_printed_as_canon(
    venv_canon: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Installed where every shell's PATH finds it (system-wide, pipx), plain canon."""
    monkeypatch.setenv("PATH", str(venv_canon.parent))
    assert canon_command() == "canon"
