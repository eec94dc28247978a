"""The compat suite's own machinery (compat/conftest.py), run as a user runs it: the --target and --clients
options, "n/a" for an operation a client lacks, a skipped target with its reason, and the printed and JSON
matrix. The scenarios themselves run in compat/ (part of the default test run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_compat(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "compat", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_matrix_of_one_scenario_two_clients_two_targets(tmp_path: Path) -> None:
    out = tmp_path / "matrix.json"
    run = run_compat(
        "--target",
        "kbroker,external",
        "--clients",
        "kafka-python-3,kcat",
        "-k",
        "earliest_and_latest_offsets",
        "--compat-json",
        str(out),
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = run.stdout.splitlines()
    start = lines.index(next(line for line in lines if "compat matrix: kbroker | external" in line))
    assert lines[start + 1].split() == ["scenario", "client", "kbroker", "external"]
    assert lines[start + 2].split() == ["earliest_and_latest_offsets", "kafka-python-3", "pass", "skip"]
    assert lines[start + 3].split() == ["earliest_and_latest_offsets", "kcat", "n/a", "skip"]
    assert any(line.startswith("skipped on external: ") and "KBROKER_COMPAT_BOOTSTRAP" in line for line in lines)

    matrix = json.loads(out.read_text())
    cells = {(c["target"], c["client"]): (c["result"], c["reason"]) for c in matrix["cells"]}
    assert cells[("kbroker", "kafka-python-3")] == ("pass", "")
    assert cells[("kbroker", "kcat")] == ("n/a", "n/a: kcat: list offsets")
    # Without KBROKER_COMPAT_BOOTSTRAP the external target is skipped, saying what to set.
    assert cells[("external", "kcat")][0] == "skip"
    assert "KBROKER_COMPAT_BOOTSTRAP" in cells[("external", "kcat")][1]
    assert matrix["versions"]["kafka-python-3"] == "3.0.12"


def test_unknown_target_or_client_is_a_usage_error() -> None:
    run = run_compat("--target", "redpanda", "-k", "earliest")
    assert run.returncode == 4
    assert "--target: unknown redpanda; known: kbroker, kafka, external" in run.stderr
    run = run_compat("--clients", "kafka-python-9", "-k", "earliest")
    assert run.returncode == 4
    assert "--clients: unknown kafka-python-9" in run.stderr


def test_the_kafka_target_configures_apache_kafka_in_kraft_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Apache Kafka container's settings and start script, checked without a Docker engine: only the
    engine client is replaced; testcontainers' own start flow (configure, then the script written once the
    mapped port is known) runs as it would against Docker."""
    import testcontainers.core.container as tc_container

    class NoEngine:
        def __init__(self, **_: object) -> None:
            pass

    monkeypatch.setattr(tc_container, "DockerClient", NoEngine)
    from compat.targets import apache_kafka_container

    container = apache_kafka_container("apache/kafka:4.4.0")
    written: dict[str, bytes] = {}
    monkeypatch.setattr(container, "get_bootstrap_server", lambda: "localhost:32801")
    monkeypatch.setattr(container, "create_file", lambda content, path: written.__setitem__(path, content))
    container.configure()
    container.tc_start()

    assert container.image.endswith("apache/kafka:4.4.0")
    assert list(container.ports) == ["9092"]
    env = container.env
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@localhost:9094"
    assert env["KAFKA_LISTENERS"].startswith("PLAINTEXT://0.0.0.0:9092,")
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"
    assert env["KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS"] == "0"
    assert len(env["CLUSTER_ID"]) == 22  # a base64url UUID without padding, as kafka-storage expects
    assert not any(name.startswith("KAFKA_ZOOKEEPER") or name == "KAFKA_BROKER_ID" for name in env)
    assert container.wait_for.match("[2026-11-23] INFO [KafkaRaftServer nodeId=1] Kafka Server started")
    script = written["/tc-start.sh"].decode()
    assert "export KAFKA_ADVERTISED_LISTENERS=PLAINTEXT://localhost:32801,BROKER://$(hostname):9093" in script
    assert script.rstrip().endswith("exec /etc/kafka/docker/run")
