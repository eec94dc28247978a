"""One connection's SASL authentication, as Kafka's SaslServerAuthenticator runs it; sans-I/O.

The connection (kbroker/server/connection.py) hands every request of a SASL listener here until authentication
completes, and here again when a client re-authenticates (KIP-368). What is allowed at each stage:

    HANDSHAKE_OR_VERSIONS  ApiVersions (once) or SaslHandshake
    HANDSHAKE              SaslHandshake
    AUTHENTICATE           SaslAuthenticate (handshake v1), or raw size-prefixed tokens (handshake v0)
    COMPLETE               everything, through the normal pipeline

Anything else before COMPLETE ends the connection: during the handshake without an answer, during authentication
after an ILLEGAL_SASL_STATE answer. A mechanism that is not enabled is answered UNSUPPORTED_SASL_MECHANISM with the
enabled list, and a failed authentication SASL_AUTHENTICATION_FAILED with the mechanism's message; both then close
the connection. Every authentication failure (these, and a request out of turn) waits
``connection.failed.authentication.delay.ms`` first, as Kafka's do (the delay slows down password guessing); a
second ApiVersions is not one in Kafka (an IllegalStateException) and closes at once, as does a mechanism that
raises anything but SaslAuthenticationFailed (logged with its traceback: a bug). An ApiVersions that Kafka
finds invalid (KIP-511's software name pattern) is answered INVALID_REQUEST and another may follow. Once complete,
the principal is ``User:<authorization id>``; a successful SaslAuthenticate carries an empty error message, as
Kafka's does.

Session lifetime: at completion the session gets the shorter of the mechanism's ``connections.max.reauth.ms`` and
the credential's own expiry (an OAUTHBEARER token's ``exp``), told to the client in SaslAuthenticate v1+'s
``session_lifetime_ms``. A request arriving after the session expired closes the connection, unless it is the
SaslHandshake of a re-authentication: that is allowed at most once a second, must keep the mechanism (a different
one fails whatever request or token comes next, without an answer; one not enabled at all closes the connection at
once, also without an answer, as Kafka's SocketServer does) and must keep the principal (a different one is
SASL_AUTHENTICATION_FAILED). Without a lifetime, a SaslHandshake after authentication is an ordinary request,
answered ILLEGAL_SASL_STATE (kbroker/apis/sasl.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from kbroker.security.sasl import SaslAuthenticationFailed, SaslExchangeAborted, SaslServer, SaslSettings, create_server
from protocol.errors import ErrorCode
from protocol.messages import APIS
from protocol.messages.sasl_authenticate_response import SaslAuthenticateResponse
from protocol.messages.sasl_handshake_response import SaslHandshakeResponse

if TYPE_CHECKING:
    from kbroker.security.scram_credentials import ScramCredentials

log = logging.getLogger("kbroker.security")

API_VERSIONS = 18
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
MIN_REAUTH_INTERVAL_SECONDS = 1.0  # Kafka's KafkaChannel.MIN_REAUTH_INTERVAL_ONE_SECOND_NANOS


@dataclass(frozen=True)
class SaslListener:
    """A SASL listener's settings (kbroker/server/listener_security.py reads them from the config)."""

    mechanisms: tuple[str, ...]  # enabled, in config order
    plain_users: Mapping[str, str] = field(default_factory=dict)  # PLAIN's users and passwords (its JAAS config)
    oauthbearer_options: Mapping[str, str] = field(default_factory=dict)  # the unsecured validator's options
    max_reauth_ms: Mapping[str, int] = field(default_factory=dict)  # connections.max.reauth.ms per mechanism
    max_receive_size: int = 524288  # sasl.server.max.receive.size: largest frame before authentication
    failed_delay_ms: int = 100  # connection.failed.authentication.delay.ms


class Stage(Enum):
    HANDSHAKE_OR_VERSIONS = "handshake or ApiVersions"
    HANDSHAKE = "handshake"
    AUTHENTICATE = "authenticate"
    COMPLETE = "complete"
    FAILED = "failed"


@dataclass
class Step:
    """What the connection does with one request or token during authentication."""

    response: Any = None  # the answer body (a raw token: bytes to send size-prefixed); None: nothing to send
    close: bool = False  # end the connection after sending the answer (and the failure delay, if ``failed``)
    failed: bool = False  # an authentication failure: the answer waits for the failure delay
    pass_through: bool = False  # an allowed ordinary request (ApiVersions): the normal pipeline answers it


def kafka_api_name(api_key: int) -> str:
    """Kafka's ApiKeys enum name (METADATA, SASL_HANDSHAKE, ...), as its error messages print it."""
    name = APIS[api_key].name if api_key in APIS else str(api_key)
    return "".join("_" + c if c.isupper() and i else c for i, c in enumerate(name)).upper()


class _MechanismBroke(Exception):
    """A mechanism raised something other than SaslAuthenticationFailed. Kafka's authenticator treats that as an
    I/O-like failure: the connection is closed at once, with no answer and no failure delay."""


