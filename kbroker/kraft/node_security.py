"""How this broker secures its own connections to other nodes: the KRaft controllers and the other brokers.

Chosen as Kafka's broker chooses (its KafkaConfig, ChannelBuilders and NodeToControllerChannelManager):

- Towards the controllers: the first of ``controller.listener.names``, its protocol from
  ``listener.security.protocol.map`` (PLAINTEXT when the map does not name it), SASL with
  ``sasl.mechanism.controller.protocol``.
- Towards other brokers (replica fetching, WriteTxnMarkers, AddPartitionsToTxn verification): the listener named
  by ``inter.broker.listener.name``, else the one named after ``security.inter.broker.protocol``; SASL with
  ``sasl.mechanism.inter.broker.protocol``, which Kafka requires among that listener's enabled mechanisms.

TLS uses the listener's effective ``ssl.*`` settings (``listener.name.<l>.ssl.*`` over the broker's): the trust
store verifies the other node, the key store is presented to it, and ``ssl.endpoint.identification.algorithm``
(https by default) checks its host name. SASL logs in with the ``username`` and ``password`` options of
``listener.name.<l>.<mechanism>.sasl.jaas.config``, the same entry whose ``user_*`` options serve PLAIN on that
listener. GSSAPI (Kafka's default mechanism) and OAUTHBEARER are refused as client mechanisms.

Everything is checked when the broker starts: a mistake is one ConfigError line naming the key.
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, NamedTuple

from kbroker.config_registry import ConfigError

if TYPE_CHECKING:
    from kbroker.config import BrokerConfig

CLIENT_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# Login modules whose options carry the client's username and password (Kafka's Plain and Scram login modules).
CREDENTIAL_LOGIN_MODULES = (
    "org.apache.kafka.common.security.plain.PlainLoginModule",
    "org.apache.kafka.common.security.scram.ScramLoginModule",
)


class NodeSecurity(NamedTuple):
    """What a connection to another node needs: TLS (a client context) and SASL (mechanism and credentials)."""

    protocol: str = "PLAINTEXT"
    listener: str = ""
    ssl_context: ssl.SSLContext | None = None
    sasl_mechanism: str | None = None
    username: str = ""
    password: str = ""

    def __repr__(self) -> str:  # never the password
        return f"NodeSecurity({self.listener or '-'}, {self.protocol}, {self.sasl_mechanism or 'no SASL'})"


PLAINTEXT_NODE = NodeSecurity()


class ClusterSecurity(NamedTuple):
    controller: NodeSecurity
    inter_broker: NodeSecurity


def cluster_security(config: BrokerConfig) -> ClusterSecurity:
    """The security of the connections to the controllers and to other brokers; ConfigError in one line."""
    return ClusterSecurity(controller_security(config), inter_broker_security(config))


def _protocols(config: BrokerConfig) -> dict[str, str]:
    from kbroker.server.listeners import parse_protocol_map

    return parse_protocol_map(config["listener.security.protocol.map"])


def controller_security(config: BrokerConfig) -> NodeSecurity:
    """Towards the KRaft controllers: the first controller listener's protocol (PLAINTEXT if the map omits it,
    as Kafka's broker does for a map not naming the controller listener)."""
    names = [n.strip().upper() for n in (config["controller.listener.names"] or "").split(",") if n.strip()]
    if not names:
        return PLAINTEXT_NODE
    listener = names[0]
    protocol = _protocols(config).get(listener, "PLAINTEXT")
    return _node_security(config, listener, protocol, "sasl.mechanism.controller.protocol", "controller listener")


