"""OAUTHBEARER with Kafka's unsecured JWS validator (kbroker/security/sasl/oauthbearer.py): the principal claim,
the scope, exp/iat with the allowed clock skew, the JSON error challenge answered by the client's \\x01, and the
malformed messages that fail at once with the generic text."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from kbroker.config_registry import ConfigError
from kbroker.security.sasl import SaslAuthenticationFailed, SaslExchangeAborted, SaslSettings, create_server
from kbroker.security.sasl.oauthbearer import OAuthBearerSaslServer, unsecured_token
from tests.security.scram_store import ControlledScramStore

NOW_MS = 1_700_000_000_000
NOW_S = NOW_MS // 1000
GENERIC = "Authentication failed during authentication due to invalid credentials with SASL mechanism OAUTHBEARER"
INVALID = '{"status":"invalid_token"}'


def server(**options: str) -> OAuthBearerSaslServer:
    settings = SaslSettings(
        plain_users={},
        scram_credentials=ControlledScramStore(),
        oauthbearer_options=options,
        clock_ms=lambda: NOW_MS,
    )
    made = create_server("OAUTHBEARER", settings)
    assert isinstance(made, OAuthBearerSaslServer)
    return made


def message(token: str, authzid: str = "", extensions: str = "") -> bytes:
    return f"n,{'a=' + authzid if authzid else ''},\x01auth=Bearer {token}\x01{extensions}\x01".encode()


def claims(**extra: Any) -> dict[str, Any]:
    return {"sub": "alice", "iat": NOW_S - 10, "exp": NOW_S + 3600, **extra}


def test_a_valid_token_authenticates_with_its_expiry() -> None:
    bearer = server()
    assert bearer.evaluate_response(message(unsecured_token(claims()), extensions="traceId=abc\x01")) == b""
    assert bearer.is_complete and bearer.authorization_id == "alice"
    assert bearer.credential_expiry_ms == (NOW_S + 3600) * 1000
    assert bearer.extensions == {"traceId": "abc"}


def test_principal_claim_name_and_required_scope_options() -> None:
    bearer = server(
        unsecuredValidatorPrincipalClaimName=" user ",
        unsecuredValidatorRequiredScope="read write",
        unsecuredValidatorScopeClaimName="scp",
    )
    token = unsecured_token(claims(user="bob", scp=["write", " read ", ""]))
    assert bearer.evaluate_response(message(token, authzid="bob")) == b""
    assert bearer.authorization_id == "bob"


def refused_with(bearer: OAuthBearerSaslServer, token: str, challenge: str) -> None:
    """The JSON error challenge, then the failure on the client's \\x01 with that JSON as the message."""
    assert bearer.evaluate_response(message(token)) == challenge.encode()
    assert not bearer.is_complete
    with pytest.raises(SaslAuthenticationFailed) as caught:
        bearer.evaluate_response(b"\x01")
    assert caught.value.message == challenge and not caught.value.is_generic


def b64(document: Any) -> str:
    return base64.b64encode(json.dumps(document).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "token",
    [
        unsecured_token(claims(exp=NOW_S - 1)),  # expired
        unsecured_token(claims(exp=NOW_S)),  # "on or after" the expiry
        unsecured_token(claims(iat=NOW_S + 60)),  # issued in the future
        unsecured_token(claims(iat=NOW_S + 7200)),  # expiry not after issue
        unsecured_token({"sub": "alice"}),  # no exp
        unsecured_token(claims(exp="soon")),  # exp of the wrong type
        unsecured_token(claims(sub=" ")),  # blank principal
        unsecured_token(claims(sub=7)),  # principal of the wrong type
        unsecured_token(claims(scope=5)),  # scope neither a string nor a list
        f"{b64({'alg': 'HS256'})}.{b64(claims())}.",  # signed algorithm
        f"{b64({'alg': 'none'})}.{b64(claims())}.c2ln",  # a signature
        f"{b64({'typ': 'JWT'})}.{b64(claims())}.",  # no alg
        f"{b64({'alg': 'none'})}.{b64(claims())}",  # two parts
        f"{b64({'alg': 'none'})}..{b64(claims())}",  # ".."
        f"{b64({'alg': 'none'})}.bm90IGpzb24.",  # "not json"
        f"{b64({'alg': 'none'})}.{b64(claims())}-_.",  # "-" and "_": Kafka decodes the standard alphabet only
    ],
)
def test_invalid_tokens_get_the_error_challenge_then_fail(token: str) -> None:
    refused_with(server(), token, INVALID)


def test_clock_skew_allows_a_just_expired_token() -> None:
    token = unsecured_token(claims(exp=NOW_S - 1))
    assert server(unsecuredValidatorAllowableClockSkewMs="2000").evaluate_response(message(token)) == b""
    refused_with(server(unsecuredValidatorAllowableClockSkewMs="1000"), token, INVALID)


def test_missing_scope_names_the_required_scope() -> None:
    bearer = server(unsecuredValidatorRequiredScope="read write")
    refused_with(
        bearer, unsecured_token(claims(scope="read")), '{"status":"insufficient_scope", "scope":"[read, write]"}'
    )


def test_another_token_may_follow_the_error_challenge() -> None:
    bearer = server()
    assert bearer.evaluate_response(message(unsecured_token(claims(exp=1)))) == INVALID.encode()
    assert bearer.evaluate_response(message(unsecured_token(claims()))) == b""
    assert bearer.authorization_id == "alice"


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"", "Invalid OAUTHBEARER client first message"),
        (b"\x01", "Invalid OAUTHBEARER client first message"),  # no error challenge was sent
        (b"n,,\x01\x01", "Invalid OAUTHBEARER client first message: 'auth' not specified"),
        (b"n,,\x01auth=Bearer\x01\x01", "Invalid OAUTHBEARER client first message: invalid 'auth' format"),
        (b"n,,auth=Bearer abc\x01\x01", "Invalid OAUTHBEARER client first message"),
    ],
)
def test_malformed_messages_fail_at_once_generically(raw: bytes, reason: str) -> None:
    with pytest.raises(SaslAuthenticationFailed) as caught:
        server().evaluate_response(raw)
    assert (caught.value.message, caught.value.reason) == (GENERIC, reason)


def test_a_scheme_other_than_bearer_aborts_the_exchange() -> None:
    # Kafka 4.3 throws on it ("No group with name Basic") and closes the connection without an answer.
    with pytest.raises(SaslExchangeAborted, match="scheme 'Basic'"):
        server().evaluate_response(b"n,,\x01auth=Basic abc\x01\x01")


def test_an_authzid_other_than_the_principal_is_told() -> None:
    with pytest.raises(SaslAuthenticationFailed) as caught:
        server().evaluate_response(message(unsecured_token(claims()), authzid="bob"))
    assert caught.value.message == (
        "Authentication failed: Client requested an authorization id (bob) that is different from the token's "
        "principal name (alice)"
    )


@pytest.mark.parametrize(
    "options, problem",
    [
        ({"unsecuredValidatorAllowableClockSkewMs": "-1"}, "Allowable clock skew millis must not be negative: -1"),
        ({"unsecuredValidatorAllowableClockSkewMs": "soon"}, 'For input string: "soon"'),
        ({"unsecuredValidatorRequiredScope": 'a "b"'}, 'Invalid scope value: "b"'),
    ],
)
def test_bad_validator_options_are_config_errors(options: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        server(**options)
    assert str(caught.value) == problem
