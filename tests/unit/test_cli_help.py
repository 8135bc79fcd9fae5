"""``canon --help`` and every subcommand's help are complete; bad arguments are one line."""

from __future__ import annotations

import re

import pytest

from canon.cli import COMMANDS, main


def test_top_level_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    """``canon --help`` exits 0 and names each subcommand with its one-line help."""
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert f"    {name} " in out or f"    {name}\n" in out, name


@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_has_a_description_and_documented_options(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each ``canon COMMAND --help`` exits 0 with a description and help for every option."""
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: canon {command}")
    description = out.split("\n\n")[1]
    assert len(description.split()) >= 5, "the description says what the command does"
    options = out.split("options:", 1)[1]
    for line in options.splitlines():
        stripped = line.strip()
        if stripped.startswith("-") and "  " not in stripped:
            # An option whose help is on the next line is fine; an option alone is not.
            following = options.splitlines()[options.splitlines().index(line) + 1]
            assert following.startswith(" " * 10), f"{command}: {stripped} has no help"


@pytest.mark.parametrize(
    "argv",
    [
        ["no-such-command"],
        ["replay"],
        ["rebuild", "nonsense"],
        ["verify", "--batch", "0"],
        ["rebuild", "receipts", "--grace-s", "-1"],
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Usage errors print one ``canon: error:`` line (after the usage) and exit 2."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("canon: error:")]
    assert len(errors) == 1 and "Traceback" not in err


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_is_plain_text_without_sphinx_markup(
    command: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Descriptions come from docstrings; no ``literal`` or :role: markup reaches the help."""
    assert main(["--help"] if command is None else [command, "--help"]) == 0
    out = capsys.readouterr().out
    for markup in ("``", ":mod:", ":class:", ":func:", ":meth:", ":data:"):
        assert markup not in out, (command, markup)


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_names_no_internal_module(
    command: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user reads what a command does, not where its code lives: no dotted module path."""
    assert main(["--help"] if command is None else [command, "--help"]) == 0
    out = capsys.readouterr().out
    assert re.findall(r"\b(?:canon|eventstore|projections|machine)\.[a-z_]+\.?[a-z_]*", out) == []


def test_serve_help_lists_every_route(capsys: pytest.CaptureFixture[str]) -> None:
    """Each route the HTTP API and the console serve is named in ``canon serve --help``."""
    from projections.console import CONSOLE_ROUTES
    from projections.http_api import ROUTES

    assert main(["serve", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere
    for route in (*ROUTES, *CONSOLE_ROUTES):
        assert route in out, route


@pytest.mark.parametrize(
    "command", ["replay", "verify", "export", "inspect", "status", "rebuild", "runs"]
)
def test_commands_that_create_no_record_take_no_ttl(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record TTL means nothing to a command that never creates a record."""
    assert main([command, "--help"]) == 0
    assert "--ttl-s" not in capsys.readouterr().out


@pytest.mark.parametrize("command", ["demo", "workers", "serve"])
def test_commands_that_write_take_a_ttl(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The commands that create records, or trim feeds by the record TTL, keep ``--ttl-s``."""
    assert main([command, "--help"]) == 0
    assert "--ttl-s" in capsys.readouterr().out


def test_top_level_help_gives_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    """``canon --help`` ends with the exit-code table in one line."""
    assert main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "0 ok, 1 problems found, 2 usage, 3 Redis unavailable" in out
