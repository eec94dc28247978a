"""Serve one Python adapter over JSON lines: ``python -m compat.clients.runner MODULE:CLASS BOOTSTRAP``.

Reads {"id", "op", "args"} lines on stdin and answers {"id", "result"} or {"id", "error": {"kind",
"error", "message"}} on stdout, after a first {"ready": {"version"}} line. "kind" is "unsupported", "client"
(a ClientError: "error" is the Kafka error name) or "exception" (a bug or an unexpected failure).
Anything the client library prints goes to stderr, so stdout carries only the protocol.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from typing import Any

from compat.clients.api import OPERATIONS, ClientError, Unsupported


def answer(request_id: int, adapter: Any, op: str, args: dict[str, Any]) -> dict[str, Any]:
    try:
        if op not in OPERATIONS:
            raise Unsupported(f"unknown operation {op!r}")
        return {"id": request_id, "result": getattr(adapter, op)(**args)}
    except Unsupported as exc:
        return {"id": request_id, "error": {"kind": "unsupported", "error": "", "message": str(exc)}}
    except ClientError as exc:
        return {"id": request_id, "error": {"kind": "client", "error": exc.error, "message": exc.message}}
    except Exception as exc:
        message = "".join(traceback.format_exception(exc))
        return {"id": request_id, "error": {"kind": "exception", "error": type(exc).__name__, "message": message}}


def main(argv: list[str]) -> int:
    target, bootstrap = argv
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # C libraries (librdkafka) write to fd 1 directly
    sys.stdout = sys.stderr
    module_name, _, class_name = target.partition(":")
    adapter = getattr(importlib.import_module(module_name), class_name)(bootstrap)

    def send(message: dict[str, Any]) -> None:
        protocol.write(json.dumps(message) + "\n")

    send({"ready": {"version": adapter.version()}})
    for line in sys.stdin:
        if line.strip():
            request = json.loads(line)
            send(answer(request["id"], adapter, request["op"], request.get("args", {})))
    adapter.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
