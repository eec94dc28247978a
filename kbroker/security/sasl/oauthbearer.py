"""OAUTHBEARER (RFC 7628) with Kafka's unsecured JWS validator (OAuthBearerUnsecuredValidatorCallbackHandler).

For development only, as in Kafka: the token is an unsecured JWS (header ``{"alg":"none"}``, no signature) whose
claims are trusted as they are. The client's message is::

    n,[a=<authzid>],\\x01auth=Bearer <token>\\x01[<key>=<value>\\x01...]\\x01

The validator's options (the listener's OAUTHBEARER JAAS options) are ``unsecuredValidatorPrincipalClaimName``
(default ``sub``), ``unsecuredValidatorScopeClaimName`` (default ``scope``), ``unsecuredValidatorRequiredScope``
(space-separated) and ``unsecuredValidatorAllowableClockSkewMs`` (default 0).

A token that fails validation is not refused at once: as Kafka, the server answers a JSON error challenge
(``{"status":"invalid_token"}``, or ``{"status":"insufficient_scope", "scope":"[a, b]"}`` for a missing scope),
the client answers it with a single \\x01, and only then does the exchange fail, with that JSON as the message.
A malformed message fails at once with the generic text. The token's ``exp`` is the credential's expiry, which
bounds the session (KIP-368).
"""

from __future__ import annotations

import base64
import json
import logging
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kbroker.config_registry import ConfigError
from kbroker.security.sasl import SaslAuthenticationFailed, SaslExchangeAborted

log = logging.getLogger("kbroker.security.sasl.oauthbearer")

MECHANISM = "OAUTHBEARER"
PRINCIPAL_CLAIM_NAME_OPTION = "unsecuredValidatorPrincipalClaimName"
SCOPE_CLAIM_NAME_OPTION = "unsecuredValidatorScopeClaimName"
REQUIRED_SCOPE_OPTION = "unsecuredValidatorRequiredScope"
ALLOWABLE_CLOCK_SKEW_MS_OPTION = "unsecuredValidatorAllowableClockSkewMs"

_SEPARATOR = "\x01"
_SASLNAME = r"(?:[\x01-\x2B\x2D-\x3C\x3E-\x7F]|=2C|=3D)+"
_KVPAIRS = r"(?:[A-Za-z]+=[\x21-\x7E \t\r\n]+\x01)*"
_CLIENT_INITIAL_RESPONSE = re.compile(rf"n,(?:a=(?P<authzid>{_SASLNAME}))?,\x01(?P<kvpairs>{_KVPAIRS})\x01")
_AUTH = re.compile(r"(?P<scheme>[A-Za-z0-9_]+)[ ]+(?P<token>[-_~+/.a-zA-Z0-9]+=*)")
_SCOPE_ITEM = re.compile(r"[\x21\x23-\x5B\x5D-\x7E]+")
_INT32_MAX = 2**31 - 1


def _blank(value: str | None) -> bool:
    return value is None or not value.strip()


def _java_list(items: list[str]) -> str:
    return "[" + ", ".join(items) + "]"


