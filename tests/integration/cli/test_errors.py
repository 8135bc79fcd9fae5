"""Every subcommand, given a bad input, prints one line on standard error and the exit
code that says what kind of failure it was (0 ok, 1 problems, 2 usage, 3 Redis
unavailable): never a traceback. ``canon`` runs as a real process, as an operator runs it.
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from canon.exitcodes import RET_UNAVAILABLE, RET_USAGE

#: Nothing listens here: connections are refused at once.
REFUSED = "redis://ops:s3cret-pw@127.0.0.1:1/0"
#: A name that never resolves (RFC 6761).
UNRESOLVED = "redis://redis.invalid:6379/0"
INVOCATION = "0" * 64

# (argv, exit code, a fragment the line must contain); IN_USE is replaced by a bound port.
CASES: list[tuple[list[str], int, str]] = [
    ([], RET_USAGE, "required"),
    (["no-such-command"], RET_USAGE, "invalid choice"),
    (["demo", "--redis-url", "foo://x"], RET_USAGE, "redis://, rediss:// or unix://"),
    (["demo", "--data-dir", "/proc/nope"], RET_USAGE, "--data-dir /proc/nope"),
    (["demo", "--shards", "0"], RET_USAGE, "--shards: must be a whole number of at least 1"),
    (["demo", "--ttl-s", "0"], RET_USAGE, "--ttl-s: must be a whole number of at least 1"),
    (["demo", "--runs", "1"], RET_USAGE, "--runs: must be a whole number of at least 2"),
    (["demo", "--redis-url", REFUSED], RET_UNAVAILABLE, "connection was refused"),
    (["serve", "--port", "99999"], RET_USAGE, "--port: must be a port number"),
    (["serve", "--port", "IN_USE", "--redis-url", REFUSED], RET_USAGE, "is in use"),
    (["serve", "--log-level", "LOUD"], RET_USAGE, "--log-level: must be one of"),
    (["serve", "--port", "0", "--redis-url", REFUSED], RET_UNAVAILABLE, "connection was refused"),
    (["workers", "--log-level", "LOUD"], RET_USAGE, "--log-level: must be one of"),
    (["workers", "--batch", "0"], RET_USAGE, "--batch: must be a whole number"),
    (["workers", "--metrics-port", "-1"], RET_USAGE, "--metrics-port: must be a port number"),
    (["workers", "--redis-url", UNRESOLVED], RET_UNAVAILABLE, "host name does not resolve"),
    (["replay", "run-1", "--redis-url", REFUSED], RET_UNAVAILABLE, "connection was refused"),
    (["replay", "run:1", "--redis-url", REFUSED], RET_USAGE, "safe id"),
    (["replay", "run-1", "--ttl-s", "5"], RET_USAGE, "unrecognized arguments: --ttl-s"),
    (["verify", "--cursor", "abc"], RET_USAGE, "--cursor: must be a SCAN cursor"),
    (["verify", "--cursor", str(2**64)], RET_USAGE, "--cursor: must be a SCAN cursor"),
    (["verify", "--redis-url", REFUSED], RET_UNAVAILABLE, "connection was refused"),
    (["export", "run-1", "--redis-url", UNRESOLVED], RET_UNAVAILABLE, "does not resolve"),
    (["export", "run:1"], RET_USAGE, "safe id"),
    (["inspect", "nope", "--run-id", "run-1"], RET_USAGE, "64 lowercase hex"),
    (["inspect", INVOCATION, "--run-id", "run-1"], RET_USAGE, "no Redis configured"),
    (["status", "--redis-url", REFUSED], RET_UNAVAILABLE, "connection was refused"),
    (["runs", "--cursor", "abc"], RET_USAGE, "--cursor: the cursor is not one"),
    (["runs", "--limit", "0"], RET_USAGE, "--limit: must be a whole number from 1 to 500"),
    (["runs", "--redis-url", REFUSED], RET_UNAVAILABLE, "connection was refused"),
    (["serve", "--operator-token-file", "/nope/token"], RET_USAGE, "cannot read /nope/token"),
    (["status", "--redis-url", "redis://127.0.0.1:99999"], RET_USAGE, "port"),
    (["rebuild", "nonsense"], RET_USAGE, "invalid choice"),
    (["rebuild", "receipts", "--redis-url", REFUSED], RET_UNAVAILABLE, "refused"),
    (["bench", "--no-such-flag"], RET_USAGE, "unrecognized arguments"),
    (["bench", "--quick", "--redis-url", "foo://x"], RET_USAGE, "redis://, rediss://"),
    (["bench", "--quick", "--redis-url", REFUSED], RET_UNAVAILABLE, "connection was refused"),
    (["runs", "--redis-url", REFUSED], RET_UNAVAILABLE, "--redis-url (127.0.0.1:1) is unavail"),
    (["status", "--redis-url", "unix:///nope/redis.sock"], RET_UNAVAILABLE, "/nope/redis.sock"),
    (["mcp-proxy", "--deadline-s", "-5", "--", "true"], RET_USAGE, "--deadline-s: must be"),
]


@pytest.fixture(scope="module")
def port_in_use() -> Iterator[int]:
    """A loopback port held by a listening socket for the module's tests."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield int(listener.getsockname()[1])


