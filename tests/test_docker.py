"""The Docker side: docker/entrypoint.sh, the health check, docker/compose.yaml's commands, docker/Dockerfile and
kbroker.testcontainers.KBrokerContainer.

Without a Docker engine (as here) the image is not built, but everything it runs is run for real: the
entrypoint script starts a broker from environment variables, `kbroker health` checks it, and the compose
file's kcat producer and consumer commands run against it. The container tests need an engine and skip
without one, saying so.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType

from kbroker.apis import advertised_versions
from kbroker.health import NotReady, check
from kbroker.testing import RunningBroker

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
ENTRYPOINT = DOCKER / "entrypoint.sh"
KCAT = os.environ.get("KCAT") or next(
    (str(p) for p in (Path("/usr/bin/kcat"), Path("/usr/local/bin/kcat")) if p.exists()), None
)


def child_env(**settings: str) -> dict[str, str]:
    """The environment for the entrypoint: ``kbroker`` on PATH (the interpreter's bin directory), no stray
    KBROKER_* variables from the caller, plus ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KBROKER_")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return {**env, **settings}


class Entrypoint:
    """docker/entrypoint.sh running `kbroker serve` as a child; its bound address read from --ready-file."""

    def __init__(self, tmp: Path, env: dict[str, str], *args: str) -> None:
        self.ready_file = tmp / "ready"
        self.log = tmp / "entrypoint.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                ["sh", str(ENTRYPOINT), "--ready-file", str(self.ready_file), *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def wait_ready(self, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while not self.ready_file.exists():
            assert self.process.poll() is None, f"entrypoint exited {self.process.returncode}: {self.log.read_text()}"
            assert time.monotonic() < deadline, f"not ready in {timeout} s: {self.log.read_text()}"
            time.sleep(0.01)
        return self.ready_file.read_text().strip()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(30)


@pytest.fixture
def entrypoint(tmp_path: Path) -> Iterator:
    started: list[Entrypoint] = []

    def start(env: dict[str, str], *args: str) -> Entrypoint:
        started.append(Entrypoint(tmp_path, env, *args))
        return started[-1]

    yield start
    for running in started:
        if running.process.poll() is None:
            running.process.kill()
            running.process.wait()


def run_health(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(ENTRYPOINT), "health", *args], env=env, capture_output=True, text=True, timeout=60)


# --- kbroker health ----------------------------------------------------------------------------------------


def test_health_reports_a_live_broker(broker: RunningBroker) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "kbroker", "health", "--bootstrap", broker.bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert broker.broker is not None
    assert run.stdout.strip() == (
        f"ready: {broker.bootstrap} answers ApiVersions ({len(advertised_versions())} APIs) and Metadata "
        f"(brokers {broker.bootstrap}; cluster id {broker.broker.cluster_id}; controller 0)"
    )


