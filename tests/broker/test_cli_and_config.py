"""The kbroker command: start-up line, clean shutdown on SIGTERM, clear configuration errors."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kbroker.config import BrokerConfig, ConfigError, parse_properties
from protocol.framing import decode_response, encode_request
from protocol.messages.api_versions_request import ApiVersionsRequest


def test_properties_parsing_and_types() -> None:
    values = parse_properties("# comment\nnum.partitions=3\nlog.retention.ms: 1000\n\n! other\n")
    config = BrokerConfig(values)
    assert config["num.partitions"] == 3
    assert config["log.retention.ms"] == 1000
    assert config["auto.create.topics.enable"] is True
    assert config.is_default("log.segment.bytes") and not config.is_default("num.partitions")


def test_unknown_key_and_bad_value_are_reported_together() -> None:
    with pytest.raises(ConfigError) as info:
        BrokerConfig({"no.such.key": "1", "num.partitions": "many"})
    assert "unknown configuration key 'no.such.key'" in str(info.value)
    assert "num.partitions: expected an integer" in str(info.value)


def test_kafka_only_keys_are_accepted() -> None:
    assert BrokerConfig({"num.network.threads": "3"})["num.partitions"] == 1


def _start(args: list[str], tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "kbroker", "serve", "--data-dir", str(tmp_path / "d"), *args],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if "kbroker ready" in line:
            return process, line
        if not line and process.poll() is not None:
            break
    process.kill()
    raise AssertionError("broker did not print its ready line")


def test_serve_prints_ready_line_answers_and_stops_on_sigterm(tmp_path: Path) -> None:
    process, line = _start(["--listen", "127.0.0.1:0"], tmp_path)
    try:
        match = re.search(r"listening on 127\.0\.0\.1:(\d+).*data dir (\S+), cluster id (\S+)", line)
        assert match, line
        port = int(match.group(1))
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(encode_request(ApiVersionsRequest(), 0, correlation_id=77))
            size = int.from_bytes(sock.recv(4), "big")
            data = b""
            while len(data) < size:
                data += sock.recv(size - len(data))
        correlation_id, response = decode_response(data, 18, 0)
        assert correlation_id == 77 and response.error_code == 0
        assert {k.api_key for k in response.api_keys} >= {0, 1, 2, 3, 18}
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0


def test_bad_config_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kbroker", "serve", "--data-dir", str(tmp_path), "--override", "num.partitions=x"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == "kbroker: configuration error: num.partitions: expected an integer, got 'x'"


def test_missing_config_file_is_reported(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kbroker", "serve", "--config", str(tmp_path / "nope.properties")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "cannot read" in result.stderr and "Traceback" not in result.stderr
