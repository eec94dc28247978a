"""A broker's own connections to other nodes (kbroker/kraft/node_security.py and channel.py's NodeChannel):
which listener, protocol, mechanism and credentials Kafka's settings choose, checked in one line at start-up,
and the client side of TLS and SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) against kbroker's own listeners.

The listeners authorize with StandardAuthorizer and one super user, ``User:broker``: a topic created through a
NodeChannel proves the connection was authenticated as that user, one created as ``User:other`` is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from kbroker.config import BrokerConfig, ConfigError
from kbroker.kraft.channel import ChannelError, NodeChannel
from kbroker.kraft.node_security import NodeSecurity, cluster_security, controller_security, inter_broker_security
from kbroker.security import certs
from kbroker.testing import RunningBroker
from protocol.errors import ErrorCode
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.create_topics_response import CreateTopicsResponse

PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
# The inter-broker PLAIN entry: the users this listener serves and the one this broker logs in as.
PLAIN_JAAS = (
    f'{PLAIN_MODULE} required username="broker" password="broker-secret" '
    'user_broker="broker-secret" user_other="other-secret";'
)
SCRAM_USERS = [("broker", "broker-secret"), ("other", "other-secret")]
QUORUM = {
    "process.roles": "broker",
    "node.id": "1",
    "controller.quorum.bootstrap.servers": "127.0.0.1:9093",
    "controller.listener.names": "CONTROLLER",
}


def jaas(module: str, user: str, password: str) -> str:
    return f'{module} required username="{user}" password="{password}";'


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> certs.GeneratedCerts:
    return certs.generate(tmp_path_factory.mktemp("certs"), hosts=["localhost", "127.0.0.1"])


@pytest.fixture(scope="module")
def stores(files: certs.GeneratedCerts) -> dict[str, str]:
    return {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(files.broker),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca),
    }


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, stores: dict[str, str]) -> Iterator[RunningBroker]:
    settings = {
        "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        **stores,
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": PLAIN_JAAS,
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
        "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:broker;User:ANONYMOUS",
        "connection.failed.authentication.delay.ms": "0",
    }
    with RunningBroker(tmp_path_factory.mktemp("node-security"), settings) as running:
        assert running.broker is not None
        running.call(running.broker.configure_sasl_users, SCRAM_USERS)
        yield running


def create_topic(broker: RunningBroker, listener: str, security: NodeSecurity, topic: str) -> int:
    """CreateTopics through a NodeChannel to ``listener``: its error code (ChannelError if it cannot connect)."""
    host, _, port = broker.bootstrap_for(listener).rpartition(":")

    async def main() -> int:
        channel = NodeChannel(host, int(port), client_id="node-security-test", security=security)
        try:
            request = CreateTopicsRequest(
                topics=[CreateTopicsRequest.CreatableTopic(name=topic, num_partitions=1, replication_factor=1)],
                timeout_ms=10_000,
            )
            answer = await channel.request(request)
            assert isinstance(answer, CreateTopicsResponse)
            return answer.topics[0].error_code
        finally:
            await channel.aclose()

    return trio.run(main)


def inter_broker(listener: str, extra: dict[str, str]) -> NodeSecurity:
    """The inter-broker security of a broker configured like Kafka's with ``extra``."""
    settings = {**QUORUM, "listeners": f"{listener}://127.0.0.1:0", "inter.broker.listener.name": listener}
    return inter_broker_security(BrokerConfig({**settings, **extra}))


# --- the client handshakes against kbroker's listeners ---------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_ssl_logs_in_with_each_mechanism(broker: RunningBroker, stores: dict[str, str], mechanism: str) -> None:
    module = PLAIN_MODULE if mechanism == "PLAIN" else SCRAM_MODULE
    settings = {
        **stores,
        "sasl.enabled.mechanisms": mechanism,
        "sasl.mechanism.inter.broker.protocol": mechanism,
        f"listener.name.sasl_ssl.{mechanism.lower()}.sasl.jaas.config": jaas(module, "broker", "broker-secret"),
    }
    security = inter_broker("SASL_SSL", settings)
    assert (security.protocol, security.sasl_mechanism, security.username) == ("SASL_SSL", mechanism, "broker")
    assert security.ssl_context is not None and security.ssl_context.check_hostname
    topic = f"over-sasl-ssl-{mechanism.lower()}"
    assert create_topic(broker, "SASL_SSL", security, topic) == ErrorCode.NONE
    # The same listener, another user: authenticated, and refused by the authorizer as User:other.
    other = security._replace(username="other", password="other-secret")
    assert create_topic(broker, "SASL_SSL", other, topic + "-other") == ErrorCode.TOPIC_AUTHORIZATION_FAILED


