"""kbroker.testcontainers.KBrokerCluster: Apache Kafka's KRaft controller and kbroker brokers, each in a container.

Without a Docker engine (as here) no container runs, but what each one is given is checked for real: the
controller's command is run by ``sh`` (Kafka's scripts replaced by stand-ins that record their arguments), and a
broker's environment is run through docker/entrypoint.sh into ``kbroker format`` and ``kbroker serve``, which
serves both listeners and looks for the controller by its container name. The cluster test needs an engine and
skips without one, saying so.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("testcontainers", reason="testcontainers is not installed (pip install 'kbroker[docker]')")

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition  # noqa: E402
from kafka.admin import NewTopic  # noqa: E402

from kbroker.config import parse_properties  # noqa: E402
from kbroker.kraft.local_cluster import controller_features  # noqa: E402
from kbroker.testcontainers import (  # noqa: E402
    CONTROLLER_DATA_DIR,
    CONTROLLER_IMAGE,
    CONTROLLER_PROPERTIES,
    ClusterPlan,
    KBrokerCluster,
    KBrokerContainer,
    config_env,
    docker_engine_problem,
)

REPO = Path(__file__).resolve().parents[1]
ENTRYPOINT = REPO / "docker" / "entrypoint.sh"
CLUSTER_ID = "MkU3OEVBNTcwNTJENDM2Qg"


def plan(brokers: int = 3, config: tuple[tuple[str, str], ...] = ()) -> ClusterPlan:
    return ClusterPlan(CLUSTER_ID, "kbroker-test", "localhost", tuple(31001 + i for i in range(brokers)), config)


def child_env(**settings: str) -> dict[str, str]:
    """The entrypoint's environment: ``kbroker`` on PATH, this repository importable, no stray KBROKER_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KBROKER_")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return {**env, **settings}


# --- the controller ----------------------------------------------------------------------------------------


def test_the_controller_is_a_single_voter_on_the_cluster_network() -> None:
    assert plan().controller_properties() == {
        "process.roles": "controller",
        "node.id": "1000",
        "controller.quorum.voters": "1000@kbroker-test-controller:9093",
        "listeners": "CONTROLLER://:9093",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "log.dirs": CONTROLLER_DATA_DIR,
    }
    assert CONTROLLER_IMAGE == "apache/kafka:4.4.0"


def test_the_controller_command_writes_its_properties_formats_with_kbrokers_features_and_starts(
    tmp_path: Path,
) -> None:
    command = plan().controller_command()
    assert command[:2] == ["sh", "-c"]
    # Run the script as the container would, Kafka's two scripts replaced by ones recording their arguments.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("kafka-storage.sh", "kafka-server-start.sh"):
        stand_in = bin_dir / name
        stand_in.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path / name}.args\n")
        stand_in.chmod(0o755)
    properties = tmp_path / "controller.properties"
    script = command[2].replace("/opt/kafka/bin/", f"{bin_dir}/").replace(CONTROLLER_PROPERTIES, str(properties))
    run = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr

    assert parse_properties(properties.read_text()) == plan().controller_properties()
    storage = (tmp_path / "kafka-storage.sh.args").read_text().splitlines()
    assert storage == ["format", "--ignore-formatted", "-t", CLUSTER_ID, "-c", str(properties), *controller_features()]
    assert "--feature" in storage and "share.version=0" in storage  # kbroker's brokers serve no share groups
    assert (tmp_path / "kafka-server-start.sh.args").read_text().splitlines() == [str(properties)]


