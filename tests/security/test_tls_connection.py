"""TLS listeners end to end: kbroker certs' files, an SSL listener with mutual TLS and a SASL_SSL one.

The principal of an SSL connection is its certificate's DN (``User:CN=alice``): shown here through the authorizer,
which lets the super user alice create a topic and refuses bob, who has no ACL. Clients: the wire client, kafka-python
and confluent-kafka (librdkafka), each producing and consuming over TLS.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from kbroker.security import certs
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.sasl_authenticate_request import SaslAuthenticateRequest
from protocol.messages.sasl_handshake_request import SaslHandshakeRequest

PLAIN_JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_carol="carol-secret";'


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> certs.GeneratedCerts:
    return certs.generate(tmp_path_factory.mktemp("certs"), clients=["alice", "bob"])


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, files: certs.GeneratedCerts) -> Iterator[RunningBroker]:
    settings = {
        "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(files.broker),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca),
        "ssl.client.auth": "required",  # SSL only: SASL_SSL clients authenticate with SASL (Kafka's rule)
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": PLAIN_JAAS,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:CN=alice;User:carol;User:ANONYMOUS",
    }
    with RunningBroker(tmp_path_factory.mktemp("tls"), settings) as running:
        yield running


def client_context(files: certs.GeneratedCerts, client: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(files.ca))
    if client is not None:
        _pem, crt, key = files.clients[client]
        context.load_cert_chain(str(crt), str(key))
    return context


def create_topic(client: WireClient, name: str) -> int:
    topic = CreateTopicsRequest.CreatableTopic(name=name, num_partitions=1, replication_factor=1)
    answer = client.request(CreateTopicsRequest(topics=[topic], timeout_ms=5000), 7)
    return answer.topics[0].error_code


def test_mutual_tls_principal_is_the_certificate_dn(
    broker: RunningBroker, files: certs.GeneratedCerts, caplog: pytest.LogCaptureFixture
) -> None:
    with WireClient(broker.bootstrap_for("SSL"), ssl_context=client_context(files, "alice")) as alice:
        assert create_topic(alice, "tls-alice") == ErrorCode.NONE  # User:CN=alice is a super user
    with caplog.at_level("INFO", logger="kbroker.authorizer"):
        with WireClient(broker.bootstrap_for("SSL"), ssl_context=client_context(files, "bob")) as bob:
            # User:CN=bob has no ACL: neither the cluster's nor the topic's CREATE.
            assert create_topic(bob, "tls-bob") == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    # The refusals are in the broker's log, as Kafka's authorizer logs them.
    assert [r.getMessage() for r in caplog.records if r.name == "kbroker.authorizer"] == [
        "Principal = User:CN=bob is Denied operation = CREATE from host = 127.0.0.1 on resource = "
        "CLUSTER:kafka-cluster for request = CreateTopics",
        "Principal = User:CN=bob is Denied operation = CREATE from host = 127.0.0.1 on resource = TOPIC:tls-bob "
        "for request = CreateTopics",
    ]


def test_mutual_tls_refuses_a_client_without_a_certificate(broker: RunningBroker, files: certs.GeneratedCerts) -> None:
    with pytest.raises((ConnectionError, OSError)):
        with WireClient(broker.bootstrap_for("SSL"), ssl_context=client_context(files, None)) as anonymous:
            # TLS 1.3 reports the missing certificate after the handshake: at the first request at the latest.
            anonymous.request(MetadataRequest(topics=[], allow_auto_topic_creation=False), 12)


def test_a_plaintext_client_on_the_tls_listener_is_closed(broker: RunningBroker) -> None:
    with pytest.raises((ConnectionError, OSError)):
        with WireClient(broker.bootstrap_for("SSL"), timeout=5) as plaintext:
            plaintext.request(MetadataRequest(topics=[], allow_auto_topic_creation=False), 12)
    with WireClient(broker.bootstrap) as still_serving:
        assert still_serving.request(MetadataRequest(topics=[], allow_auto_topic_creation=False), 12).brokers


def test_sasl_ssl_authenticates_with_sasl_and_needs_no_client_certificate(
    broker: RunningBroker, files: certs.GeneratedCerts
) -> None:
    with WireClient(broker.bootstrap_for("SASL_SSL"), ssl_context=client_context(files, None)) as carol:
        assert carol.request(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == ErrorCode.NONE
        answer = carol.request(SaslAuthenticateRequest(auth_bytes=b"\0carol\0carol-secret"), 2)
        assert answer.error_code == ErrorCode.NONE
        assert create_topic(carol, "tls-carol") == ErrorCode.NONE  # User:carol, a super user


def test_kafka_python_over_mutual_tls(broker: RunningBroker, files: certs.GeneratedCerts) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    _pem, crt, key = files.clients["alice"]
    options = {
        "bootstrap_servers": broker.bootstrap_for("SSL"),
        "security_protocol": "SSL",
        "ssl_cafile": str(files.ca),
        "ssl_certfile": str(crt),
        "ssl_keyfile": str(key),
    }
    producer = KafkaProducer(**options)
    offsets = [producer.send("tls-kafka-python", f"v{n}".encode()).get(10).offset for n in range(3)]
    producer.close()
    assert offsets == [0, 1, 2]
    consumer = KafkaConsumer("tls-kafka-python", auto_offset_reset="earliest", consumer_timeout_ms=5000, **options)
    assert [record.value for record in consumer] == [b"v0", b"v1", b"v2"]
    consumer.close()


def test_confluent_kafka_over_mutual_tls(broker: RunningBroker, files: certs.GeneratedCerts) -> None:
    from confluent_kafka import Consumer, Producer

    _pem, crt, key = files.clients["alice"]
    options = {
        "bootstrap.servers": broker.bootstrap_for("SSL"),
        "security.protocol": "SSL",
        "ssl.ca.location": str(files.ca),
        "ssl.certificate.location": str(crt),
        "ssl.key.location": str(key),
    }
    producer = Producer(options)
    delivered: list[int] = []
    for n in range(3):
        producer.produce(
            "tls-librdkafka", f"v{n}".encode(), on_delivery=lambda err, msg: delivered.append(msg.offset())
        )
    assert producer.flush(15) == 0
    assert delivered == [0, 1, 2]
    consumer = Consumer({**options, "group.id": "tls-group", "auto.offset.reset": "earliest"})
    consumer.subscribe(["tls-librdkafka"])
    values: list[bytes] = []
    for _ in range(60):
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            values.append(message.value())
        if len(values) == 3:
            break
    consumer.close()
    assert values == [b"v0", b"v1", b"v2"]


def test_a_tls_listener_without_a_key_store_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="listener SSL \\(SSL\\): ssl.keystore.location: an SSL listener needs"):
        RunningBroker(tmp_path, {"listeners": "SSL://127.0.0.1:0"}).start()


def test_the_broker_ends_a_tls_connection_with_close_notify(broker: RunningBroker, files: certs.GeneratedCerts) -> None:
    import socket

    host, _, port = broker.bootstrap_for("SSL").rpartition(":")
    raw = socket.create_connection((host, int(port)), timeout=10)
    # suppress_ragged_eofs=False: a socket closed without close_notify would raise SSLEOFError here.
    with client_context(files, "alice").wrap_socket(raw, server_hostname=host, suppress_ragged_eofs=False) as tls:
        tls.sendall((-5).to_bytes(4, "big", signed=True))  # a frame size no broker accepts: it closes
        assert tls.recv(100) == b""