def test_sasl_plaintext_scram_and_a_wrong_password(broker: RunningBroker) -> None:
    settings = {
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
        "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": jaas(SCRAM_MODULE, "broker", "broker-secret"),
    }
    security = inter_broker("SASL_PLAINTEXT", settings)
    assert security.ssl_context is None
    assert create_topic(broker, "SASL_PLAINTEXT", security, "over-sasl-plaintext") == ErrorCode.NONE
    with pytest.raises(ChannelError) as refused:
        create_topic(broker, "SASL_PLAINTEXT", security._replace(password="wrong"), "never")
    assert "SASL SCRAM-SHA-512 authentication as 'broker' failed: Authentication failed" in str(refused.value)
    # PLAIN is not enabled on that listener: the handshake says which mechanisms are.
    plain = security._replace(sasl_mechanism="PLAIN")
    with pytest.raises(ChannelError) as not_enabled:
        create_topic(broker, "SASL_PLAINTEXT", plain, "never")
    assert "SASL PLAIN is not enabled on the SASL_PLAINTEXT listener there (it enables SCRAM-SHA-512)" in str(
        not_enabled.value
    )


def test_ssl_verifies_the_node_against_the_trust_store(
    broker: RunningBroker, stores: dict[str, str], tmp_path: Path
) -> None:
    security = inter_broker("SSL", stores)
    assert (security.protocol, security.sasl_mechanism) == ("SSL", None)
    assert create_topic(broker, "SSL", security, "over-ssl") == ErrorCode.NONE  # User:ANONYMOUS, a super user
    stranger = certs.generate(tmp_path / "other-ca")  # another CA: the broker's certificate is not trusted
    untrusted = inter_broker("SSL", {**stores, "ssl.truststore.location": str(stranger.ca)})
    with pytest.raises(ChannelError) as refused:
        create_topic(broker, "SSL", untrusted, "never")
    assert "TLS: self-signed certificate in certificate chain" in str(refused.value)


def test_the_host_name_is_checked_unless_the_algorithm_is_empty(
    broker: RunningBroker, stores: dict[str, str], tmp_path: Path
) -> None:
    elsewhere = certs.generate(tmp_path / "elsewhere", hosts=["kafka.example"])  # trusted CA, another host
    settings = {**stores, "ssl.truststore.location": str(elsewhere.ca), "ssl.keystore.location": str(elsewhere.broker)}
    with RunningBroker(tmp_path / "data", {"listeners": "SSL://127.0.0.1:0", **settings}) as other:
        with pytest.raises(ChannelError) as mismatch:
            create_topic(other, "SSL", inter_broker("SSL", settings), "never")
        assert "TLS: IP address mismatch" in str(mismatch.value)
        unchecked = inter_broker("SSL", {**settings, "ssl.endpoint.identification.algorithm": ""})
        assert create_topic(other, "SSL", unchecked, "unchecked-host") == ErrorCode.NONE


# --- which settings Kafka's broker reads, and the one-line refusals ---------------------------------------------