def canon(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m canon.cli`` with ``argv`` and no REDIS_URL from the environment."""
    base = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "REDIS_PASSWORD")}
    return subprocess.run(
        [sys.executable, "-m", "canon.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, **(env or {})},
        check=False,
    )


@pytest.mark.parametrize(("argv", "code", "fragment"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_a_bad_input_is_one_line_and_its_exit_code(
    argv: list[str], code: int, fragment: str, port_in_use: int
) -> None:
    """One ``canon: error:`` line naming the problem, nothing on stdout, no traceback, and
    the exit code of its kind; a password in the URL is never repeated."""
    argv = [str(port_in_use) if arg == "IN_USE" else arg for arg in argv]
    result = canon(argv)
    lines = result.stderr.splitlines()
    assert (result.returncode, result.stdout) == (code, ""), result.stderr
    assert len(lines) == 1 and lines[0].startswith("canon: error: "), result.stderr
    assert fragment in lines[0]
    assert "Traceback" not in result.stderr and "s3cret-pw" not in result.stderr


def test_a_metrics_port_in_use_is_one_line(
    redis_url: str, namespace: str, port_in_use: int
) -> None:
    """``canon workers --metrics-port`` on a taken port says so and exits 2."""
    target = [f"--redis-url={redis_url}", f"--namespace={namespace}"]
    result = canon(["workers", *target, f"--metrics-port={port_in_use}", "--log-level=ERROR"])
    lines = result.stderr.splitlines()
    assert result.returncode == RET_USAGE, result.stderr
    assert len(lines) == 1 and "--metrics-port" in lines[0] and "is in use" in lines[0]


def test_a_redis_url_from_the_environment_is_named_as_such() -> None:
    """The line says where the URL came from (REDIS_URL) and its host and port, never the
    URL itself, its user or its password."""
    result = canon(["status"], env={"REDIS_URL": REFUSED})
    assert result.returncode == RET_UNAVAILABLE
    assert result.stderr.startswith(
        "canon: error: the Redis server of REDIS_URL (127.0.0.1:1) is unavailable: "
        "the connection was refused"
    )
    assert "ops" not in result.stderr and "s3cret-pw" not in result.stderr


def test_a_database_the_server_does_not_have_is_usage_not_an_outage(redis_url: str) -> None:
    """``--redis-url redis://host:port/99`` on a server of 16 databases: one line naming
    database 99 and what to use instead, exit 2 (the server is up: the URL is wrong)."""
    url = urlsplit(redis_url)._replace(path="/99").geturl()
    result = canon(["runs", "--redis-url", url])
    lines = result.stderr.splitlines()
    assert (result.returncode, result.stdout) == (RET_USAGE, ""), result.stderr
    assert len(lines) == 1 and "has no database 99" in lines[0], result.stderr
    assert "redis://HOST:PORT/0" in lines[0]


@pytest.mark.parametrize("how", ["flag", "url", "environment"])
def test_cluster_against_a_plain_redis_is_one_line(redis_url: str, how: str) -> None:
    """``--cluster`` (or ``?cluster=1``, or ``REDIS_CLUSTER=1``) on a server without cluster
    support: one line saying so and to leave it out, exit 2, no traceback."""
    argv, env = ["runs", "--redis-url", redis_url], {}
    if how == "flag":
        argv.append("--cluster")
    elif how == "url":
        argv[-1] = f"{redis_url}?cluster=1"
    else:
        env = {"REDIS_CLUSTER": "1"}
    result = canon(argv, env)
    lines = result.stderr.splitlines()
    assert (result.returncode, result.stdout) == (RET_USAGE, ""), result.stderr
    assert len(lines) == 1 and "is not in cluster mode" in lines[0], result.stderr
    assert "leave out --cluster" in lines[0]


def test_a_data_dir_a_newer_redis_wrote_is_one_line(tmp_path: pathlib.Path) -> None:
    """``canon serve --data-dir`` on data a newer Redis wrote than any found: one line
    naming both versions and what to do, exit 2, and no server started on it."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "redis-version").write_text("99.0.0\n")
    result = canon(["serve", "--data-dir", str(data), "--port", "0"])
    # serve logs at info (which binary it chose, as JSON lines) before the error
    lines = [line for line in result.stderr.splitlines() if not line.startswith("{")]
    assert (result.returncode, result.stdout) == (RET_USAGE, ""), result.stderr
    assert len(lines) == 1 and lines[0].startswith("canon: error: "), result.stderr
    assert "Traceback" not in result.stderr
    assert f"--data-dir {data} was written by Redis 99.0.0 and the newest" in lines[0]
    assert "install Redis 99.0 or later" in lines[0] and "another --data-dir" in lines[0]
    # Nothing a server writes: only the version file and the folder's lock.
    assert sorted(path.name for path in data.iterdir()) in (
        ["redis-version"],
        ["canon.lock", "redis-version"],
    )


def test_version_comes_from_the_installed_package() -> None:
    """``canon --version`` prints the installed distribution's version and exits 0."""
    from importlib.metadata import version

    result = canon(["--version"])
    assert (result.returncode, result.stdout.strip()) == (0, f"canon {version('canon-store')}")
