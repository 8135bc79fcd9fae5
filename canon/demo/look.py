"""The demo's last block: where it wrote, and the exact commands that show it.

An operator starts where the demo ends: the namespace, the server, and the commands
(``canon replay``, ``runs``, ``export``, ``status``, ``verify``) with the right
``--redis-url`` and ``--namespace``, ready to paste: a run's calls, the call whose tool
failed, and the run whose budget ran out with the calls it refused. A password in the URL
is never printed.

Each command works as printed, from any shell (the block says "in another terminal"): it
starts with ``canon`` only when every shell finds this ``canon`` on ``PATH`` (installed
system-wide, or by pipx); run from a virtualenv (``scripts/demo.sh``'s ``.venv``,
activated or not) it starts with this ``canon``'s path (:func:`canon_command`).
"""

from __future__ import annotations

import os
import pathlib
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from rich.console import Console

#: Stands for the URL of the server a later command starts (it logs the URL).
URL_PLACEHOLDER = "URL"


def canon_command() -> str:
    """How any shell runs this ``canon``, as the demo prints it.

    ``canon`` when ``PATH`` finds this process's own script outside an activated
    virtualenv's ``bin/`` (a shell without the activation would not find it); else that
    script's absolute path (a virtualenv's ``bin/canon``, next to this interpreter); else
    this interpreter running ``-m canon.cli``.
    """
    script = pathlib.Path(sys.argv[0]) if pathlib.Path(sys.argv[0]).name == "canon" else None
    if script is None or not script.is_file():
        script = pathlib.Path(sys.executable).parent / "canon"
    if not script.is_file():
        return f"{shlex.quote(sys.executable)} -m canon.cli"
    found = shutil.which("canon")
    activated = os.environ.get("VIRTUAL_ENV")
    if (
        found is not None
        and os.path.samefile(found, script)
        and not (activated and pathlib.Path(found).parent == pathlib.Path(activated) / "bin")
    ):
        return "canon"
    return shlex.quote(str(script.absolute()))


@dataclass
class Where:
    """Where the demo wrote: its namespace, its server, and the calls worth a look."""

    namespace: str
    redis_url: str | None = None
    embedded_url: str | None = None
    data_dir: pathlib.Path | None = None
    #: The embedded server still runs when the block is printed (and its URL answers).
    kept_running: bool = False
    run_id: str = ""
    failed_call: str | None = None
    #: The run whose budget ran out: its refusals are on record.
    budget_run: str | None = None
    #: The first run's refund, waiting for an operator's approval.
    waiting_call: str | None = None
    #: The demo operator's credential for the printed ``canon approve``: the operators
    #: file and the token file.
    operator_files: tuple[pathlib.Path, pathlib.Path] | None = None
    runs: list[str] = field(default_factory=list)
    #: How the printed commands run canon (:func:`canon_command`).
    canon: str = "canon"


def shown_url(url: str) -> str:
    """The URL as it may be printed: a password in it becomes ``PASSWORD``."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    user = parts.username or "default"
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{user}:PASSWORD@{host}"))


def _url_flag(where: Where) -> str:
    if where.redis_url:
        return f"--redis-url {shlex.quote(shown_url(where.redis_url))}"
    if where.embedded_url is None:
        return '--redis-url "$REDIS_URL"'
    return f"--redis-url {where.embedded_url if where.kept_running else URL_PLACEHOLDER}"


def look_commands(where: Where) -> list[tuple[str, str]]:
    """The commands that show what the demo wrote, each with what it shows."""
    target = f"{_url_flag(where)} --namespace {shlex.quote(where.namespace)}"
    run = shlex.quote(where.run_id)
    canon = where.canon
    commands = [(f"{canon} replay {run} {target}", "every call of a run: timeline and verdict")]
    if where.failed_call:
        commands.append(
            (
                f"{canon} replay {run} {shlex.quote(where.failed_call)} {target}",
                "the call whose tool failed (EXECUTION_FAILED)",
            )
        )
    if where.budget_run and where.budget_run != where.run_id:
        commands.append(
            (
                f"{canon} replay {shlex.quote(where.budget_run)} {target}",
                "the run whose budget ran out: its calls, then the calls it refused",
            )
        )
    if where.waiting_call:
        call = shlex.quote(where.waiting_call)
        credential = ""
        if where.operator_files is not None:
            operators, token = (shlex.quote(str(path)) for path in where.operator_files)
            credential = f" --operators-file {operators} --operator-token-file {token}"
        commands += [
            (f"{canon} approvals {target}", "the calls waiting for an operator's approval"),
            (
                f'{canon} approve {run} {call} --reason "checked the order"{credential} {target}',
                "approve the refund as the demo's operator: it runs once, when the harness "
                "resumes it",
            ),
        ]
    commands += [
        (f"{canon} runs {target}", "recent runs: status, calls by outcome, refusals, budget"),
        (f"{canon} export {run} {target}", "the run's records and events as JSON Lines"),
        (f"{canon} status {target}", "records, projections, dead letters, memory"),
        (f"{canon} verify {target}", "check every record against its journal"),
    ]
    return commands


def print_look(console: Console, where: Where) -> None:
    """Print the block that ends the demo: where it wrote and how to look at it."""
    console.rule("look at what the demo wrote")
    console.print(
        f"namespace {where.namespace} · runs {', '.join(where.runs) or '-'}", highlight=False
    )
    if where.embedded_url is not None and not where.kept_running:
        data_dir = shlex.quote(str(where.data_dir))
        console.print(
            f"The embedded Redis stopped with the demo; its data stays in {where.data_dir}. "
            "Start a server on that data (its embedded_redis_started log line gives the URL):",
            highlight=False,
        )
        console.print(
            f"  {where.canon} serve --data-dir {data_dir}",
            soft_wrap=True,
            highlight=False,
            markup=False,
        )
        console.print(
            f"then, in another terminal, with {URL_PLACEHOLDER} replaced by that URL:",
            highlight=False,
        )
    elif where.redis_url is None and os.environ.get("REDIS_URL"):
        console.print("The server is the one of $REDIS_URL:", highlight=False)
    for command, what in look_commands(where):
        console.print(f"  # {what}", style="dim", highlight=False)
        console.print(f"  {command}", soft_wrap=True, highlight=False, markup=False)
    console.print(
        "Exit codes: 0 ok, 1 problems found, 2 usage, 3 Redis unavailable (docs/operators.md).",
        highlight=False,
    )
