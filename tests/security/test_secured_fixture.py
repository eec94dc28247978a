"""A secured broker from the test fixtures, in both modes: ``kafka_broker_factory`` with a SASL_PLAINTEXT listener
(the overrides are Kafka's keys), its ``bootstrap`` the SASL listener, and a client with the right password in."""

from __future__ import annotations

import pytest

from kbroker.pytest_plugin import KafkaBrokerFactory

SECURED = {
    "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
    "sasl.enabled.mechanisms": "PLAIN",
    "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
        'org.apache.kafka.common.security.plain.PlainLoginModule required user_app="app-secret";'
    ),
}


@pytest.mark.parametrize("mode", ["thread", "subprocess"])
def test_a_sasl_broker_from_the_factory(kafka_broker_factory: KafkaBrokerFactory, mode: str) -> None:
    from kafka import KafkaProducer

    broker = kafka_broker_factory(SECURED, mode=mode)
    producer = KafkaProducer(
        bootstrap_servers=broker.bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="app",
        sasl_plain_password="app-secret",
    )
    assert producer.send("secured-fixture", b"v").get(10).offset == 0
    producer.close()
