"""A `kbroker serve` child process started under a given open-file limit, for the descriptor tests."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def start(tmp_path: Path, soft: int, hard: int) -> tuple[subprocess.Popen[str], str, Path]:
    """Start (or restart: its stderr file is appended to) a broker on ``tmp_path/data``; (process, address,
    stderr file) once it is ready."""
    ready, stderr = tmp_path / "ready", tmp_path / "stderr"
    ready.unlink(missing_ok=True)
    command = [sys.executable, "-m", "kbroker", "serve", "--data-dir", str(tmp_path / "data")]
    command += ["--ready-file", str(ready), "--override", "listeners=PLAINTEXT://127.0.0.1:0"]

    def limit() -> None:  # in the child, before kbroker starts
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    process = subprocess.Popen(command, stderr=stderr.open("a"), text=True, preexec_fn=limit)
    until(lambda: ready.exists() and bool(ready.read_text().strip()), "the broker is ready", process)
    return process, ready.read_text().strip(), stderr


def until(condition: Callable[[], bool], what: str, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert process.poll() is None, f"the broker exited while waiting for: {what}"
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.02)


def stop(process: subprocess.Popen[str], stderr: Path) -> str:
    """SIGTERM, wait for the clean stop; the broker's stderr so far."""
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)
    return stderr.read_text()