def _valid_api_versions(api_version: int, body: Any) -> bool:
    """Kafka's ApiVersionsRequest.isValid: from v3 the client software name and version must match KIP-511's
    pattern (the handler answers INVALID_REQUEST otherwise)."""
    from kbroker.apis.api_versions import _valid_software_field as valid_software_field

    return api_version < 3 or (
        valid_software_field(body.client_software_name) and valid_software_field(body.client_software_version)
    )


class SaslAuthenticator:
    """The SASL exchange and session of one connection on a SASL listener."""

    def __init__(
        self,
        listener: SaslListener,
        scram_credentials: ScramCredentials,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.listener = listener
        self._settings = SaslSettings(
            plain_users=listener.plain_users,
            scram_credentials=scram_credentials,
            oauthbearer_options=listener.oauthbearer_options,
        )
        self.stage = Stage.HANDSHAKE_OR_VERSIONS
        self.principal: str | None = None
        self.mechanism: str | None = None
        self.raw_tokens = False  # SaslHandshake v0: tokens come without Kafka headers
        self._server: SaslServer | None = None
        self._monotonic = monotonic
        self._wall_ms = wall_ms
        self.session_expires_at: float | None = None  # monotonic seconds; None: the session never expires
        self._reauthenticating = False
        self._reauth_started_at: float | None = None
        self._bad_reauth_mechanism: str | None = None
        self.reauthentications = 0

    @property
    def complete(self) -> bool:
        return self.stage is Stage.COMPLETE

    @property
    def _what(self) -> str:
        return "re-authentication" if self._reauthenticating else "authentication"

    # --- after authentication ------------------------------------------------------------------------------

    def session_expired(self) -> bool:
        return self.session_expires_at is not None and self._monotonic() > self.session_expires_at

    def begin_reauthentication(self) -> bool:
        """A SaslHandshake arrived on an authenticated connection: start re-authenticating if the session has a
        lifetime and the last re-authentication began a second or more ago (Kafka's rule); else False."""
        if not self.complete or self.session_expires_at is None:
            return False
        now = self._monotonic()
        if self._reauth_started_at is not None and now - self._reauth_started_at < MIN_REAUTH_INTERVAL_SECONDS:
            return False
        self._reauth_started_at = now
        self._reauthenticating = True
        self.stage = Stage.HANDSHAKE
        return True

    # --- the exchange ---------------------------------------------------------------------------------------

    def on_request(self, api_key: int, api_version: int, body: Any) -> Step:
        """The step for a request received before authentication is complete (or while re-authenticating)."""
        stage = self.stage
        if self._bad_reauth_mechanism is not None:
            # Kafka's REAUTH_BAD_MECHANISM: whatever comes next fails the re-authentication, without an answer.
            log.info("SASL re-authentication failed: %s", self._bad_reauth_mechanism)
            self.stage = Stage.FAILED
            return Step(close=True, failed=True)
        if api_key == API_VERSIONS and stage is Stage.HANDSHAKE_OR_VERSIONS:
            if _valid_api_versions(api_version, body):  # Kafka answers an invalid one and waits for another
                self.stage = Stage.HANDSHAKE
            return Step(pass_through=True)
        if api_key == SASL_HANDSHAKE and stage in (Stage.HANDSHAKE_OR_VERSIONS, Stage.HANDSHAKE):
            return self._handshake(api_version, body)
        if api_key == SASL_AUTHENTICATE and stage is Stage.AUTHENTICATE and not self.raw_tokens:
            return self._authenticate(body.auth_bytes, api_version)
        what = "authentication" if stage is Stage.AUTHENTICATE else "handshake"
        message = f"Unexpected Kafka request of type {kafka_api_name(api_key)} during SASL {what}."
        self.stage = Stage.FAILED
        if api_key == API_VERSIONS and stage is Stage.HANDSHAKE:
            # Kafka's IllegalStateException, not an authentication failure: closed at once, without an answer.
            log.info("closing connection: a second ApiVersions request during the SASL handshake")
            return Step(close=True)
        log.info("closing connection: %s", message)
        # Kafka's IllegalSaslStateException fails the authentication: the close waits for the failure delay.
        if stage is Stage.AUTHENTICATE:
            # Kafka answers this one with the request's own error response before closing.
            return Step(response=(ErrorCode.ILLEGAL_SASL_STATE, message), close=True, failed=True)
        return Step(close=True, failed=True)

    def on_raw_token(self, token: bytes) -> Step:
        """A token after SaslHandshake v0: the answer is a raw token too; a failure closes without one."""
        assert self.raw_tokens and self.stage is Stage.AUTHENTICATE
        challenge = self._evaluate_or_fail(token)
        if not isinstance(challenge, bytes):  # v0 has no way to say why: the connection just ends
            return Step(close=True, failed=challenge is not None)
        if self.complete:
            self._session_lifetime_ms()  # a v0 client is not told its session's lifetime, but it has one
        return Step(response=challenge)

    def _handshake(self, api_version: int, body: Any) -> Step:
        mechanism = body.mechanism
        enabled = list(self.listener.mechanisms)
        if mechanism not in enabled and self._reauthenticating:
            # Kafka handles a re-authentication's handshake outside the authenticator's failure path: the
            # connection is closed at once and the UNSUPPORTED_SASL_MECHANISM answer it built is never sent.
            log.info(
                "SASL mechanism %r requested for re-authentication is not enabled (enabled: %s)", mechanism, enabled
            )
            self.stage = Stage.FAILED
            return Step(close=True)
        if mechanism not in enabled:
            log.info("SASL mechanism %r requested by a client is not enabled (enabled: %s)", mechanism, enabled)
            self.stage = Stage.FAILED
            answer = SaslHandshakeResponse(error_code=ErrorCode.UNSUPPORTED_SASL_MECHANISM, mechanisms=enabled)
            return Step(response=answer, close=True, failed=True)
        if self._reauthenticating and mechanism != self.mechanism:
            # Kafka accepts the handshake, then fails the next token with this message.
            self._bad_reauth_mechanism = (
                f"SASL mechanism '{mechanism}' requested by client is not supported for re-authentication of "
                f"mechanism '{self.mechanism}'"
            )
        else:
            self.mechanism = mechanism
            self._server = create_server(mechanism, self._settings)
        self.raw_tokens = api_version == 0
        self.stage = Stage.AUTHENTICATE
        return Step(response=SaslHandshakeResponse(error_code=ErrorCode.NONE, mechanisms=enabled))

    def _authenticate(self, auth_bytes: bytes, api_version: int) -> Step:
        challenge = self._evaluate_or_fail(auth_bytes)
        if challenge is None:
            return Step(close=True)
        if isinstance(challenge, SaslAuthenticationFailed):
            answer = SaslAuthenticateResponse(
                error_code=ErrorCode.SASL_AUTHENTICATION_FAILED,
                error_message=challenge.message_for(self._reauthenticating),
            )
            return Step(response=answer, close=True, failed=True)
        lifetime_ms = self._session_lifetime_ms() if self.complete else 0
        answer = SaslAuthenticateResponse(
            # Kafka's generated SaslAuthenticateResponseData defaults the nullable message to "", and sends that.
            error_code=ErrorCode.NONE,
            error_message="",
            auth_bytes=challenge,
            session_lifetime_ms=lifetime_ms,
        )
        return Step(response=answer)

    def _evaluate_or_fail(self, token: bytes) -> bytes | SaslAuthenticationFailed | None:
        """The mechanism's challenge; else the stage is FAILED and this is the failure to tell the client, or None
        when the exchange broke (the connection closes at once, without an answer, as Kafka's does)."""
        try:
            return self._evaluate(token)
        except _MechanismBroke:
            self.stage = Stage.FAILED
            return None
        except SaslAuthenticationFailed as exc:
            log.info("SASL %s %s failed: %s", self.mechanism, self._what, exc.reason)
            self.stage = Stage.FAILED
            return exc

    def _evaluate(self, token: bytes) -> bytes:
        """One token through the mechanism; on completion, the principal (checked unchanged on re-authentication)."""
        if self._bad_reauth_mechanism is not None:
            raise SaslAuthenticationFailed(self._bad_reauth_mechanism)
        assert self._server is not None and self.mechanism is not None
        try:
            challenge = self._server.evaluate_response(bytes(token))
        except SaslAuthenticationFailed:
            raise
        except SaslExchangeAborted as exc:
            log.info("SASL %s %s aborted: %s", self.mechanism, self._what, exc)
            raise _MechanismBroke from exc
        except Exception as exc:  # noqa: BLE001 - a mechanism's bug must fail this client, not the broker
            log.warning("SASL %s mechanism failed unexpectedly", self.mechanism, exc_info=exc)
            raise _MechanismBroke from exc
        if self._server.is_complete:
            principal = "User:" + self._server.authorization_id
            if self._reauthenticating and principal != self.principal:
                before, after = (self.principal or "").replace(":", ".", 1), principal.replace(":", ".", 1)
                raise SaslAuthenticationFailed(
                    f"Cannot change principals during re-authentication from {before}: {after}"
                )
            if self._reauthenticating:
                self.reauthentications += 1
            self.principal = principal
            self.stage = Stage.COMPLETE
            self._reauthenticating = False
            self.raw_tokens = False
        return challenge

    def _session_lifetime_ms(self) -> int:
        """Kafka's calcCompletionTimesAndReturnSessionLifetimeMs: sets the session's expiry, returns its length."""
        assert self._server is not None and self.mechanism is not None
        max_reauth = self.listener.max_reauth_ms.get(self.mechanism, 0)
        expiry = self._server.credential_expiry_ms
        if expiry is None and max_reauth <= 0:
            self.session_expires_at = None
            return 0
        lifetime = max_reauth if expiry is None else expiry - self._wall_ms()
        if expiry is not None and max_reauth > 0:
            lifetime = min(lifetime, max_reauth)
        lifetime = max(0, lifetime)
        self.session_expires_at = self._monotonic() + lifetime / 1000
        return lifetime
