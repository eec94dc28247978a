"""The confluent-kafka compat adapter (compat/clients/confluent.py) reports SASL_AUTHENTICATION_FAILED only for an
authentication the broker refused.

librdkafka also hands error_cb an _AUTHENTICATION error when it drops one of its own connections while that
connection's SaslHandshake is unanswered: it forgets a group coordinator it was connecting to (the consumer
closes, or a FindCoordinator answers COORDINATOR_NOT_AVAILABLE), and the handshake request fails locally ("SASL
PLAIN mechanism handshake failed: Local: Broker transport failure"). The adapter keeps error_cb's errors for the
life of its process, so such an error, left by the consumer that read a round trip back, made a later refused
produce report SASL_AUTHENTICATION_FAILED instead of TOPIC_AUTHORIZATION_FAILED
(compat/test_security.py::test_deny_overrides_allow, once under load). The error below is librdkafka 2.16's, word
for word, from a broker that held the coordinator connection's SaslHandshake answer and then answered
FindCoordinator COORDINATOR_NOT_AVAILABLE.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer

from compat.clients.api import SECURITY_ENV, ClientError
from compat.clients.confluent import ConfluentAdapter
from compat.security import STANDARD_AUTHORIZER, Acl, create_acls, jaas_plain
from kbroker.security.acls import AclOperation, AclPermissionType, PatternType, ResourceType
from kbroker.testing import RunningBroker

BOB = ("bob", "bob-secret")


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[RunningBroker]:
    jaas = jaas_plain((BOB,))
    settings = {
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
        "authorizer.class.name": STANDARD_AUTHORIZER,
        "super.users": "User:ANONYMOUS",  # the PLAINTEXT listener sets things up
        "allow.everyone.if.no.acl.found": "false",
    }
    with RunningBroker(tmp_path / "data", settings) as broker:
        yield broker


def grant_all_but_writes_to(denied: str, broker: RunningBroker) -> str:
    """bob may do anything with the family- topics and compat- groups, except write to ``denied`` (made here)."""
    produce_plaintext(broker, denied, "from the super user")  # auto-created
    create_acls(
        broker.bootstrap_for("PLAINTEXT"),
        [
            Acl(f"User:{BOB[0]}", ResourceType.TOPIC, "family-", AclOperation.ALL, pattern=PatternType.PREFIXED),
            Acl(f"User:{BOB[0]}", ResourceType.TOPIC, denied, AclOperation.WRITE, AclPermissionType.DENY),
            Acl(f"User:{BOB[0]}", ResourceType.GROUP, "compat-", AclOperation.ALL, pattern=PatternType.PREFIXED),
        ],
    )
    return denied


def bob_adapter(broker: RunningBroker, monkeypatch: pytest.MonkeyPatch, password: str = BOB[1]) -> ConfluentAdapter:
    security = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"}
    security.update(sasl_username=BOB[0], sasl_password=password)
    monkeypatch.setenv(SECURITY_ENV, json.dumps(security))
    return ConfluentAdapter(broker.bootstrap_for("SASL_PLAINTEXT"))


def denied_produce(adapter: ConfluentAdapter, topic: str) -> str:
    """The error name of a produce to ``topic`` (which must fail)."""
    producer = adapter.producer_open({})
    try:
        with pytest.raises(ClientError) as refused:
            adapter.producer_send(producer, topic, [{"key": "k", "value": "no", "partition": 0}])
    finally:
        adapter.shutdown()
    return refused.value.error


def produce_plaintext(broker: RunningBroker, topic: str, value: str) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap_for("PLAINTEXT")})
    producer.produce(topic, value.encode(), partition=0)
    assert producer.flush(20) == 0


def test_a_dropped_handshake_reported_earlier_does_not_turn_a_refused_produce_into_an_authentication_failure(
    secured: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CI failure itself: the error librdkafka reported for the coordinator connection of the consumer that
    read a round trip back (its exact words) is in the adapter's list when a produce is refused."""
    denied = grant_all_but_writes_to("family-shut", secured)
    adapter = bob_adapter(secured, monkeypatch)
    dropped = "GroupCoordinator: SASL PLAIN mechanism handshake failed: Local: Broker transport failure: broker's "
    dropped += "supported mechanisms: (n/a) (after 0ms in state DOWN)"
    adapter.errors.append(KafkaError(KafkaError._AUTHENTICATION, dropped))
    assert denied_produce(adapter, denied) == "TOPIC_AUTHORIZATION_FAILED"


def test_a_wrong_password_is_still_a_refused_authentication(
    secured: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapter = bob_adapter(secured, monkeypatch, password="not-" + BOB[1])
    producer = adapter.producer_open({})
    try:
        with pytest.raises(ClientError) as refused:
            adapter.producer_send(producer, "family-open", [{"key": "k", "value": "no", "partition": 0}])
    finally:
        adapter.shutdown()
    assert refused.value.error == "SASL_AUTHENTICATION_FAILED"
    assert "Invalid username or password" in refused.value.message
