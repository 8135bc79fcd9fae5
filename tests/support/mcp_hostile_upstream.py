"""A hostile MCP upstream on stdio, for the proxy's fault tests: raw JSON-RPC lines.

``python tests/support/mcp_hostile_upstream.py LIST_MODE RAN_FILE`` serves the tools
``echo``, ``read`` (``readOnlyHint: true``), ``destroy`` (``destructiveHint: true``),
``big`` (answers ``size`` bytes of text), ``hang`` (never answers), ``gate`` (answers
once RAN_FILE.open exists), ``oops`` (an
``isError`` result with the upstream's own text) and ``ask`` (an InputRequiredResult until
its ``inputResponses`` arrive) and ``job`` (a task of the tasks extension: ``tasks/get``
then gives its result). Each ``tools/call`` it runs is appended to RAN_FILE as
``<name> <arguments JSON>``, so a test sees what reached it. ``tools/list`` answers by
LIST_MODE: ``ok``; ``fail`` (always -32603); ``fail-first`` (-32603 once, then ok);
``needs-meta`` (-32602 without the 2026-07-28 ``_meta`` protocol version, as a modern
server refuses an unenveloped request); ``hides-destroy`` (never lists ``destroy``).
Each child appends its pid to RAN_FILE.pids when it starts, and to RAN_FILE.served when
its first request arrives: a spare started ahead and never used is on the first only.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable

PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"


def tools(mode: str) -> list[dict]:
    listed = [
        {"name": "echo", "inputSchema": {"type": "object"}},
        {"name": "read", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}},
        {
            "name": "destroy",
            "inputSchema": {"type": "object"},
            "annotations": {"destructiveHint": True},
        },
        {"name": "big", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}},
        {"name": "hang", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}},
        {"name": "gate", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}},
        {"name": "oops", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}},
        {"name": "ask", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}},
        {"name": "job", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}},
    ]
    return [tool for tool in listed if not (mode == "hides-destroy" and tool["name"] == "destroy")]


def open_gate(ran_file: str, request_id: object, send: Callable[[dict], None]) -> None:
    """Answer a ``gate`` call once its gate file exists (the test opens it)."""
    while not os.path.exists(ran_file + ".open"):
        time.sleep(0.01)  # polling a file the test creates; the test itself waits on conditions
    send(
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "result": {"content": [{"type": "text", "text": "opened"}]},
        }
    )


def main() -> None:
    mode, ran_file = sys.argv[1], sys.argv[2]
    with open(ran_file + ".pids", "a") as pids:
        pids.write(f"{os.getpid()}\n")
    out = sys.stdout.buffer
    lists = 0

    lock = threading.Lock()
    served = False

    def send(message: dict) -> None:
        with lock:
            out.write(json.dumps(message).encode() + b"\n")
            out.flush()

    for line in sys.stdin.buffer:
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if method is None or "id" not in message:
            continue
        if not served:
            served = True
            with open(ran_file + ".served", "a") as serving:
                serving.write(f"{os.getpid()}\n")
        params = message.get("params") or {}
        modern = PROTOCOL_VERSION_KEY in (params.get("_meta") or {})
        if method == "initialize":
            result = {
                "protocolVersion": params.get("protocolVersion"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile", "version": "1"},
            }
            send({"jsonrpc": "2.0", "id": request_id, "result": result})
        elif method == "tools/list":
            lists += 1
            failing = mode == "fail" or (mode == "fail-first" and lists == 1)
            if failing:
                error = {"code": -32603, "message": "listing failed"}
                send({"jsonrpc": "2.0", "id": request_id, "error": error})
            elif mode == "needs-meta" and not modern:
                error = {"code": -32602, "message": "missing _meta protocol version"}
                send({"jsonrpc": "2.0", "id": request_id, "error": error})
            else:
                result = {"tools": tools(mode)}
                if modern:
                    result["resultType"] = "complete"
                send({"jsonrpc": "2.0", "id": request_id, "result": result})
        elif method == "tools/call":
            name, arguments = params.get("name"), params.get("arguments") or {}
            with open(ran_file, "a") as ran:
                ran.write(f"{name} {json.dumps(arguments, sort_keys=True)}\n")
            if name == "hang":
                continue
            if name == "gate":
                threading.Thread(target=open_gate, args=(ran_file, request_id, send)).start()
                continue
            if name == "big":
                text = "x" * int(arguments["size"])
                # As the SDKs shape it: isError false and a _meta of its own.
                result = {
                    "content": [{"type": "text", "text": text}],
                    "isError": False,
                    "_meta": {"t": 1},
                }
            elif name == "oops":
                text = "Invalid timezone: Mars/Olympus"
                result = {"content": [{"type": "text", "text": text}], "isError": True}
            elif name == "job":
                result = {
                    "resultType": "task",
                    "taskId": "task-1",
                    "status": "working",
                    "createdAt": "2026-12-07T00:00:00Z",
                    "lastUpdatedAt": "2026-12-07T00:00:00Z",
                    "ttlMs": 60000,
                }
            elif name == "ask" and "inputResponses" not in params:
                result = {
                    "resultType": "input_required",
                    "inputRequests": {
                        "city": {
                            "method": "elicitation/create",
                            "params": {
                                "mode": "form",
                                "message": "Which city?",
                                "requestedSchema": {
                                    "type": "object",
                                    "properties": {"city": {"type": "string"}},
                                },
                            },
                        }
                    },
                    "requestState": "round-1",
                }
            elif name == "ask":
                answer = params["inputResponses"]["city"]
                text = (
                    f"weather in {answer['content']['city']} (state {params.get('requestState')})"
                )
                result = {"content": [{"type": "text", "text": text}]}
            else:
                result = {"content": [{"type": "text", "text": json.dumps(arguments)}]}
            if modern:
                result.setdefault("resultType", "complete")
            send({"jsonrpc": "2.0", "id": request_id, "result": result})
        elif method == "tasks/get":
            done = {"content": [{"type": "text", "text": "job done"}], "resultType": "complete"}
            result = {
                "resultType": "complete",
                "taskId": params.get("taskId"),
                "status": "completed",
                "result": done,
            }
            send({"jsonrpc": "2.0", "id": request_id, "result": result})
        else:
            error = {"code": -32601, "message": "Method not found"}
            send({"jsonrpc": "2.0", "id": request_id, "error": error})


if __name__ == "__main__":
    main()