def inter_broker_security(config: BrokerConfig) -> NodeSecurity:
    """Towards other brokers: the inter-broker listener, as Kafka's KafkaConfig.interBrokerListenerName."""
    given = config.listener_settings.get("inter.broker.listener.name", "").strip().upper()
    if given and not config.is_default("security.inter.broker.protocol"):
        raise ConfigError(
            "only one of inter.broker.listener.name and security.inter.broker.protocol should be set (as Kafka)"
        )
    listener = given or str(config["security.inter.broker.protocol"]).strip().upper()
    protocols = _protocols(config)
    if not given and listener not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        raise ConfigError(
            f"security.inter.broker.protocol: {listener!r} is not PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
        )
    protocol = protocols.get(listener)
    if protocol is None:
        raise ConfigError(
            f"inter-broker listener {listener} is not in listener.security.protocol.map "
            "(set inter.broker.listener.name to a listener this broker serves)"
        )
    from kbroker.server.listeners import parse_listeners

    served = parse_listeners(config["listeners"], config["advertised.listeners"], config.listener_settings)
    if listener not in {spec.name for spec in served.listeners}:
        # Kafka's rule too: the other brokers reach this one on the listener it reaches them on.
        raise ConfigError(
            f"inter-broker listener {listener} is not one of this broker's listeners "
            f"({', '.join(spec.name for spec in served.listeners)}): set inter.broker.listener.name to one of them"
        )
    security = _node_security(
        config, listener, protocol, "sasl.mechanism.inter.broker.protocol", "inter-broker listener"
    )
    if security.sasl_mechanism is not None:
        enabled = [m.strip().upper() for m in config.for_listener(listener, "sasl.enabled.mechanisms").split(",")]
        if security.sasl_mechanism not in enabled:
            raise ConfigError(
                "sasl.mechanism.inter.broker.protocol must be included in sasl.enabled.mechanisms when SASL is used "
                f"for inter-broker communication ({security.sasl_mechanism} is not enabled on listener {listener})"
            )
    return security


def _node_security(config: BrokerConfig, listener: str, protocol: str, mechanism_key: str, what: str) -> NodeSecurity:
    context = None
    if protocol in ("SSL", "SASL_SSL"):
        from kbroker.security.tls import client_context

        settings = config.ssl_settings(listener)
        # Empty turns host name checks off; ssl_settings leaves empty values out, so it is given here.
        settings["ssl.endpoint.identification.algorithm"] = str(
            config.for_listener(listener, "ssl.endpoint.identification.algorithm") or ""
        )
        try:
            context = client_context(settings)
        except ConfigError as exc:
            raise ConfigError(f"{what} {listener} ({protocol}): {exc}") from None
    if protocol not in ("SASL_PLAINTEXT", "SASL_SSL"):
        return NodeSecurity(protocol, listener, context)
    mechanism = str(config[mechanism_key]).strip().upper()
    if mechanism not in CLIENT_MECHANISMS:
        raise ConfigError(
            f"{what} {listener} is {protocol} and {mechanism_key}={mechanism}: kbroker logs in to other nodes with "
            f"{', '.join(CLIENT_MECHANISMS)} (Kafka's default GSSAPI needs Kerberos)"
        )
    jaas_key = f"listener.name.{listener.lower()}.{mechanism.lower()}.sasl.jaas.config"
    text = config.for_listener(listener, "sasl.jaas.config", mechanism)
    if text is None:
        raise ConfigError(
            f'{what} {listener} uses SASL {mechanism}: set {jaas_key}=... required username="U" password="P"; '
            "(the credentials this broker logs in with)"
        )
    from kbroker.security.sasl.jaas import parse_jaas_config

    try:
        jaas = parse_jaas_config(text)
    except ConfigError as exc:
        raise ConfigError(f"{jaas_key}: {exc}") from None
    username, password = jaas.options.get("username"), jaas.options.get("password")
    if jaas.login_module not in CREDENTIAL_LOGIN_MODULES or not username or password is None:
        raise ConfigError(
            f'{jaas_key}: this broker logs in to other nodes with its username="U" password="P" options '
            f"(of {' or '.join(m.rsplit('.', 1)[1] for m in CREDENTIAL_LOGIN_MODULES)}); none are set"
        )
    return NodeSecurity(protocol, listener, context, mechanism, username, password)
