"""The SASL mechanisms a listener offers, sans-I/O: each is a server object fed the client's bytes.

The connection side (kbroker/security/authenticator.py) creates one server per exchange with ``create_server``,
passes each SaslAuthenticate's auth_bytes to ``evaluate_response`` and sends back what it returns, until
``is_complete``; the principal is then ``"User:" + authorization_id``. A failure raises
``SaslAuthenticationFailed``, whose ``message`` is what Kafka answers with SASL_AUTHENTICATION_FAILED.

- ``plain``: PLAIN (RFC 4616) against the ``user_<name>="<password>"`` options of the listener's JAAS config.
- ``scram``: SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802/7677) against the metadata image's credentials
  (kbroker/security/scram_credentials.py).
- ``oauthbearer``: OAUTHBEARER (RFC 7628) with Kafka's unsecured JWS validator, for development.
- ``jaas``: parsing a ``sasl.jaas.config`` value as Kafka's JaasConfig does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kbroker.security.scram_credentials import ScramCredentials

SUPPORTED_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


class SaslAuthenticationFailed(Exception):
    """An exchange failed. ``message`` is Kafka's text for the client (SaslAuthenticate's error_message with
    SASL_AUTHENTICATION_FAILED); ``reason`` is the detail for the broker's log, never sent.

    Kafka tells the client some failures as they are (its SaslAuthenticationException: a bad PLAIN password, an
    authorization id that differs from the user) and hides the others behind one generic text (its SaslException:
    an unknown SCRAM user, a wrong proof, a malformed message), so a client cannot learn which users exist. The
    generic text names whether it was an authentication or a re-authentication: ``message_for`` gives either.
    """

    def __init__(self, message: str, *, reason: str | None = None, generic_for: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason if reason is not None else message
        self._generic_for = generic_for  # the mechanism, when the message is the generic one

    @classmethod
    def generic(cls, mechanism: str, reason: str) -> SaslAuthenticationFailed:
        return cls(_generic_message(mechanism, reauthenticating=False), reason=reason, generic_for=mechanism)

    @property
    def is_generic(self) -> bool:
        return self._generic_for is not None

    def message_for(self, reauthenticating: bool) -> str:
        """The client's message during a first authentication or a re-authentication (KIP-368)."""
        if self._generic_for is None:
            return self.message
        return _generic_message(self._generic_for, reauthenticating)


class SaslExchangeAborted(Exception):
    """A client message Kafka's own mechanism cannot even process (its code throws an unexpected exception there):
    Kafka closes the connection without an answer, and so does kbroker. The text is for the broker's log."""


def _generic_message(mechanism: str, reauthenticating: bool) -> str:
    stage = "re-authentication" if reauthenticating else "authentication"
    return f"Authentication failed during {stage} due to invalid credentials with SASL mechanism {mechanism}"


class SaslServer(Protocol):
    mechanism: str

    def evaluate_response(self, response: bytes) -> bytes:
        """The next challenge (b"" if none) for the client's ``response``; raises SaslAuthenticationFailed."""
        ...

    @property
    def is_complete(self) -> bool: ...

    @property
    def authorization_id(self) -> str:
        """The user name once complete; the principal is "User:" + it."""
        ...

    @property
    def credential_expiry_ms(self) -> int | None:
        """Wall-clock ms when the credential expires (an OAUTHBEARER token's "exp"); None when it has no
        expiry of its own (KIP-368: then only connections.max.reauth.ms bounds the session)."""
        ...


@dataclass(frozen=True)
class SaslSettings:
    """One listener's SASL settings, built from its config."""

    plain_users: Mapping[str, str]  # PLAIN: the user_<name>="<password>" options of its PLAIN JAAS config
    scram_credentials: ScramCredentials
    oauthbearer_options: Mapping[str, str] = field(default_factory=dict)  # OAUTHBEARER JAAS options
    clock_ms: Callable[[], int] = field(default=lambda: time.time_ns() // 1_000_000)  # wall clock (token times)


def create_server(mechanism: str, settings: SaslSettings) -> SaslServer:
    """A new server for one exchange of ``mechanism`` (one of SUPPORTED_MECHANISMS; ValueError otherwise).
    Raises kbroker.config_registry.ConfigError when the OAUTHBEARER options are invalid."""
    if mechanism == "PLAIN":
        from kbroker.security.sasl.plain import PlainSaslServer

        return PlainSaslServer(settings.plain_users)
    if mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        from kbroker.security.sasl.scram import SCRAM_MECHANISMS, ScramSaslServer

        return ScramSaslServer(SCRAM_MECHANISMS[mechanism], settings.scram_credentials)
    if mechanism == "OAUTHBEARER":
        from kbroker.security.sasl.oauthbearer import OAuthBearerSaslServer, UnsecuredValidator

        return OAuthBearerSaslServer(UnsecuredValidator(settings.oauthbearer_options, settings.clock_ms))
    raise ValueError(f"unsupported SASL mechanism {mechanism!r}; supported: {', '.join(SUPPORTED_MECHANISMS)}")
