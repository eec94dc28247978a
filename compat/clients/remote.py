"""The suite's side of a client process: calls operations over JSON lines (see compat/clients/runner.py)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from compat.clients.api import OPERATIONS, ClientError, Unsupported


class ClientProcessError(RuntimeError):
    """The client process failed: an unexpected exception in the adapter, or the process died or hung."""


class RemoteClient:
    """One client process. ``client.produce(...)``-style calls for every operation in compat/clients/api.py."""

    def __init__(self, name: str, command: list[str], env: dict[str, str] | None = None, start_timeout: float = 120):
        self.name = name
        self._log = tempfile.TemporaryFile("w+b")
        # Its own session (process group): crash() kills it with whatever it started (kcat children).
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            start_new_session=True,
        )
        self._lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read, name=f"{name}-reader", daemon=True).start()
        self._next_id = 0
        self._lock = threading.Lock()
        ready = self._receive(start_timeout, "start")
        if "ready" not in ready:
            raise ClientProcessError(f"{name}: expected a ready line, got {ready}")
        self.version: str = ready["ready"]["version"]

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(b"")  # end of output: the process is gone

    def log_tail(self, size: int = 6000) -> str:
        self._log.flush()
        self._log.seek(0, os.SEEK_END)
        length = self._log.tell()
        self._log.seek(max(0, length - size))
        return self._log.read().decode(errors="replace")

    def _receive(self, timeout: float, what: str) -> dict[str, Any]:
        while True:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                # Its state is unknown now and a late answer would be taken for the next call's: end it, so
                # the next test starts a fresh process instead of inheriting this failure.
                self.crash()
                raise ClientProcessError(
                    f"{self.name}: no answer to {what} within {timeout:g} s\n{self.log_tail()}"
                ) from None
            if not line:
                code = self.process.wait()
                raise ClientProcessError(f"{self.name}: process exited ({code}) during {what}\n{self.log_tail()}")
            if line.startswith(b"{"):
                return json.loads(line)

    def call(self, op: str, timeout: float = 120, **args: Any) -> Any:
        with self._lock:
            self._next_id += 1
            request_id = self._next_id
            assert self.process.stdin is not None
            try:
                self.process.stdin.write(json.dumps({"id": request_id, "op": op, "args": args}).encode() + b"\n")
                self.process.stdin.flush()
            except BrokenPipeError:
                raise ClientProcessError(f"{self.name}: process is gone\n{self.log_tail()}") from None
            reply = self._receive(timeout, op)
        if reply.get("id") != request_id:
            raise ClientProcessError(f"{self.name}: answer {reply} to request {request_id}")
        if "error" not in reply:
            return reply["result"]
        error = reply["error"]
        if error["kind"] == "unsupported":
            raise Unsupported(f"{self.name}: {error['message']}")
        if error["kind"] == "client":
            raise ClientError(error["error"], error["message"])
        raise ClientProcessError(f"{self.name} {op} failed: {error['error']}\n{error['message']}")

    def __getattr__(self, op: str) -> Callable[..., Any]:
        if op not in OPERATIONS:
            raise AttributeError(op)
        return lambda **args: self.call(op, **args)

    def close(self, timeout: float = 30) -> None:
        """End of input: the process closes its clients and exits; killed if it does not."""
        if self.process.poll() is None:
            try:
                assert self.process.stdin is not None
                self.process.stdin.close()
                self.process.wait(timeout)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                pass
        self.crash()

    def crash(self) -> None:
        """SIGKILL to the process and everything it started, as a crashed application: no LeaveGroup."""
        if self.process.poll() is None:  # once reaped, its pid (and group id) may be another process's
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait()
