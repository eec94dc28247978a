"""A secured cluster: Apache Kafka's controller on a SASL_PLAINTEXT listener (PLAIN), and three kbroker brokers
that reach it with SASL and each other over SASL_SSL (SCRAM-SHA-512, the credential created through the
controller), verifying certificates against the trust store and their host names. Clients use a PLAINTEXT
listener of their own.

A partition with three replicas and min.insync.replicas=3 answers acks=all only once both followers fetched the
batch over the secured inter-broker listener; then every replica holds the leader's batches byte for byte and the
ISR is full. A fourth broker whose inter-broker password is wrong gets nothing, drops out of its partition's ISR,
and says why in its log.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from compat.apache_kafka import KafkaController
from kbroker.kraft.local_cluster import free_port
from kbroker.security import certs
from kbroker.testing import BrokerProcess
from protocol.exceptions import DecodeError
from protocol.records import iter_batches
from tests.kraft.conftest import WITHIN, broker_role_settings, running_controller, wait_for
from tests.kraft.test_serve_broker_role import format_data_dir

PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
CONTROLLER_JAAS = (
    f'{PLAIN_MODULE} required username="controller" password="controller-secret" '
    'user_controller="controller-secret" user_broker="broker-secret";'
)
BROKER_SECRET = "inter-broker-secret"
WRONG_PASSWORD = 4  # the node that logs in to the other brokers with a wrong password


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaController]:
    """Kafka's controller, its listener SASL_PLAINTEXT with PLAIN (its own Raft client logs in as controller)."""
    secured = {
        "listener.security.protocol.map": "CONTROLLER:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN",
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": CONTROLLER_JAAS,
    }
    with running_controller(tmp_path_factory.mktemp("secured-controller"), secured) as running:
        yield running


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> certs.GeneratedCerts:
    return certs.generate(tmp_path_factory.mktemp("certs"), hosts=["localhost", "127.0.0.1"])


def broker_settings(
    controller: KafkaController, files: certs.GeneratedCerts, node: int, ports: tuple[int, int], password: str
) -> dict[str, str]:
    client, internal = ports
    return {
        **broker_role_settings(controller, node),
        "listeners": f"INTERNAL://127.0.0.1:{internal},CLIENT://127.0.0.1:{client}",
        "listener.security.protocol.map": "INTERNAL:SASL_SSL,CLIENT:PLAINTEXT,CONTROLLER:SASL_PLAINTEXT",
        "inter.broker.listener.name": "INTERNAL",
        # To the controller: PLAIN as User:broker.
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": (
            f'{PLAIN_MODULE} required username="broker" password="broker-secret";'
        ),
        # Between brokers: SCRAM-SHA-512 over TLS, the certificates checked against the CA and 127.0.0.1.
        "listener.name.internal.sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
        "listener.name.internal.scram-sha-512.sasl.jaas.config": (
            f'{SCRAM_MODULE} required username="broker" password="{password}";'
        ),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(files.broker),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca),
        "replica.lag.time.max.ms": "10000",  # node 4 leaves the ISR sooner than after 30 s
    }


@pytest.fixture(scope="module")
def brokers(
    controller: KafkaController, files: certs.GeneratedCerts, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[int, tuple[BrokerProcess, str]]]:
    """Nodes 1 to 4, each with its client bootstrap; node 4 logs in to the others with a wrong SCRAM password."""
    root = tmp_path_factory.mktemp("secured-brokers")
    started: dict[int, tuple[BrokerProcess, str]] = {}
    try:
        for node in (1, 2, 3, 4):
            ports = (free_port(), free_port())
            password = BROKER_SECRET if node != WRONG_PASSWORD else "not-the-secret"
            format_data_dir(root / f"broker-{node}", controller.cluster_id, node)
            broker = BrokerProcess(
                root / f"broker-{node}",
                broker_settings(controller, files, node, ports, password),
                log_level="INFO",
            )
            started[node] = (broker.start(timeout=WITHIN), f"127.0.0.1:{ports[0]}")
        yield started
    finally:
        for broker, _ in started.values():
            broker.stop()


def segment_batches(data_dir: Path, topic: str) -> list[bytes]:
    """Each batch in the broker's segment files of partition 0, as the bytes stored."""
    batches: list[bytes] = []
    for segment in sorted((data_dir / f"{topic}-0").glob("*.log")):
        try:
            batches += [bytes(batch) for _, batch in iter_batches(segment.read_bytes())]
        except DecodeError:  # a batch being written as the file is read
            pass
    return batches


def partition_zero(admin: AdminClient, topic: str) -> Any:
    described = admin.list_topics(topic, timeout=10).topics.get(topic)
    if described is None or described.error is not None or 0 not in described.partitions:
        return None
    return described.partitions[0]


