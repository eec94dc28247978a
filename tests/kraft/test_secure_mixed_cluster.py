"""A mixed cluster whose brokers replicate over SSL: one Apache Kafka broker (node 1) and two kbroker brokers
(nodes 2 and 3) under Kafka's controller, their inter-broker listener INTERNAL an SSL one, each verifying the
other's certificate against the CA and its host name (127.0.0.1). Clients use a PLAINTEXT listener.

Kafka's broker is the oracle: with Kafka leading, kbroker's followers fetch from Kafka's TLS server; with kbroker
leading, Kafka's follower (Java's TLS client) fetches from kbroker. min.insync.replicas=3 makes each acks=all
acknowledgement wait for both followers; then every replica holds the leader's batches byte for byte and the ISR
is full.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from compat.apache_kafka import ApacheKafkaBroker, KafkaController, KafkaUnavailable
from kbroker.kraft.local_cluster import free_port
from kbroker.security import certs
from kbroker.testing import BrokerProcess
from tests.kraft.conftest import WITHIN, wait_for
from tests.kraft.test_secure_cluster import partition_zero, produce_all, read_all, segment_batches
from tests.kraft.test_serve_broker_role import format_data_dir

KAFKA, KBROKER_1, KBROKER_2 = 1, 2, 3


def tls_settings(files: certs.GeneratedCerts) -> dict[str, str]:
    return {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(files.broker),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca),
    }


class SslKafkaBroker(ApacheKafkaBroker):
    """Kafka's broker with clients on PLAINTEXT and the other brokers on INTERNAL (SSL, a port chosen here)."""

    def __init__(self, directory: Path, controller: KafkaController, files: certs.GeneratedCerts) -> None:
        super().__init__(directory, controller, KAFKA, tls_settings(files))
        self.internal_port = free_port()

    def _properties(self) -> str:
        listeners = f"PLAINTEXT://{self.host}:{self.port},INTERNAL://{self.host}:{self.internal_port}"
        self.settings.update(
            {
                "listeners": listeners,
                "advertised.listeners": listeners,
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:SSL,CONTROLLER:PLAINTEXT",
                "inter.broker.listener.name": "INTERNAL",
            }
        )
        return super()._properties()


@pytest.fixture(scope="module")
def cluster(
    controller: KafkaController, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[int, tuple[Path, str]]]:
    """Each node's data directory and client bootstrap."""
    root = tmp_path_factory.mktemp("ssl-mixed")
    files = certs.generate(root / "certs", hosts=["localhost", "127.0.0.1"])
    kafka = SslKafkaBroker(root / "kafka", controller, files)
    kbrokers: list[BrokerProcess] = []
    try:
        try:
            kafka.start()
        except KafkaUnavailable as exc:
            pytest.skip(f"Apache Kafka cannot run here: {exc}")
        nodes = {KAFKA: (kafka.data_dir, kafka.bootstrap)}
        for node in (KBROKER_1, KBROKER_2):
            client, internal = free_port(), free_port()
            settings = {
                "process.roles": "broker",
                "node.id": str(node),
                "controller.quorum.bootstrap.servers": controller.bootstrap,
                "controller.listener.names": "CONTROLLER",
                # The client listener has the name of Kafka's: Metadata lists the brokers on the listener it came in on.
                "listeners": f"INTERNAL://127.0.0.1:{internal},PLAINTEXT://127.0.0.1:{client}",
                "listener.security.protocol.map": "INTERNAL:SSL,PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "inter.broker.listener.name": "INTERNAL",
                **tls_settings(files),
                "broker.heartbeat.interval.ms": "500",
                "offsets.topic.replication.factor": "1",
                "transaction.state.log.replication.factor": "1",
                "transaction.state.log.min.isr": "1",
            }
            data_dir = root / f"kbroker-{node}"
            format_data_dir(data_dir, controller.cluster_id, node)
            kbrokers.append(BrokerProcess(data_dir, settings).start(timeout=WITHIN))
            nodes[node] = (data_dir, f"127.0.0.1:{client}")
        yield nodes
    finally:
        for broker in kbrokers:
            broker.stop()
        kafka.stop()


@pytest.mark.parametrize(
    "replicas", [[KAFKA, KBROKER_1, KBROKER_2], [KBROKER_1, KAFKA, KBROKER_2]], ids=["kafka-leads", "kbroker-leads"]
)
def test_kafka_and_kbroker_replicate_from_each_other_over_ssl(
    cluster: dict[int, tuple[Path, str]], replicas: list[int]
) -> None:
    bootstrap = ",".join(address for _, address in cluster.values())
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wait_for("three brokers", lambda: sorted(admin.list_topics(timeout=10).brokers) == [1, 2, 3])
    topic = f"ssl-{'kafka' if replicas[0] == KAFKA else 'kbroker'}-leads"
    new = NewTopic(topic, num_partitions=1, replica_assignment=[replicas], config={"min.insync.replicas": "3"})
    admin.create_topics([new])[topic].result(WITHIN)
    wait_for("the leader", lambda: (p := partition_zero(admin, topic)) is not None and p.leader == replicas[0])
    values = [f"{topic}-{i}-".encode() * (1 + i % 5) for i in range(150)]
    # Each acknowledgement (min.insync.replicas=3) needs both followers to have fetched the batch over SSL.
    assert produce_all(bootstrap, topic, values) == [(0, offset) for offset in range(150)]
    expected = segment_batches(cluster[replicas[0]][0], topic)
    assert expected
    for node in replicas[1:]:
        wait_for(
            f"node {node} holding the leader's bytes",
            lambda n=node: segment_batches(cluster[n][0], topic) == expected,
        )
    in_sync = partition_zero(admin, topic)
    assert (in_sync.leader, in_sync.replicas, sorted(in_sync.isrs)) == (replicas[0], replicas, [1, 2, 3])
    assert read_all(bootstrap, topic, len(values)) == values
