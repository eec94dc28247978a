"""The SASL exchange on the wire (kbroker/security/authenticator.py through kbroker/server/connection.py).

Exact requests to a broker with a SASL_PLAINTEXT listener (PLAIN and SCRAM-SHA-256 enabled) and a PLAINTEXT one:
what is allowed before authentication, what each failure answers and that the connection then ends, SaslHandshake
v0's raw tokens, and KIP-368's session lifetime and re-authentication.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.sasl_authenticate_request import SaslAuthenticateRequest
from protocol.messages.sasl_handshake_request import SaslHandshakeRequest

PLAIN_JAAS = (
    'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret" user_bob="bob-secret";'
)
REAUTH_MS = 1500


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    settings = {
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,REAUTH://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,REAUTH:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
        "listener.name.reauth.plain.sasl.jaas.config": PLAIN_JAAS,
        "listener.name.reauth.connections.max.reauth.ms": str(REAUTH_MS),
        "sasl.server.max.receive.size": "4096",
        "connection.failed.authentication.delay.ms": "0",
    }
    with RunningBroker(tmp_path_factory.mktemp("sasl"), settings) as running:
        yield running


def api_versions() -> ApiVersionsRequest:
    return ApiVersionsRequest(client_software_name="wire-test", client_software_version="1")


def metadata() -> MetadataRequest:
    return MetadataRequest(topics=[], allow_auto_topic_creation=False)


def plain_token(user: str, password: str, authzid: str = "") -> bytes:
    return f"{authzid}\0{user}\0{password}".encode()


def authenticate(client: WireClient, user: str = "alice", password: str = "alice-secret", version: int = 2):  # noqa: ANN201
    handshake = client.request(SaslHandshakeRequest(mechanism="PLAIN"), 1)
    assert handshake.error_code == ErrorCode.NONE
    return client.request(SaslAuthenticateRequest(auth_bytes=plain_token(user, password)), version)


def assert_closed(client: WireClient) -> None:
    with pytest.raises((ConnectionError, OSError)):
        client.request(metadata(), 12)


def test_plain_authentication_then_requests(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap_for("SASL_PLAINTEXT")) as client:
        versions = client.request(api_versions(), 3)  # allowed once, before the handshake
        assert versions.error_code == ErrorCode.NONE
        assert {17, 36} <= {api.api_key for api in versions.api_keys}
        handshake = client.request(SaslHandshakeRequest(mechanism="PLAIN"), 1)
        assert (handshake.error_code, handshake.mechanisms) == (ErrorCode.NONE, ["PLAIN", "SCRAM-SHA-256"])
        answer = client.request(SaslAuthenticateRequest(auth_bytes=plain_token("alice", "alice-secret")), 2)
        assert (answer.error_code, answer.error_message, answer.auth_bytes, answer.session_lifetime_ms) == (
            ErrorCode.NONE,
            "",
            b"",
            0,
        )
        assert client.request(metadata(), 12).brokers  # authenticated: the ordinary pipeline
        # No session lifetime: a SaslAuthenticate now is an ordinary request, refused as Kafka refuses it.
        again = client.request(SaslAuthenticateRequest(auth_bytes=b"x"), 2)
        assert (again.error_code, again.error_message) == (
            ErrorCode.ILLEGAL_SASL_STATE,
            "SaslAuthenticate request received after successful authentication",
        )
        assert client.request(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == ErrorCode.ILLEGAL_SASL_STATE
        assert client.request(metadata(), 12).brokers


def test_a_request_before_the_handshake_closes_the_connection(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap_for("SASL_PLAINTEXT")) as client:
        assert_closed(client)


def test_a_second_api_versions_before_the_handshake_closes_the_connection(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap_for("SASL_PLAINTEXT")) as client:
        client.request(api_versions(), 3)
        with pytest.raises((ConnectionError, OSError)):
            client.request(api_versions(), 3)


def test_a_request_during_authentication_is_refused_then_closed(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap_for("SASL_PLAINTEXT")) as client:
        assert client.request(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == ErrorCode.NONE
        answer = client.request(metadata(), 12)  # Kafka answers it with ILLEGAL_SASL_STATE, then closes
        assert [topic.error_code for topic in answer.topics] == []
        assert_closed(client)


def test_an_unsupported_mechanism_is_answered_with_the_enabled_ones_then_closed(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap_for("SASL_PLAINTEXT")) as client:
        answer = client.request(SaslHandshakeRequest(mechanism="GSSAPI"), 1)
        assert (answer.error_code, answer.mechanisms) == (
            ErrorCode.UNSUPPORTED_SASL_MECHANISM,
            ["PLAIN", "SCRAM-SHA-256"],
        )
        assert_closed(client)


@pytest.mark.parametrize(
    ("user", "password"),
    [("alice", "wrong"), ("mallory", "alice-secret")],
    ids=["wrong password", "unknown user"],
)
def test_a_failed_authentication_is_answered_then_closed(broker: RunningBroker, user: str, password: str) -> None:
    with WireClient(broker.bootstrap_for("SASL_PLAINTEXT")) as client:
        answer = authenticate(client, user, password)
        assert (answer.error_code, answer.error_message) == (
            ErrorCode.SASL_AUTHENTICATION_FAILED,
            "Authentication failed: Invalid username or password",
        )
        assert_closed(client)


def test_handshake_v0_exchanges_raw_tokens(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap_for("SASL_PLAINTEXT")) as client:
        assert client.request(SaslHandshakeRequest(mechanism="PLAIN"), 0).error_code == ErrorCode.NONE
        assert client.exchange_token(plain_token("bob", "bob-secret")) == b""
        assert client.request(metadata(), 12).brokers
    with WireClient(broker.bootstrap_for("SASL_PLAINTEXT")) as client:
        client.request(SaslHandshakeRequest(mechanism="PLAIN"), 0)
        with pytest.raises((ConnectionError, OSError)):  # a v0 failure has no answer: the connection just ends
            client.exchange_token(plain_token("bob", "wrong"))


def test_a_frame_above_sasl_server_max_receive_size_before_authentication_closes(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap_for("SASL_PLAINTEXT")) as client:
        client.request(SaslHandshakeRequest(mechanism="PLAIN"), 1)
        with pytest.raises((ConnectionError, OSError)):
            client.request(SaslAuthenticateRequest(auth_bytes=plain_token("alice", "x" * 5000)), 2)
    with WireClient(broker.bootstrap_for("SASL_PLAINTEXT")) as client:  # after authentication, any size
        authenticate(client)
        topics = [MetadataRequest.MetadataRequestTopic(name=f"{n:03}" + "t" * 200) for n in range(30)]  # 6 KB
        answer = client.request(MetadataRequest(topics=topics, allow_auto_topic_creation=False), 12)
        assert [topic.error_code for topic in answer.topics] == [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION] * 30


def test_the_plaintext_listener_refuses_sasl_requests(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap) as client:
        answer = client.request(SaslHandshakeRequest(mechanism="PLAIN"), 1)
        assert (answer.error_code, answer.mechanisms) == (ErrorCode.ILLEGAL_SASL_STATE, [])
        assert client.request(metadata(), 12).brokers


def test_session_lifetime_and_reauthentication(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap_for("REAUTH")) as client:
        first = authenticate(client)
        assert (first.error_code, first.session_lifetime_ms) == (ErrorCode.NONE, REAUTH_MS)
        # Re-authenticating as the same user renews the session (the first re-authentication may come at once).
        renewed = authenticate(client)
        assert (renewed.error_code, renewed.session_lifetime_ms) == (ErrorCode.NONE, REAUTH_MS)
        assert client.request(metadata(), 12).brokers
        # A second one within a second of the last is an ordinary request: ILLEGAL_SASL_STATE, session unchanged.
        assert client.request(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == ErrorCode.ILLEGAL_SASL_STATE
        time.sleep(REAUTH_MS / 1000 + 0.3)
        assert_closed(client)  # the session expired: the next request ends the connection


def test_reauthentication_cannot_change_the_principal_or_the_mechanism(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap_for("REAUTH")) as client:
        authenticate(client)
        answer = authenticate(client, "bob", "bob-secret")
        assert (answer.error_code, answer.error_message) == (
            ErrorCode.SASL_AUTHENTICATION_FAILED,
            "Cannot change principals during re-authentication from User.alice: User.bob",
        )
        assert_closed(client)
    with WireClient(broker.bootstrap_for("REAUTH")) as client:
        authenticate(client)
        # Kafka accepts the handshake, then ends the exchange at the next token.
        assert client.request(SaslHandshakeRequest(mechanism="SCRAM-SHA-256"), 1).error_code == ErrorCode.NONE
        with pytest.raises((ConnectionError, OSError)):
            client.request(SaslAuthenticateRequest(auth_bytes=b"n,,n=alice,r=abc"), 2)


def test_kafka_python_authenticates_with_plain(broker: RunningBroker, tmp_path: Path) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    options = {
        "bootstrap_servers": broker.bootstrap_for("SASL_PLAINTEXT"),
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "alice",
        "sasl_plain_password": "alice-secret",
    }
    producer = KafkaProducer(**options)
    sent = [producer.send("sasl-plain", f"record {n}".encode()).get(10).offset for n in range(3)]
    producer.close()
    assert sent == [0, 1, 2]
    consumer = KafkaConsumer("sasl-plain", auto_offset_reset="earliest", consumer_timeout_ms=5000, **options)
    assert [record.value for record in consumer] == [b"record 0", b"record 1", b"record 2"]
    consumer.close()
