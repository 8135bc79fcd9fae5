"""Scripted model endpoints for the SDK adapters' tests, and the tools their turns call.

:class:`ModelScript` answers each request with the next recorded response body and keeps
every request, so a test asserts exactly what the SDK sent on the next turn. It serves
as a ``MockTransport`` of the HTTP package the SDK's own client is built on (``httpx2``
for anthropic and google-genai, which refuse ``httpx`` objects) or, for the docs' loops
that build their client from the environment, as a local HTTP server on 127.0.0.1
(:func:`serve`). No request ever leaves the process or the loopback interface.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import ModuleType
from typing import Any

import httpx2

from eventstore import Projection, ToolCall, ToolSpec


class ModelScript:
    """Recorded responses, answered in order; every request kept as (path, JSON body)."""

    def __init__(self, *responses: Any) -> None:
        self._responses = list(responses)
        self._lock = threading.Lock()
        self.requests: list[tuple[str, Any]] = []

    def answer(self, path: str, body: bytes) -> tuple[int, Any]:
        """Record one request and return (status, JSON body) of the next response."""
        with self._lock:
            self.requests.append((path, json.loads(body) if body else None))
            if not self._responses:
                return 599, {"error": {"type": "script_exhausted", "message": "no more turns"}}
            return 200, self._responses.pop(0)

    def transport(self, http: ModuleType = httpx2) -> Any:
        """A ``MockTransport`` of ``http`` (``httpx2`` or ``httpx``), for sync and async clients."""

        def handle(request: Any) -> Any:
            status, body = self.answer(request.url.path, request.read())
            return http.Response(status, json=body)

        return http.MockTransport(handle)

    @property
    def bodies(self) -> list[Any]:
        """The JSON bodies of the requests, in order."""
        return [body for _, body in self.requests]


class _Handler(BaseHTTPRequestHandler):
    script: ModelScript

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        status, body = self.script.answer(self.path, self.rfile.read(length))
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the suite's output carries no request lines."""


@contextmanager
def serve(script: ModelScript) -> Iterator[str]:
    """Serve ``script`` over HTTP on 127.0.0.1; yield its base URL; stop and join after."""
    handler = type("ScriptHandler", (_Handler,), {"script": script})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="model-script", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class KbTools:
    """The tools a recorded turn calls: ``search`` (counted), ``fail`` (raises), ``admin``
    (not authorized).

    ``parties`` search calls must be running at once before any of them returns (a
    barrier), so a turn whose calls ran one after another fails instead of passing.
    """

    def __init__(self, parties: int = 1) -> None:
        self._barrier = threading.Barrier(parties, timeout=10)
        self._lock = threading.Lock()
        #: The arguments of every executed search, in the order they ran.
        self.searched: list[Any] = []

    def search(self, arguments: Any, call: ToolCall) -> Any:
        """Wait for the turn's other searches, then answer with the query."""
        with self._lock:
            self.searched.append(arguments)
        self._barrier.wait()
        return {"hits": [{"title": f"About {arguments.get('q', 'everything')}", "body": "x"}]}

    @staticmethod
    def fail(arguments: Any, call: ToolCall) -> Any:
        """A tool that breaks; its text must never reach the model."""
        raise RuntimeError("db password=hunter2 rejected")

    @staticmethod
    def project(raw: Any, call: ToolCall) -> Projection:
        """Titles only: the body stays in the record."""
        titles = [hit["title"] for hit in raw["hits"]]
        return Projection(result={"titles": titles}, evidence_status="EVIDENCE_FOUND", scope="kb")

    def specs(self) -> dict[str, ToolSpec]:
        """The three tools by name."""
        return {
            "search": ToolSpec(executor=self.search, projector=self.project),
            "fail": ToolSpec(executor=self.fail, projector=self.project),
            "admin": ToolSpec(executor=self.search, projector=self.project, authorized=False),
        }
