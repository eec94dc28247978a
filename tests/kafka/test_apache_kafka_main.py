"""``python -m compat.apache_kafka`` stops the Kafka JVM it started when it is sent SIGTERM (or SIGINT), whether
Kafka is already up or still starting: nothing it started is left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from compat.apache_kafka import KafkaUnavailable, kafka_classpath

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def kafka_directory(tmp_path: Path) -> Iterator[Path]:
    """A directory for the command's Kafka; any process left with it on its command line is killed afterwards."""
    try:
        kafka_classpath()
    except KafkaUnavailable as exc:
        pytest.skip(f"Apache Kafka cannot run here: {exc}")
    directory = tmp_path / "kafka"
    yield directory
    for pid in processes_naming(directory):
        os.kill(pid, signal.SIGKILL)


def processes_naming(directory: Path) -> list[int]:
    """The processes whose command line names ``directory`` (Kafka's JVM names its server.properties there)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command_line = (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        if str(directory).encode() in command_line and b"kafka.Kafka" in command_line:
            found.append(int(entry.name))
    return found


def start_command(directory: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "compat.apache_kafka", "--dir", str(directory)]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_sigterm_stops_the_kafka_it_started(kafka_directory: Path) -> None:
    process = start_command(kafka_directory)
    assert process.stdout is not None
    ready = process.stdout.readline()
    assert ready.startswith("Apache Kafka 4.4.0 ready at "), ready + process.stdout.read()
    [jvm] = processes_naming(kafka_directory)
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0
    assert wait_gone(jvm, 5), f"Kafka's JVM {jvm} still runs"
    assert processes_naming(kafka_directory) == []
    assert ready.endswith(f", pid {jvm})\n")
    assert "Terminating process due to signal SIGTERM" in (kafka_directory / "kafka.log").read_text()  # not SIGKILL


def test_sigterm_while_kafka_starts_stops_it_once_started(kafka_directory: Path) -> None:
    process = start_command(kafka_directory)
    deadline = time.monotonic() + 60
    while not processes_naming(kafka_directory):  # the JVM is spawned, Kafka not yet ready
        assert time.monotonic() < deadline and process.poll() is None, "Kafka's JVM never started"
        time.sleep(0.05)
    [jvm] = processes_naming(kafka_directory)
    process.send_signal(signal.SIGTERM)
    assert process.wait(180) == 0
    assert wait_gone(jvm, 5), f"Kafka's JVM {jvm} still runs"
    assert processes_naming(kafka_directory) == []