def test_health_fails_with_the_reason_when_nothing_kafka_answers() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed_port = unused.getsockname()[1]
    run = subprocess.run(
        [sys.executable, "-m", "kbroker", "health", "--bootstrap", f"127.0.0.1:{closed_port}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.startswith(f"kbroker health: not ready: 127.0.0.1:{closed_port}: ConnectionRefusedError")

    # A server that accepts and hangs up is not a broker either.
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def hang_up() -> None:
            connection, _ = server.accept()
            connection.recv(4096)  # the request, unanswered
            connection.close()

        threading.Thread(target=hang_up, daemon=True).start()
        with pytest.raises(NotReady, match="the broker closed the connection"):
            check(f"127.0.0.1:{port}")


# --- docker/entrypoint.sh ----------------------------------------------------------------------------------


def test_entrypoint_maps_the_environment_to_kbroker_serve(tmp_path: Path, entrypoint) -> None:
    data_dir = tmp_path / "volume"
    env = child_env(
        KBROKER_LISTENER="127.0.0.1:0",
        KBROKER_ADVERTISED_LISTENER="localhost:0",  # port 0: the port actually bound
        KBROKER_DATA_DIR=str(data_dir),
        KBROKER_LOG_LEVEL="DEBUG",
        KBROKER_CONFIG_NUM_PARTITIONS="3",
        KBROKER_CONFIG_LOG_RETENTION_MS="3600000",
    )
    running = entrypoint(env)
    advertised = running.wait_ready()
    port = advertised.rpartition(":")[2]
    assert advertised == f"localhost:{port}"

    # The health mode asks the listener's port on loopback.
    health = run_health({**env, "KBROKER_LISTENER": f"0.0.0.0:{port}"})
    assert health.returncode == 0, health.stderr
    assert health.stdout.startswith(f"ready: 127.0.0.1:{port} answers ApiVersions")
    assert f"(brokers {advertised};" in health.stdout

    producer = KafkaProducer(bootstrap_servers=advertised)
    producer.send("env", b"x").get(10)  # auto-created with num.partitions from the environment
    assert producer.partitions_for("env") == {0, 1, 2}
    producer.close()
    admin = KafkaAdminClient(bootstrap_servers=advertised)
    resource = ConfigResource(ConfigResourceType.TOPIC, "env")
    retention = admin.describe_configs([resource], config_filter="all")["topic"]["env"]["retention.ms"]
    admin.close()
    assert (retention["value"], retention["config_source"]) == ("3600000", "STATIC_BROKER_CONFIG")

    log = running.log.read_text()
    assert " DEBUG " in log  # KBROKER_LOG_LEVEL
    assert running.stop() == 0  # SIGTERM reaches kbroker (exec'd): it drains and exits cleanly
    assert sorted(p.name for p in data_dir.iterdir() if p.name.startswith("env-")) == ["env-0", "env-1", "env-2"]

    health = run_health({**env, "KBROKER_LISTENER": f"0.0.0.0:{port}"})
    assert health.returncode == 1 and "not ready" in health.stderr


def test_entrypoint_waits_for_the_advertised_listener_file(tmp_path: Path, entrypoint) -> None:
    listener_file = tmp_path / "advertised"
    env = child_env(
        KBROKER_LISTENER="127.0.0.1:0",
        KBROKER_DATA_DIR=str(tmp_path / "data"),
        KBROKER_ADVERTISED_LISTENER_FILE=str(listener_file),
    )
    running = entrypoint(env)
    time.sleep(0.5)  # the broker would be up by now if the script did not wait
    assert not running.ready_file.exists() and running.process.poll() is None
    listener_file.write_text("broker.example:19092\n")
    assert running.wait_ready() == "broker.example:19092"
    assert "waiting for" in running.log.read_text()


def test_entrypoint_runs_any_other_command() -> None:
    run = subprocess.run(["sh", str(ENTRYPOINT), "kbroker", "--help"], env=child_env(), capture_output=True, text=True)
    assert run.returncode == 0
    commands = re.search(r"\{([a-z,-]+)\}", run.stdout)
    assert commands is not None and commands.group(1).split(",") == [
        *("serve", "health", "certs", "topics", "produce", "consume", "groups", "configs", "acls", "transactions"),
        *("mirror", "console", "format", "cluster"),
    ]


# --- docker/compose.yaml -----------------------------------------------------------------------------------


def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


@pytest.mark.skipif(KCAT is None, reason="kcat is not installed (apt-get install -y kcat; .ci/run does)")
def test_compose_services_run_against_the_broker_they_configure(tmp_path: Path, entrypoint) -> None:
    services = compose()["services"]
    broker_env = {k: str(v) for k, v in services["kbroker"]["environment"].items()}
    # The compose broker's settings, on a local port instead of the Compose network's kbroker:9092.
    running = entrypoint(
        child_env(
            **{
                **broker_env,
                "KBROKER_LISTENER": "127.0.0.1:0",
                "KBROKER_ADVERTISED_LISTENER": "127.0.0.1:0",
                "KBROKER_DATA_DIR": str(tmp_path / "data"),
            }
        )
    )
    bootstrap = running.wait_ready()

    def local(command: list[str], volumes: list[str]) -> list[str]:
        mounts = {}
        for volume in volumes:
            source, target = volume.split(":")[:2]
            mounts[target] = str((DOCKER / source).resolve())
        return [KCAT, *(mounts.get(arg, bootstrap if arg == "kbroker:9092" else arg) for arg in command)]

    producer = services["producer"]
    assert producer["depends_on"] == {"kbroker": {"condition": "service_healthy"}}
    run = subprocess.run(local(producer["command"], producer["volumes"]), capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr

    consumer = services["consumer"]
    assert consumer["depends_on"] == {"producer": {"condition": "service_completed_successfully"}}
    # -e: stop at the end of the partitions instead of waiting for more, as the Compose service does.
    command = local(consumer["command"], [])
    run = subprocess.run([command[0], "-e", *command[1:]], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr

    messages = [line.split(":", 1) for line in (DOCKER / "example-messages.txt").read_text().splitlines()]
    partitions = 3  # KBROKER_CONFIG_NUM_PARTITIONS
    assert broker_env["KBROKER_CONFIG_NUM_PARTITIONS"] == str(partitions)
    expected: dict[int, list[tuple[str, str]]] = {}
    for key, value in messages:
        # kcat's producer uses librdkafka's default partitioner, consistent_random: CRC-32 of the key.
        expected.setdefault(zlib.crc32(key.encode()) % partitions, []).append((key, value))
    got: dict[int, list[tuple[str, str]]] = {}
    for line in run.stdout.splitlines():
        head, _, value = line.partition(": ")
        _, partition, _, offset, _, key = head.split(" ")
        got.setdefault(int(partition), []).append((key, value))
        assert int(offset) == len(got[int(partition)]) - 1
    assert got == expected

    # The group committed what it read: the committed offsets are the ends of the partitions.
    consumer_client = KafkaConsumer(bootstrap_servers=bootstrap, group_id="example-group", enable_auto_commit=False)
    committed = {p: consumer_client.committed(TopicPartition("example", p)) for p in range(partitions)}
    consumer_client.close()
    assert committed == {p: len(expected.get(p, [])) or None for p in range(partitions)}


# --- docker/Dockerfile -------------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the final stage, continuation lines joined."""
    text = (DOCKER / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    stages: list[list[tuple[str, str]]] = []
    for line in lines:
        instruction, _, arguments = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instruction.upper(), arguments.strip()))
    return stages[-1]


def test_dockerfile_runs_the_entrypoint_as_a_non_root_user_with_a_kafka_health_check() -> None:
    final = dockerfile_instructions()
    values = {name: args for name, args in final}
    assert values["USER"] == "10001:10001"
    assert values["EXPOSE"] == "9092"
    assert json.loads(values["ENTRYPOINT"]) == ["kbroker-entrypoint"]
    assert values["HEALTHCHECK"].endswith('CMD ["kbroker-entrypoint", "health"]')
    assert json.loads(values["VOLUME"]) == ["/var/lib/kbroker/data"]
    env = values["ENV"]
    assert "KBROKER_LISTENER=0.0.0.0:9092" in env and "KBROKER_DATA_DIR=/var/lib/kbroker/data" in env
    copies = [args.split() for name, args in final if name == "COPY"]
    assert ["docker/entrypoint.sh", "/usr/local/bin/kbroker-entrypoint"] in copies
    # Every file the build stage copies from the context exists.
    text = (DOCKER / "Dockerfile").read_text()
    for line in text.splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            for source in line.split()[1:-1]:
                assert (REPO / source).exists(), source


# --- kbroker.testcontainers (needs a Docker engine) --------------------------------------------------------


@pytest.fixture(scope="module")
def kbroker_image() -> str:
    pytest.importorskip("testcontainers", reason="testcontainers is not installed (pip install 'kbroker[docker]')")
    from kbroker.testcontainers import KBrokerContainer, docker_engine_problem

    problem = docker_engine_problem()
    if problem is not None:
        pytest.skip(problem)
    return KBrokerContainer.build_image(REPO, tag="kbroker:test")


def test_kbroker_container_round_trip_and_health(kbroker_image: str) -> None:
    from kbroker.testcontainers import KBrokerContainer

    with KBrokerContainer(kbroker_image).with_config("num.partitions", 4) as container:
        bootstrap = container.get_bootstrap_server()
        producer = KafkaProducer(bootstrap_servers=bootstrap)
        sent = producer.send("in-docker", key=b"k", value=b"hello").get(10)
        assert producer.partitions_for("in-docker") == {0, 1, 2, 3}
        producer.close()
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=10_000)
        tp = TopicPartition("in-docker", sent.partition)
        consumer.assign([tp])
        consumer.seek(tp, sent.offset)
        record = next(iter(consumer))
        consumer.close()
        assert (record.key, record.value) == (b"k", b"hello")

        wrapped = container.get_wrapped_container()
        assert wrapped.exec_run(["id", "-u"]).output.decode().strip() == "10001"
        deadline = time.monotonic() + 60
        while True:  # Docker runs the image's HEALTHCHECK (kbroker-entrypoint health) every 10 s
            wrapped.reload()
            status = wrapped.attrs["State"]["Health"]["Status"]
            if status != "starting" or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert status == "healthy"


def test_kbroker_container_defaults_the_initial_rebalance_delay_to_zero() -> None:
    """As testcontainers' KafkaContainer; with_config still wins. No engine needed: nothing is started, and a
    fixed API version keeps docker-py from asking an engine for one."""
    pytest.importorskip("testcontainers", reason="testcontainers is not installed (pip install 'kbroker[docker]')")
    from kbroker.testcontainers import KBrokerContainer

    key = "KBROKER_CONFIG_GROUP_INITIAL_REBALANCE_DELAY_MS"
    assert KBrokerContainer("kbroker:test", docker_client_kw={"version": "1.43"}).env[key] == "0"
    configured = KBrokerContainer("kbroker:test", docker_client_kw={"version": "1.43"})
    assert configured.with_config("group.initial.rebalance.delay.ms", 3000).env[key] == "3000"
