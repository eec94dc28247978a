"""PLAIN (kbroker/security/sasl/plain.py): RFC 4616's message against the JAAS users, with Kafka's PlainSaslServer
texts for every failure, all told to the client as they are."""

from __future__ import annotations

import pytest

from kbroker.security.sasl import SaslAuthenticationFailed, SaslSettings, create_server
from tests.security.scram_store import ControlledScramStore

USERS = {"alice": "alice-secret", "admin": "admin-secret"}


def server() -> object:
    return create_server("PLAIN", SaslSettings(plain_users=USERS, scram_credentials=ControlledScramStore()))


@pytest.mark.parametrize("message", [b"\0alice\0alice-secret", b"alice\0alice\0alice-secret"])
def test_valid_logins(message: bytes) -> None:
    plain = server()
    assert plain.evaluate_response(message) == b""  # type: ignore[attr-defined]
    assert plain.is_complete and plain.authorization_id == "alice"  # type: ignore[attr-defined]
    assert plain.credential_expiry_ms is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "message, expected",
    [
        (b"\0alice\0wrong", "Authentication failed: Invalid username or password"),
        (b"\0mallory\0alice-secret", "Authentication failed: Invalid username or password"),
        (b"\0\0alice-secret", "Authentication failed: username not specified"),
        (b"\0alice\0", "Authentication failed: password not specified"),
        (b"alice-secret", "Invalid SASL/PLAIN response: expected 3 tokens, got 1"),
        (b"alice\0alice-secret", "Invalid SASL/PLAIN response: expected 3 tokens, got 2"),
        (b"\0alice\0alice-secret\0", "Invalid SASL/PLAIN response: expected 3 tokens, got 4"),
        (b"", "Invalid SASL/PLAIN response: expected 3 tokens, got 1"),
        (
            b"admin\0alice\0alice-secret",
            "Authentication failed: Client requested an authorization id that is different from username",
        ),
        (b"\0alice\0alice-secre\xff", "Authentication failed: Invalid username or password"),
    ],
)
def test_failures_carry_kafkas_message(message: bytes, expected: str) -> None:
    plain = server()
    with pytest.raises(SaslAuthenticationFailed) as caught:
        plain.evaluate_response(message)  # type: ignore[attr-defined]
    assert caught.value.message == expected
    assert caught.value.message_for(reauthenticating=True) == expected  # told as is, whatever the stage
    assert not plain.is_complete  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError):
        plain.authorization_id  # type: ignore[attr-defined]  # noqa: B018


def test_unknown_mechanism_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported SASL mechanism 'GSSAPI'"):
        create_server("GSSAPI", SaslSettings(plain_users={}, scram_credentials=ControlledScramStore()))
