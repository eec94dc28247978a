"""OAUTHBEARER with Kafka's unsecured JWS validator on a live listener: a token's ``exp`` bounds the session
(KIP-368: the shorter of the token's life and connections.max.reauth.ms), an expired or under-scoped token is
refused with Kafka's JSON challenge, and librdkafka's built-in unsecured token logs in and produces."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from kbroker.security.sasl.oauthbearer import unsecured_token
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.sasl_authenticate_request import SaslAuthenticateRequest
from protocol.messages.sasl_handshake_request import SaslHandshakeRequest

JAAS = (
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
    'unsecuredValidatorRequiredScope="kafka";'
)
MAX_REAUTH_MS = 600_000


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    settings = {
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "sasl.enabled.mechanisms": "OAUTHBEARER",
        "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config": JAAS,
        "connections.max.reauth.ms": str(MAX_REAUTH_MS),
        "connection.failed.authentication.delay.ms": "0",
    }
    with RunningBroker(tmp_path_factory.mktemp("oauth"), settings) as running:
        yield running


def bearer(claims: dict[str, object]) -> bytes:
    return f"n,,\x01auth=Bearer {unsecured_token(claims)}\x01\x01".encode()


def login(broker: RunningBroker, claims: dict[str, object]) -> tuple[WireClient, object]:
    client = WireClient(broker.bootstrap_for("SASL_PLAINTEXT"))
    assert client.request(SaslHandshakeRequest(mechanism="OAUTHBEARER"), 1).error_code == ErrorCode.NONE
    return client, client.request(SaslAuthenticateRequest(auth_bytes=bearer(claims)), 2)


def test_the_token_expiry_bounds_the_session(broker: RunningBroker) -> None:
    now = int(time.time())  # issued a little before now: an iat later in this very millisecond is "in the future"
    client, answer = login(broker, {"sub": "alice", "iat": now - 10, "exp": now + 120, "scope": "kafka"})
    with client:
        assert answer.error_code == ErrorCode.NONE
        # About 120 s (the token), not connections.max.reauth.ms's 600 s.
        assert 110_000 <= answer.session_lifetime_ms <= 120_000
        assert client.request(MetadataRequest(topics=[], allow_auto_topic_creation=False), 12).brokers


@pytest.mark.parametrize(
    ("claims", "challenge"),
    [
        ({"sub": "alice", "iat": 1, "exp": 2, "scope": "kafka"}, '{"status":"invalid_token"}'),
        # "iat"/"exp" relative to the test's start, not to collection (a long suite would expire the token)
        ({"sub": "alice", "iat": 0, "exp": 60}, '{"status":"insufficient_scope", "scope":"[kafka]"}'),
    ],
    ids=["expired", "missing scope"],
)
def test_a_bad_token_gets_the_json_challenge_then_fails(
    broker: RunningBroker, claims: dict[str, object], challenge: str
) -> None:
    if claims["iat"] == 0:  # whole seconds, issued a little before: an iat in this very millisecond is "after now"
        now = int(time.time())
        claims = {**claims, "iat": now - 10, "exp": now + 60}
    client, answer = login(broker, claims)
    with client:
        assert (answer.error_code, answer.auth_bytes.decode()) == (ErrorCode.NONE, challenge)
        final = client.request(SaslAuthenticateRequest(auth_bytes=b"\x01"), 2)
        assert (final.error_code, final.error_message) == (ErrorCode.SASL_AUTHENTICATION_FAILED, challenge)


def test_librdkafka_unsecured_token_produces(broker: RunningBroker) -> None:
    from confluent_kafka import Producer

    delivered: list[int] = []
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap_for("SASL_PLAINTEXT"),
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER",
            "sasl.oauthbearer.config": "principal=alice scope=kafka",
            "enable.sasl.oauthbearer.unsecure.jwt": True,
        }
    )
    producer.produce("oauth-topic", b"v", on_delivery=lambda err, msg: delivered.append(msg.offset()))
    assert producer.flush(15) == 0
    assert delivered == [0]