class UnsecuredValidator:
    """Kafka's unsecured JWS validator over one listener's options; ConfigError for options Kafka refuses."""

    def __init__(self, options: Mapping[str, str], clock_ms: Callable[[], int]) -> None:
        self.clock_ms = clock_ms
        principal = options.get(PRINCIPAL_CLAIM_NAME_OPTION)
        self.principal_claim = "sub" if principal is None or _blank(principal) else principal.strip()
        scope = options.get(SCOPE_CLAIM_NAME_OPTION)
        self.scope_claim = "scope" if scope is None or _blank(scope) else scope.strip()
        required = options.get(REQUIRED_SCOPE_OPTION)
        self.required_scope: list[str] = []
        if required is not None and not _blank(required):
            for item in required.strip().split(" "):
                if item and not _SCOPE_ITEM.fullmatch(item):
                    raise ConfigError(f"Invalid scope value: {item}")
                if item:
                    self.required_scope.append(item)
        skew = options.get(ALLOWABLE_CLOCK_SKEW_MS_OPTION)
        self.allowable_clock_skew_ms = 0
        if skew is not None and not _blank(skew):
            text = skew.strip()
            if not re.fullmatch(r"[-+]?[0-9]+", text) or not -(2**31) <= int(text) <= _INT32_MAX:
                raise ConfigError(f'For input string: "{text}"')
            self.allowable_clock_skew_ms = int(text)
            if self.allowable_clock_skew_ms < 0:
                raise ConfigError(f"Allowable clock skew millis must not be negative: {skew}")

    def validate(self, token: str) -> UnsecuredJws:
        """The token if it is valid; InvalidToken (with the failure's scope, if a scope is missing) otherwise."""
        jws = UnsecuredJws.parse(token, self.principal_claim, self.scope_claim)
        now = self.clock_ms()
        skew = self.allowable_clock_skew_ms
        if jws.issued_at is not None and 1000 * jws.issued_at > now + skew:
            raise InvalidToken(
                f"The Issued At value ({jws.issued_at:f} seconds) was after the indicated time ({now} ms) plus "
                f"allowable clock skew ({skew} ms)"
            )
        if now - skew >= 1000 * jws.expiration_time:
            raise InvalidToken(
                f"The indicated time ({now} ms) minus allowable clock skew ({skew} ms) was on or after the "
                f"Expiration Time value ({jws.expiration_time:f} seconds)"
            )
        if jws.issued_at is not None and jws.expiration_time <= jws.issued_at:
            raise InvalidToken(
                f"The Expiration Time time ({jws.expiration_time:f} seconds) was not after the Issued At time "
                f"({jws.issued_at:f} seconds)"
            )
        for required in self.required_scope:
            if required not in jws.scope:
                raise InvalidToken(
                    f"The provided scope ({_java_list(sorted(jws.scope))}) was missing a required scope ({required}).  "
                    f"All required scope elements: {_java_list(self.required_scope)}",
                    scope=_java_list(self.required_scope),
                )
        return jws