def test_the_listeners_and_mechanisms_are_chosen_as_kafkas_broker_chooses(stores: dict[str, str]) -> None:
    config = BrokerConfig(
        {
            **QUORUM,
            "listeners": "INTERNAL://127.0.0.1:9092",
            "listener.security.protocol.map": "INTERNAL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT",
            "inter.broker.listener.name": "INTERNAL",
            **{f"listener.name.internal.{key}": value for key, value in stores.items()},
            "listener.name.internal.sasl.enabled.mechanisms": "SCRAM-SHA-256",
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-256",
            "listener.name.internal.scram-sha-256.sasl.jaas.config": jaas(SCRAM_MODULE, "inter", "i-secret"),
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config": jaas(PLAIN_MODULE, "ctl", "c-secret"),
        }
    )
    controller, brokers = cluster_security(config)
    assert controller._replace(ssl_context=None) == NodeSecurity(
        "SASL_PLAINTEXT", "CONTROLLER", None, "PLAIN", "ctl", "c-secret"
    )
    assert brokers.ssl_context is not None
    assert brokers._replace(ssl_context=None) == NodeSecurity(
        "SASL_SSL", "INTERNAL", None, "SCRAM-SHA-256", "inter", "i-secret"
    )
    assert "i-secret" not in repr(brokers)
    # Without inter.broker.listener.name: the listener named after security.inter.broker.protocol; a controller
    # listener the map does not name is PLAINTEXT.
    plain = BrokerConfig(
        {**QUORUM, "listeners": "SSL://127.0.0.1:0", "security.inter.broker.protocol": "SSL", **stores}
    )
    assert inter_broker_security(plain).listener == "SSL"
    assert controller_security(plain) == NodeSecurity("PLAINTEXT", "CONTROLLER")


@pytest.mark.parametrize(
    ("settings", "line"),
    [
        (
            {"inter.broker.listener.name": "SASL_SSL", "security.inter.broker.protocol": "SSL"},
            "only one of inter.broker.listener.name and security.inter.broker.protocol should be set (as Kafka)",
        ),
        (
            {"listener.security.protocol.map": "BROKER:SSL,CONTROLLER:PLAINTEXT", "inter.broker.listener.name": "X"},
            "inter-broker listener X is not in listener.security.protocol.map (set inter.broker.listener.name to "
            "a listener this broker serves)",
        ),
        (
            {"security.inter.broker.protocol": "SASL_SSL"},
            "inter-broker listener SASL_SSL is not one of this broker's listeners (SASL_PLAINTEXT, SSL): set "
            "inter.broker.listener.name to one of them",
        ),
        (
            {"security.inter.broker.protocol": "SASL_PLAINTEXT", "sasl.enabled.mechanisms": "PLAIN"},
            "inter-broker listener SASL_PLAINTEXT is SASL_PLAINTEXT and sasl.mechanism.inter.broker.protocol=GSSAPI: "
            "kbroker logs in to other nodes with PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (Kafka's default GSSAPI needs "
            "Kerberos)",
        ),
        (
            {
                "security.inter.broker.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism.inter.broker.protocol": "PLAIN",
                "sasl.enabled.mechanisms": "PLAIN",
            },
            "inter-broker listener SASL_PLAINTEXT uses SASL PLAIN: set "
            'listener.name.sasl_plaintext.plain.sasl.jaas.config=... required username="U" password="P"; '
            "(the credentials this broker logs in with)",
        ),
        (
            {
                "security.inter.broker.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism.inter.broker.protocol": "PLAIN",
                "sasl.enabled.mechanisms": "SCRAM-SHA-256",
                "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas(PLAIN_MODULE, "u", "p"),
            },
            "sasl.mechanism.inter.broker.protocol must be included in sasl.enabled.mechanisms when SASL is used for "
            "inter-broker communication (PLAIN is not enabled on listener SASL_PLAINTEXT)",
        ),
        (
            {
                "security.inter.broker.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism.inter.broker.protocol": "PLAIN",
                "sasl.enabled.mechanisms": "PLAIN",
                "listener.name.sasl_plaintext.plain.sasl.jaas.config": f'{PLAIN_MODULE} required user_a="b";',
            },
            "listener.name.sasl_plaintext.plain.sasl.jaas.config: this broker logs in to other nodes with its "
            'username="U" password="P" options (of PlainLoginModule or ScramLoginModule); none are set',
        ),
        (
            {"listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:SSL", "ssl.truststore.location": "/no"},
            "controller listener CONTROLLER (SSL): ssl.truststore.location: cannot read /no: No such file or directory",
        ),
    ],
)
def test_bad_settings_are_refused_in_one_line(settings: dict[str, str], line: str) -> None:
    with pytest.raises(ConfigError) as refused:
        cluster_security(BrokerConfig({**QUORUM, "listeners": "SASL_PLAINTEXT://:0,SSL://:0", **settings}))
    assert str(refused.value) == line
