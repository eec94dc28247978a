"""Each listener's security, built from the config at start-up: its TLS context and its SASL settings.

A listener's security protocol (kbroker/server/listeners.py) says what it needs:

- SSL and SASL_SSL: an SSLContext from the listener's effective ``ssl.*`` settings (``listener.name.<l>.ssl.*``
  over the broker's), kbroker/security/tls.py. On SSL the principal is the client certificate's distinguished name
  under ``ssl.principal.mapping.rules`` (``User:ANONYMOUS`` without one). On SASL_SSL, as in Kafka, client
  certificates are asked for only when ``ssl.client.auth`` is set for that listener itself.
- SASL_PLAINTEXT and SASL_SSL: the enabled mechanisms (``sasl.enabled.mechanisms``; GSSAPI, Kafka's default, is
  refused), each mechanism's JAAS config (``listener.name.<l>.<mechanism>.sasl.jaas.config``): PLAIN needs one, its
  ``user_<name>="<password>"`` options being the users; SCRAM's users are the stored credentials
  (AlterUserScramCredentials), so its JAAS config may be left out; OAUTHBEARER takes the unsecured validator's
  options from its own (a start-up warning says that it trusts any token: development only).
  ``connections.max.reauth.ms`` is read per mechanism.

Everything is checked here, before the broker opens its data directory: a mistake is one ConfigError line naming
the listener and the key.
"""

from __future__ import annotations

import logging
import ssl
from typing import TYPE_CHECKING, Any, NamedTuple

from kbroker.config import BrokerConfig, ConfigError
from kbroker.server.listeners import ListenerSpec

if TYPE_CHECKING:
    from kbroker.broker import Broker
    from kbroker.security.authenticator import SaslAuthenticator, SaslListener

log = logging.getLogger("kbroker.server")

# The login module each mechanism's JAAS config names, as Kafka's (the class is not loaded: it says which mechanism).
LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "OAUTHBEARER": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule",
}
USER_OPTION = "user_"  # PLAIN's user_<name>="<password>" options


class ListenerSecurity(NamedTuple):
    """What a listener's connections need to secure and authenticate themselves."""

    ssl_context: ssl.SSLContext | None = None
    principal_rules: Any = None  # kbroker.security.principal's parsed ssl.principal.mapping.rules (SSL only)
    sasl: SaslListener | None = None


PLAINTEXT_SECURITY = ListenerSecurity()


def listener_security(spec: ListenerSpec, config: BrokerConfig) -> ListenerSecurity:
    """The security of listener ``spec``; ConfigError, in one line naming the listener, for any mistake."""
    protocol = spec.security_protocol
    if protocol == "PLAINTEXT":
        return PLAINTEXT_SECURITY
    try:
        ssl_context, rules = _tls(spec.name, protocol, config) if protocol in ("SSL", "SASL_SSL") else (None, None)
        sasl = _sasl(spec.name, config) if protocol in ("SASL_PLAINTEXT", "SASL_SSL") else None
    except ConfigError as exc:
        raise ConfigError(f"listener {spec.name} ({protocol}): {exc}") from None
    return ListenerSecurity(ssl_context, rules, sasl)


def _tls(listener: str, protocol: str, config: BrokerConfig) -> tuple[ssl.SSLContext, Any]:
    from kbroker.security.principal import parse_mapping_rules
    from kbroker.security.tls import server_context

    settings = config.ssl_settings(listener)
    if protocol == "SASL_SSL" and "ssl.client.auth" not in config.listener_overrides.get(listener, {}):
        # Kafka's ChannelBuilders: SASL authenticates a SASL_SSL client, so a broker-wide ssl.client.auth is not
        # applied there; only listener.name.<l>.ssl.client.auth asks SASL_SSL clients for certificates.
        settings["ssl.client.auth"] = "none"
    context = server_context(settings)
    rules = parse_mapping_rules(config.for_listener(listener, "ssl.principal.mapping.rules"))
    return context, rules


def _sasl(listener: str, config: BrokerConfig) -> SaslListener:
    # The SASL code is imported for SASL listeners only, here at start-up (not by a connection's first request).
    from kbroker.security.authenticator import SaslListener
    from kbroker.security.sasl.jaas import parse_jaas_config

    mechanisms = tuple(m for m in config.for_listener(listener, "sasl.enabled.mechanisms").split(",") if m)
    prefix = f"listener.name.{listener.lower()}"
    if not mechanisms:
        raise ConfigError("sasl.enabled.mechanisms is empty: enable PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER")
    if "GSSAPI" in mechanisms:
        raise ConfigError(
            "sasl.enabled.mechanisms includes GSSAPI (Kafka's default), which kbroker does not implement: "
            "enable PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER"
        )
    plain_users: dict[str, str] = {}
    oauth_options: dict[str, str] = {}
    for mechanism in mechanisms:
        key = f"{prefix}.{mechanism.lower()}.sasl.jaas.config"
        text = config.for_listener(listener, "sasl.jaas.config", mechanism)
        if text is None:
            if mechanism == "PLAIN":
                raise ConfigError(
                    f'PLAIN needs its users: set {key}={LOGIN_MODULES["PLAIN"]} required user_alice="alice-secret";'
                )
            continue
        try:
            jaas = parse_jaas_config(text)
        except ConfigError as exc:
            raise ConfigError(f"{key}: {exc}") from None
        if jaas.login_module != LOGIN_MODULES[mechanism]:
            raise ConfigError(f"{key}: {mechanism} needs {LOGIN_MODULES[mechanism]}, not {jaas.login_module}")
        if mechanism == "PLAIN":
            plain_users = {
                name[len(USER_OPTION) :]: value for name, value in jaas.options.items() if name.startswith(USER_OPTION)
            }
            if not plain_users:
                raise ConfigError(f'{key}: no users (options user_<name>="<password>")')
        elif mechanism == "OAUTHBEARER":
            from kbroker.security.sasl.oauthbearer import UnsecuredValidator

            oauth_options = dict(jaas.options)
            try:  # the options Kafka refuses stop the start, not a client's login
                UnsecuredValidator(oauth_options, lambda: 0)
            except ConfigError as exc:
                raise ConfigError(f"{key}: {exc}") from None
    if "OAUTHBEARER" in mechanisms:
        # Kafka's unsecured validator trusts whatever unsigned token it is given: anyone reaching this listener can
        # log in as any principal, a super user included. Said once at start-up, as it is not for production.
        log.warning(
            "listener %s enables OAUTHBEARER with Kafka's unsecured JWS validator: any client can claim any "
            "principal (super.users included); for development only",
            listener,
        )
    return SaslListener(
        mechanisms=mechanisms,
        plain_users=plain_users,
        oauthbearer_options=oauth_options,
        max_reauth_ms={m: config.for_listener(listener, "connections.max.reauth.ms", m) for m in mechanisms},
        max_receive_size=config.for_listener(listener, "sasl.server.max.receive.size"),
        failed_delay_ms=config["connection.failed.authentication.delay.ms"],
    )


def new_authenticator(sasl: SaslListener, broker: Broker) -> SaslAuthenticator:
    """A connection's authenticator on a SASL listener: SCRAM checks the broker's stored credentials."""
    from kbroker.security.authenticator import SaslAuthenticator

    return SaslAuthenticator(sasl, broker.scram_credentials)