class InvalidToken(Exception):
    """A token the validator refuses: ``reason`` for the log, ``scope`` when a required scope is missing."""

    def __init__(self, reason: str, scope: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.scope = scope


def _java_basic_base64(text: str) -> bytes:
    """java.util.Base64.getDecoder().decode: the standard alphabet ("-" and "_" refused), padding optional."""
    if not re.fullmatch(r"[A-Za-z0-9+/]*={0,2}", text):
        raise ValueError
    body = text.rstrip("=")
    padding = len(text) - len(body)
    if len(body) % 4 == 1 or (padding and len(text) % 4):
        raise ValueError
    return base64.b64decode(body + "=" * (-len(body) % 4))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # Jackson refuses NaN and Infinity


def _claim_value(value: Any) -> Any:
    """A JSON value as Kafka's token keeps it (Jackson's asText for all but numbers and arrays of texts)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return value
    if isinstance(value, list):
        return [_text(item) for item in value]
    return _text(value)


def _text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return json.dumps(value)
    return ""  # an object or array in Jackson's asText


def _json_map(split: str) -> dict[str, Any]:
    try:
        decoded = _java_basic_base64(split)
    except ValueError:
        raise InvalidToken("malformed Base64 URL encoded value") from None
    try:
        document = json.loads(decoded, parse_constant=_no_constant) if decoded.strip() else {}
    except (ValueError, RecursionError):
        raise InvalidToken("malformed JSON") from None
    if not isinstance(document, dict):
        return {}
    return {key: _claim_value(value) for key, value in document.items()}


def _type_name(value: Any) -> str:
    if isinstance(value, str):
        return "String"
    if isinstance(value, list):
        return "List"
    if isinstance(value, int):
        return "Integer"
    return "Double"


@dataclass(frozen=True)
class UnsecuredJws:
    token: str
    claims: dict[str, Any]
    principal_name: str
    scope: frozenset[str]
    expiration_time: float  # seconds, as the claim gives it
    issued_at: float | None

    @property
    def lifetime_ms(self) -> int:
        return math.floor(self.expiration_time * 1000 + 0.5)  # Java's Math.round

    @classmethod
    def parse(cls, token: str, principal_claim: str, scope_claim: str) -> UnsecuredJws:
        if ".." in token:
            raise InvalidToken("Malformed compact serialization contains '..'")
        splits = token.split(".")
        while len(splits) > 1 and splits[-1] == "":
            splits.pop()  # Java's split drops trailing empty strings...
        if token.endswith("."):
            splits.append("")  # ...and Kafka puts one back for the empty signature
        if len(splits) != 3:
            raise InvalidToken(
                "Unsecured JWS compact serializations must have 3 dot-separated Base64URL-encoded values"
            )
        header = _json_map(splits[0])
        claims = _json_map(splits[1])
        alg = header.get("alg")
        if alg is None:
            raise InvalidToken("JWS header must have an Algorithm value")
        if alg != "none":
            raise InvalidToken("Unsecured JWS must have 'none' for an algorithm")
        if splits[2]:
            raise InvalidToken("Unsecured JWS must not contain a digital signature")

        def claim(name: str, kind: type | tuple[type, ...], kind_name: str) -> Any:
            value = claims.get(name)
            if value is not None and not isinstance(value, kind):
                raise InvalidToken(f"The '{name}' claim was not of type {kind_name}: {_type_name(value)}")
            return value

        scope_value = claims.get(scope_claim)
        scope: frozenset[str]
        if isinstance(scope_value, str):
            scope = frozenset() if _blank(scope_value) else frozenset({scope_value.strip()})
        else:
            items = claim(scope_claim, list, "List") or []
            scope = frozenset(item.strip() for item in items if not _blank(item))
        expiration = claim("exp", (int, float), "Number")
        if expiration is None:
            raise InvalidToken("No expiration time in JWT")
        principal = claim(principal_claim, str, "String")
        if principal is None or _blank(principal):
            raise InvalidToken(f"No principal name in JWT claim: {principal_claim}")
        issued_at = claim("iat", (int, float), "Number")
        return cls(token, claims, principal, scope, float(expiration), None if issued_at is None else float(issued_at))


class OAuthBearerSaslServer:
    mechanism = MECHANISM

    def __init__(self, validator: UnsecuredValidator) -> None:
        self._validator = validator
        self._token: UnsecuredJws | None = None
        self._error: str | None = None  # the JSON error challenge sent, awaiting the client's \x01
        self.extensions: dict[str, str] = {}

    @property
    def is_complete(self) -> bool:
        return self._token is not None

    @property
    def authorization_id(self) -> str:
        if self._token is None:
            raise RuntimeError("Authentication exchange has not completed")
        return self._token.principal_name

    @property
    def credential_expiry_ms(self) -> int | None:
        return None if self._token is None else self._token.lifetime_ms

    def evaluate_response(self, response: bytes) -> bytes:
        if response == b"\x01" and self._error is not None:
            raise SaslAuthenticationFailed(self._error, reason="the client acknowledged the token error")
        self._error = None
        match = _CLIENT_INITIAL_RESPONSE.fullmatch(response.decode("utf-8", "replace"))
        if match is None:
            raise SaslAuthenticationFailed.generic(MECHANISM, "Invalid OAUTHBEARER client first message")
        properties: dict[str, str] = {}
        for pair in match["kvpairs"].split(_SEPARATOR):
            if pair:
                key, _, value = pair.partition("=")
                properties[key] = value
        auth = properties.pop("auth", None)
        if auth is None:
            raise SaslAuthenticationFailed.generic(
                MECHANISM, "Invalid OAUTHBEARER client first message: 'auth' not specified"
            )
        auth_match = _AUTH.fullmatch(auth)
        if auth_match is None:
            raise SaslAuthenticationFailed.generic(
                MECHANISM, "Invalid OAUTHBEARER client first message: invalid 'auth' format"
            )
        if auth_match["scheme"].lower() != "bearer":
            # Kafka 4.3 throws there ("No group with name <scheme>"): the connection closes without an answer.
            raise SaslExchangeAborted(f"OAUTHBEARER client first message with scheme {auth_match['scheme']!r}")
        try:
            token = self._validator.validate(auth_match["token"])
        except InvalidToken as exc:
            log.debug("OAUTHBEARER token refused: %s", exc.reason)
            status = "invalid_token" if exc.scope is None else "insufficient_scope"
            error = f'{{"status":"{status}"'
            if exc.scope is not None:
                error += f', "scope":"{exc.scope}"'
            self._error = error + "}"
            return self._error.encode()
        authorization_id = match["authzid"] or ""
        if authorization_id and authorization_id != token.principal_name:
            raise SaslAuthenticationFailed(
                f"Authentication failed: Client requested an authorization id ({authorization_id}) that is "
                f"different from the token's principal name ({token.principal_name})"
            )
        # The unsecured validator accepts every extension, as Kafka's does.
        self.extensions = properties
        self._token = token
        return b""


def unsecured_token(claims: Mapping[str, Any]) -> str:
    """An unsecured JWS for ``claims`` (header {"alg":"none"}), in the standard Base64 alphabet without padding
    that Kafka's validator decodes: for tests and the CLI."""

    def encode(document: Mapping[str, Any]) -> str:
        return base64.b64encode(json.dumps(document, separators=(",", ":")).encode()).decode().rstrip("=")

    return f"{encode({'alg': 'none'})}.{encode(claims)}."