def test_a_failed_format_does_not_start_the_controller(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kafka-storage.sh").write_text("#!/bin/sh\necho 'cannot format' >&2\nexit 1\n")
    (bin_dir / "kafka-server-start.sh").write_text(f"#!/bin/sh\ntouch {tmp_path / 'started'}\n")
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    script = plan().controller_command()[2].replace("/opt/kafka/bin/", f"{bin_dir}/")
    script = script.replace(CONTROLLER_PROPERTIES, str(tmp_path / "controller.properties"))
    run = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert (run.returncode, run.stderr) == (1, "cannot format\n")
    assert not (tmp_path / "started").exists()


# --- the brokers -------------------------------------------------------------------------------------------


def test_each_broker_gets_an_inter_broker_listener_on_the_network_and_a_client_one_on_the_host() -> None:
    three = plan()
    assert three.bootstrap_servers == "localhost:31001,localhost:31002,localhost:31003"
    assert three.broker_settings(2) == {
        "process.roles": "broker",
        "node.id": "2",
        "controller.quorum.bootstrap.servers": "kbroker-test-controller:9093",
        "controller.listener.names": "CONTROLLER",
        "listeners": "INTERNAL://0.0.0.0:9093,EXTERNAL://0.0.0.0:9092",
        "advertised.listeners": "INTERNAL://kbroker-test-broker-2:9093,EXTERNAL://localhost:31002",
        "listener.security.protocol.map": "INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "INTERNAL",
        "offsets.topic.replication.factor": "3",
        "transaction.state.log.replication.factor": "3",
        "transaction.state.log.min.isr": "2",
        "group.initial.rebalance.delay.ms": "0",
    }
    env = three.broker_env(2)
    assert env["KBROKER_CLUSTER_ID"] == CLUSTER_ID
    assert env["KBROKER_LISTENER"] == "0.0.0.0:9092"  # the image's health check asks the client listener
    assert (
        env["KBROKER_CONFIG_ADVERTISED_LISTENERS"] == "INTERNAL://kbroker-test-broker-2:9093,EXTERNAL://localhost:31002"
    )
    assert env["KBROKER_CONFIG_INTER_BROKER_LISTENER_NAME"] == "INTERNAL"
    assert len(env) == 12 + 2

    # The internal topics are replicated as widely as the cluster allows; with_config's settings win.
    one, five = plan(1).broker_settings(1), plan(5, (("group.initial.rebalance.delay.ms", "3000"),)).broker_settings(5)
    assert [one[k] for k in ("offsets.topic.replication.factor", "transaction.state.log.min.isr")] == ["1", "1"]
    assert [five[k] for k in ("offsets.topic.replication.factor", "transaction.state.log.min.isr")] == ["3", "2"]
    assert five["group.initial.rebalance.delay.ms"] == "3000"
    with pytest.raises(KeyError, match=r"no broker 4 in this cluster \(brokers 1..3\)"):
        three.broker_env(4)


def test_a_brokers_environment_reaches_kbroker_format_and_serve_through_the_entrypoint(tmp_path: Path) -> None:
    """Broker 2's environment as the container gets it, with free local ports for its two listeners: the data
    directory is formatted for the cluster and node, both listeners are served with their advertised addresses,
    and the broker looks for the controller by its container name (which only the cluster's network resolves)."""
    env = child_env(
        **{
            **plan().broker_env(2),
            "KBROKER_DATA_DIR": str(tmp_path / "data"),
            "KBROKER_CONFIG_LISTENERS": "INTERNAL://127.0.0.1:0,EXTERNAL://127.0.0.1:0",
            "KBROKER_CONFIG_INITIAL_BROKER_REGISTRATION_TIMEOUT_MS": "1000",
        }
    )
    run = subprocess.run(["sh", str(ENTRYPOINT)], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert f"Formatting {tmp_path / 'data'} for cluster {CLUSTER_ID} as node 2." in run.stderr
    meta = parse_properties((tmp_path / "data" / "meta.properties").read_text())
    assert (meta["cluster.id"], meta["node.id"]) == (CLUSTER_ID, "2")
    assert re.search(r"listener INTERNAL on 127\.0\.0\.1:\d+, advertised kbroker-test-broker-2:9093\n", run.stderr)
    assert re.search(r"listener EXTERNAL on 127\.0\.0\.1:\d+, advertised localhost:31002\n", run.stderr)
    assert run.stderr.splitlines()[-1].startswith(
        "kbroker: no KRaft controller at kbroker-test-controller:9093 registered broker 2 within 1 s"
    )


def test_the_entrypoint_needs_a_node_id_with_a_cluster_id(tmp_path: Path) -> None:
    env = child_env(KBROKER_CLUSTER_ID=CLUSTER_ID, KBROKER_DATA_DIR=str(tmp_path / "data"))
    run = subprocess.run(["sh", str(ENTRYPOINT)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert run.stderr.strip().endswith("KBROKER_CONFIG_NODE_ID: is needed with KBROKER_CLUSTER_ID")
    assert not (tmp_path / "data").exists()


def test_every_variable_the_entrypoint_reads_is_documented_in_its_header_and_the_dockerfile() -> None:
    text = ENTRYPOINT.read_text()
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    code = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))
    read = {
        "KBROKER_CONFIG_<KEY>" if name == "KBROKER_CONFIG" else name
        for name in re.findall(r"KBROKER_[A-Z_]*[A-Z]", code)
    }
    assert {"KBROKER_CLUSTER_ID", "KBROKER_CONFIG_LISTENERS", "KBROKER_LISTENER"} <= read
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    for name in read - {"KBROKER_CONFIG_LISTENERS", "KBROKER_CONFIG_NODE_ID"}:  # these two are KBROKER_CONFIG_<KEY>
        assert f"#   {name}" in header, name
        if name != "KBROKER_ADVERTISED_LISTENER_FILE":  # set by KBrokerContainer, not by hand
            assert name in dockerfile, name


def test_the_controllers_command_and_a_brokers_environment_make_a_cluster_outside_docker(tmp_path: Path) -> None:
    """The plan run on this machine as the containers run it: the controller's script with Kafka 4.4's storage
    tool and server from the Maven jars (a JVM: run it under the shared lock), broker 1's environment through
    docker/entrypoint.sh. Only the addresses Docker's network would give are replaced by local ones; the broker
    registers with the controller and serves its client listener with the cluster's id."""
    from compat.apache_kafka import KafkaUnavailable, free_port, kafka_classpath
    from kbroker.health import wait_until_ready

    try:
        classpath = kafka_classpath()
    except KafkaUnavailable as exc:
        pytest.skip(f"Apache Kafka cannot run here: {exc}")
    controller_port, internal_port, client_port = free_port(), free_port(), free_port()
    local = ClusterPlan(CLUSTER_ID, "kbroker-test", "127.0.0.1", (client_port,))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, main in (("kafka-storage.sh", "kafka.tools.StorageTool"), ("kafka-server-start.sh", "kafka.Kafka")):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec java -Xmx256m -cp "{classpath}" {main} "$@"\n')
        (bin_dir / name).chmod(0o755)
    script = local.controller_command()[2]
    for container_side, here in [
        ("/opt/kafka/bin/", f"{bin_dir}/"),
        (CONTROLLER_PROPERTIES, str(tmp_path / "controller.properties")),
        (CONTROLLER_DATA_DIR, str(tmp_path / "controller-data")),
        (f"{local.controller_name}:9093", f"127.0.0.1:{controller_port}"),
        ("CONTROLLER://:9093", f"CONTROLLER://127.0.0.1:{controller_port}"),
    ]:
        assert container_side in script
        script = script.replace(container_side, here)
    env = local.broker_env(1) | {
        "KBROKER_DATA_DIR": str(tmp_path / "broker-data"),
        "KBROKER_CONFIG_CONTROLLER_QUORUM_BOOTSTRAP_SERVERS": f"127.0.0.1:{controller_port}",
        "KBROKER_CONFIG_LISTENERS": f"INTERNAL://127.0.0.1:{internal_port},EXTERNAL://127.0.0.1:{client_port}",
        "KBROKER_CONFIG_ADVERTISED_LISTENERS": f"INTERNAL://127.0.0.1:{internal_port},"
        f"EXTERNAL://127.0.0.1:{client_port}",
    }
    started: list[subprocess.Popen[bytes]] = []
    try:
        with open(tmp_path / "controller.log", "wb") as log:
            started.append(subprocess.Popen(["sh", "-c", script], stdout=log, stderr=subprocess.STDOUT))
        with open(tmp_path / "broker.log", "wb") as log:
            started.append(
                subprocess.Popen(["sh", str(ENTRYPOINT)], env=child_env(**env), stdout=log, stderr=subprocess.STDOUT)
            )
        try:
            health = wait_until_ready(f"127.0.0.1:{client_port}", timeout=180)
        except TimeoutError:
            logs = [(tmp_path / name).read_text(errors="replace")[-3000:] for name in ("controller.log", "broker.log")]
            raise AssertionError("\n".join(logs)) from None
        assert (health.cluster_id, health.brokers) == (CLUSTER_ID, [f"127.0.0.1:{client_port}"])
        properties = parse_properties((tmp_path / "controller-data" / "meta.properties").read_text())
        assert (properties["cluster.id"], properties["node.id"]) == (CLUSTER_ID, "1000")
    finally:
        for process in reversed(started):
            if process.poll() is None:
                process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# --- argument checks (nothing started, no engine needed) ---------------------------------------------------


@pytest.mark.parametrize("brokers", [0, -1, True, 2.5, "3"])
def test_the_number_of_brokers_is_checked(brokers: object) -> None:
    with pytest.raises(ValueError, match=r"a cluster needs a whole number of brokers, at least 1$"):
        KBrokerCluster("kbroker:test", brokers=brokers)  # type: ignore[arg-type]


def test_settings_the_image_cannot_take_are_refused_at_once() -> None:
    cluster = KBrokerCluster("kbroker:test", brokers=1)
    with pytest.raises(ValueError, match=r"config key 'log_dirs': .* a key must be letters, digits and dots"):
        cluster.with_config("log_dirs", "/x")
    with pytest.raises(ValueError, match="config key ''"):
        KBrokerContainer("kbroker:test", docker_client_kw={"version": "1.43"}).with_config("", 1)
    assert config_env("unclean.leader.election.enable", True) == (
        "KBROKER_CONFIG_UNCLEAN_LEADER_ELECTION_ENABLE",
        "true",
    )
    cluster.with_config("min.insync.replicas", 2).with_config("unclean.leader.election.enable", False)
    made = cluster.make_plan("localhost")
    assert made.broker_env(1)["KBROKER_CONFIG_MIN_INSYNC_REPLICAS"] == "2"
    assert made.broker_env(1)["KBROKER_CONFIG_UNCLEAN_LEADER_ELECTION_ENABLE"] == "false"
    assert len(made.host_ports) == 1 and made.name_prefix.startswith("kbroker-") and len(made.cluster_id) == 22


def test_the_containers_are_made_from_the_plan() -> None:
    """What start() starts, made without an engine (a fixed API version keeps docker-py from asking one)."""
    from testcontainers.core.network import Network

    docker_client_kw = {"version": "1.43"}
    cluster = KBrokerCluster("kbroker:test", brokers=2, docker_client_kw=docker_client_kw)
    made = plan(2)
    network = Network(docker_client_kw=docker_client_kw)
    controller, brokers = cluster.containers(made, network)
    assert controller.image.endswith(CONTROLLER_IMAGE) and controller._name == "kbroker-test-controller"
    assert controller._command == made.controller_command() and controller._network is network
    assert controller.env == {"KAFKA_HEAP_OPTS": "-Xmx512m -Xms512m"} and controller.ports == {}
    assert sorted(brokers) == [1, 2]
    for node_id, broker in brokers.items():
        assert broker.image.endswith("kbroker:test") and broker._name == f"kbroker-test-broker-{node_id}"
        assert broker.env == made.broker_env(node_id) and broker._network is network
        assert broker.ports == {"9092": 31000 + node_id}  # the client listener, on its fixed host port


def test_a_cluster_not_started_says_so() -> None:
    cluster = KBrokerCluster("kbroker:test", brokers=2)
    with pytest.raises(RuntimeError, match=r"the cluster is not started: start\(\) it"):
        cluster.get_bootstrap_servers()
    with pytest.raises(KeyError, match=r"no broker 1 in this cluster"):
        cluster.broker(1)
    cluster.stop()  # nothing to remove: no engine is asked
    assert repr(cluster) == "<KBrokerCluster of 2 brokers: not started>"


# --- in Docker (needs an engine) ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kbroker_image() -> str:
    problem = docker_engine_problem()
    if problem is not None:
        pytest.skip(problem)
    return KBrokerContainer.build_image(REPO, tag="kbroker:test")


def test_a_cluster_in_docker_keeps_every_acknowledged_record_when_the_leader_is_killed(kbroker_image: str) -> None:
    with KBrokerCluster(kbroker_image, brokers=3).with_config("min.insync.replicas", 2) as cluster:
        bootstrap = cluster.get_bootstrap_servers()
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        admin.create_topics([NewTopic("failover", num_partitions=1, replication_factor=3)])
        (described,) = admin.describe_topics(["failover"])
        (partition,) = described["partitions"]
        assert sorted(partition["replicas"]) == [1, 2, 3] and sorted(partition["isr"]) == [1, 2, 3]
        leader = partition["leader"]

        # Idempotent: a retried batch is not written twice, so the offsets are exactly 0..199. The delivery
        # timeout outlasts the controller's fencing of the dead leader (broker.session.timeout.ms, 9 s).
        producer = KafkaProducer(
            bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, delivery_timeout_ms=120_000
        )
        sent = [f"record-{i}".encode() for i in range(200)]
        offsets = [producer.send("failover", value).get(150).offset for value in sent[:100]]
        cluster.broker(leader).kill()
        assert not cluster.broker(leader).is_running
        offsets += [producer.send("failover", value).get(150).offset for value in sent[100:]]
        producer.close()
        assert offsets == list(range(200))

        (described,) = admin.describe_topics(["failover"])
        assert described["partitions"][0]["leader"] not in (leader, -1)
        admin.close()

        consumer = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=30_000)
        tp = TopicPartition("failover", 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        read = []
        for record in consumer:
            read.append((record.offset, record.value))
            if len(read) == len(sent):
                break
        consumer.close()
        assert read == list(enumerate(sent))

        cluster.broker(leader).start()  # back on its port and its data, serving
        assert cluster.broker(leader).is_running
