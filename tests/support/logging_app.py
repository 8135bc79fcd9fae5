"""An application that embeds canon, run as its own process by the logging tests.

``python -m tests.support.logging_app MODE URL NAMESPACE`` sets logging up as MODE says,
opens a store on URL three times (three short-lived stores, as a harness might), makes
one tool call through the boundary and prints one JSON line on standard output:
``{"status": ..., "records": [...]}``.

MODE is ``none`` (logging left as Python starts it), ``stdlib`` (a root handler at DEBUG
that keeps every record; ``records`` lists each one's logger name, level, message, source
file and canon's fields) or ``structlog`` (structlog configured by the application: JSON
lines on standard error).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from datetime import timedelta
from typing import Any

import msgspec
import structlog

from eventstore import Projection, RunContext, Store, ToolBoundary, ToolEnvelope, ToolSpec

#: Fields of a record that canon's events set (see eventstore/logs.py).
FIELDS = ("event", "run_id", "tool_call_id", "status", "version", "risks", "error_code")


class KeepRecords(logging.Handler):
    """A handler that keeps every record it is given."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def describe(record: logging.LogRecord) -> dict[str, Any]:
    """What the parent checks of one record."""
    fields = {name: getattr(record, name) for name in FIELDS if hasattr(record, name)}
    return {
        "logger": record.name,
        "level": record.levelname,
        "message": record.getMessage(),
        "file": record.filename,
        "fields": fields,
    }


def search(arguments: Any, call: Any) -> dict[str, Any]:
    """The executor: a raw response."""
    return {"hits": ["Refund policy"]}


def project(raw: Any, call: Any) -> Projection:
    """The projector: the bounded result."""
    return Projection(result=raw["hits"], evidence_status="EVIDENCE_FOUND", scope="kb")


async def run(url: str, namespace: str) -> str:
    """Open the store three times, then make one call; return the reply's status."""
    for _ in range(2):
        async with Store.from_url(url, namespace=namespace):
            pass
    async with Store.from_url(url, namespace=namespace) as store:
        await store.open_run("run-1", deadline=timedelta(minutes=1))
        boundary = ToolBoundary(store, {"search": ToolSpec(executor=search, projector=project)})
        envelope = ToolEnvelope(run_id="run-1", tool_call_id="call-1", tool="search", arguments={})
        reply = await boundary.invoke(RunContext("run-1"), envelope)
    return type(reply).__name__


def main(argv: list[str]) -> int:
    """Entry point; see the module docstring."""
    mode, url, namespace = argv
    keeper = KeepRecords()
    if mode == "stdlib":
        logging.basicConfig(level=logging.DEBUG, handlers=[keeper])
    elif mode == "structlog":
        structlog.configure(
            processors=[structlog.processors.add_log_level, structlog.processors.JSONRenderer()],
            logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        )
    status = asyncio.run(run(url, namespace))
    records = [describe(record) for record in keeper.records]
    print(msgspec.json.encode({"status": status, "records": records}).decode(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