def produce_all(bootstrap: str, topic: str, values: list[bytes]) -> list[tuple[int, int]]:
    """acks=all, one record at a time in order: each record's (partition, offset), or the test fails."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5})
    delivered: list[tuple[int, int]] = []
    errors: list[str] = []

    def report(error: Any, message: Any) -> None:
        if error is not None:
            errors.append(str(error))
        else:
            delivered.append((message.partition(), message.offset()))

    for index, value in enumerate(values):
        producer.produce(topic, value=value, key=str(index).encode(), partition=0, on_delivery=report)
    assert producer.flush(WITHIN) == 0
    assert errors == []
    return delivered


def read_all(bootstrap: str, topic: str, count: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-reader", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    read: list[bytes] = []
    deadline = time.monotonic() + WITHIN
    while len(read) < count and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            read.append(message.value())
    consumer.close()
    return read


def registered_with_credential(brokers: dict[int, tuple[BrokerProcess, str]]) -> tuple[str, AdminClient]:
    """The cluster's client bootstrap and an admin client, once all four brokers are registered and unfenced
    (through the SASL controller listener) and the inter-broker SCRAM-SHA-512 credential is the controller's
    (AlterUserScramCredentials)."""
    bootstrap = ",".join(address for _, address in brokers.values())
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wait_for("four brokers", lambda: sorted(admin.list_topics(timeout=10).brokers) == [1, 2, 3, 4])
    upsert = UserScramCredentialUpsertion(
        "broker", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), BROKER_SECRET.encode(), b"salt-salt"
    )
    admin.alter_user_scram_credentials([upsert])["broker"].result(WITHIN)
    return bootstrap, admin


def test_replication_over_sasl_ssl_with_controllers_over_sasl(
    controller: KafkaController, brokers: dict[int, tuple[BrokerProcess, str]]
) -> None:
    bootstrap, admin = registered_with_credential(brokers)
    topic = "secured"
    new = NewTopic(topic, num_partitions=1, replica_assignment=[[1, 2, 3]], config={"min.insync.replicas": "3"})
    admin.create_topics([new])[topic].result(WITHIN)
    wait_for("a leader", lambda: (p := partition_zero(admin, topic)) is not None and p.leader == 1)
    values = [f"record-{i}-".encode() * (1 + i % 7) for i in range(200)]
    # min.insync.replicas=3: each acknowledgement means both followers fetched the batch over SASL_SSL.
    assert produce_all(bootstrap, topic, values) == [(0, offset) for offset in range(200)]
    expected = segment_batches(brokers[1][0].data_dir, topic)
    assert expected
    for node in (2, 3):
        wait_for(
            f"node {node} holding the leader's bytes",
            lambda n=node: segment_batches(brokers[n][0].data_dir, topic) == expected,
        )
    in_sync = partition_zero(admin, topic)
    assert (in_sync.leader, in_sync.replicas, sorted(in_sync.isrs)) == (1, [1, 2, 3], [1, 2, 3])
    assert read_all(bootstrap, topic, len(values)) == values


def test_a_broker_with_a_wrong_inter_broker_password_stays_out_of_the_isr(
    controller: KafkaController, brokers: dict[int, tuple[BrokerProcess, str]]
) -> None:
    bootstrap, admin = registered_with_credential(brokers)
    topic = "locked-out"
    new = NewTopic(
        topic, num_partitions=1, replica_assignment=[[1, 2, WRONG_PASSWORD]], config={"min.insync.replicas": "2"}
    )
    admin.create_topics([new])[topic].result(WITHIN)
    wait_for("a leader", lambda: (p := partition_zero(admin, topic)) is not None and p.leader == 1)
    values = [f"locked-{i}".encode() for i in range(20)]
    assert produce_all(bootstrap, topic, values) == [(0, offset) for offset in range(20)]
    shrunk = wait_for(
        f"node {WRONG_PASSWORD} out of the ISR",
        lambda: p if (p := partition_zero(admin, topic)) is not None and sorted(p.isrs) == [1, 2] else None,
    )
    assert shrunk.replicas == [1, 2, WRONG_PASSWORD]
    assert segment_batches(brokers[WRONG_PASSWORD][0].data_dir, topic) == []
    assert segment_batches(brokers[2][0].data_dir, topic) == segment_batches(brokers[1][0].data_dir, topic) != []
    log = brokers[WRONG_PASSWORD][0].log_path.read_text()
    assert "SASL SCRAM-SHA-512 authentication as 'broker' failed: Authentication failed" in log
    assert "Traceback" not in log


def test_a_refused_controller_login_or_a_bad_setting_stops_the_broker_in_one_line(
    controller: KafkaController, files: certs.GeneratedCerts, tmp_path: Path
) -> None:
    settings = broker_settings(controller, files, 9, (free_port(), free_port()), BROKER_SECRET)
    wrong = {
        **settings,
        "listener.name.controller.plain.sasl.jaas.config": f'{PLAIN_MODULE} required username="broker" password="x";',
        "initial.broker.registration.timeout.ms": "3000",
    }
    format_data_dir(tmp_path / "wrong", controller.cluster_id, 9)
    with pytest.raises(RuntimeError) as refused:
        BrokerProcess(tmp_path / "wrong", wrong).start(timeout=WITHIN)
    assert (
        f"registered broker 9 within 3 s (initial.broker.registration.timeout.ms; is the controller quorum running, "
        f"and are these its controller listeners?); last failure: {controller.bootstrap}: SASL PLAIN authentication "
        "as 'broker' failed: Authentication failed: Invalid username or password"
    ) in str(refused.value)
    assert "Traceback" not in str(refused.value)

    gssapi = {key: value for key, value in settings.items() if key != "sasl.mechanism.controller.protocol"}
    format_data_dir(tmp_path / "gssapi", controller.cluster_id, 9)
    with pytest.raises(RuntimeError) as bad:
        BrokerProcess(tmp_path / "gssapi", gssapi).start(timeout=WITHIN)
    assert (
        "kbroker: configuration error: controller listener CONTROLLER is SASL_PLAINTEXT and "
        "sasl.mechanism.controller.protocol=GSSAPI: kbroker logs in to other nodes with PLAIN, SCRAM-SHA-256, "
        "SCRAM-SHA-512 (Kafka's default GSSAPI needs Kerberos)"
    ) in str(bad.value)
    assert "Traceback" not in str(bad.value)
