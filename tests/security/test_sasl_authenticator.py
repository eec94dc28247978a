"""kbroker/security/authenticator.py without a connection: the steps Kafka 4.3's SaslServerAuthenticator takes where
they are easy to get wrong (each also compared with a running Kafka in tests/kafka/test_sasl_exchange_kafka.py)."""

from __future__ import annotations

import pytest

from kbroker.security.authenticator import SaslAuthenticator, SaslListener, Stage, Step
from kbroker.security.sasl.plain import PlainSaslServer
from protocol.errors import ErrorCode
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.sasl_authenticate_request import SaslAuthenticateRequest
from protocol.messages.sasl_authenticate_response import SaslAuthenticateResponse
from protocol.messages.sasl_handshake_request import SaslHandshakeRequest
from tests.security.scram_store import ControlledScramStore

USERS = {"alice": "alice-secret"}
ALICE = b"\0alice\0alice-secret"
METADATA = MetadataRequest(topics=[], allow_auto_topic_creation=False)


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def authenticator(reauth_ms: int = 0, clock: Clock | None = None) -> SaslAuthenticator:
    listener = SaslListener(
        mechanisms=("PLAIN", "SCRAM-SHA-256"), plain_users=USERS, max_reauth_ms={"PLAIN": reauth_ms}
    )
    return SaslAuthenticator(listener, ControlledScramStore(), monotonic=clock or Clock())


def handshake(sasl: SaslAuthenticator, mechanism: str = "PLAIN", version: int = 1) -> Step:
    return sasl.on_request(17, version, SaslHandshakeRequest(mechanism=mechanism))


def authenticate(sasl: SaslAuthenticator, token: bytes = ALICE) -> Step:
    return sasl.on_request(36, 2, SaslAuthenticateRequest(auth_bytes=token))


def logged_in(reauth_ms: int = 0) -> SaslAuthenticator:
    sasl = authenticator(reauth_ms)
    handshake(sasl)
    authenticate(sasl)
    assert sasl.complete and sasl.principal == "User:alice"
    return sasl


def test_a_successful_authenticate_has_an_empty_message() -> None:
    sasl = authenticator()
    handshake(sasl)
    step = authenticate(sasl)
    assert isinstance(step.response, SaslAuthenticateResponse)
    assert (step.response.error_code, step.response.error_message, step.close) == (ErrorCode.NONE, "", False)


def test_an_invalid_api_versions_leaves_room_for_another() -> None:
    sasl = authenticator()
    invalid = ApiVersionsRequest(client_software_name="bad name!", client_software_version="1")
    assert sasl.on_request(18, 3, invalid) == Step(pass_through=True)
    assert sasl.stage is Stage.HANDSHAKE_OR_VERSIONS
    valid = ApiVersionsRequest(client_software_name="client", client_software_version="1")
    assert sasl.on_request(18, 3, valid) == Step(pass_through=True)
    assert sasl.on_request(18, 3, valid) == Step(close=True)  # a second valid one: closed at once, no delay


@pytest.mark.parametrize("stage", ["handshake", "authentication"])
def test_requests_out_of_turn_are_authentication_failures(stage: str) -> None:
    sasl = authenticator()
    if stage == "authentication":
        handshake(sasl)
    step = sasl.on_request(3, 12, METADATA)
    message = f"Unexpected Kafka request of type METADATA during SASL {stage}."
    expected = (ErrorCode.ILLEGAL_SASL_STATE, message) if stage == "authentication" else None
    assert step == Step(response=expected, close=True, failed=True)


def test_after_a_reauthentication_handshake_with_another_mechanism_anything_closes_unanswered() -> None:
    sasl = logged_in(reauth_ms=60_000)
    assert sasl.begin_reauthentication()
    assert handshake(sasl, "SCRAM-SHA-256").response.error_code == ErrorCode.NONE
    assert sasl.on_request(3, 12, METADATA) == Step(close=True, failed=True)


def test_a_reauthentication_handshake_with_a_mechanism_not_enabled_closes_unanswered() -> None:
    sasl = logged_in(reauth_ms=60_000)
    assert sasl.begin_reauthentication()
    assert handshake(sasl, "GSSAPI") == Step(close=True)
    first = authenticator()
    unsupported = handshake(first, "GSSAPI")  # a first authentication is told the enabled mechanisms
    assert (unsupported.response.error_code, unsupported.response.mechanisms) == (
        ErrorCode.UNSUPPORTED_SASL_MECHANISM,
        ["PLAIN", "SCRAM-SHA-256"],
    )
    assert (unsupported.close, unsupported.failed) == (True, True)


@pytest.mark.parametrize("version", [0, 1])
def test_a_mechanism_that_breaks_closes_unanswered(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, version: int
) -> None:
    def broken(self: PlainSaslServer, response: bytes) -> bytes:
        raise IndexError("a bug")

    monkeypatch.setattr(PlainSaslServer, "evaluate_response", broken)
    sasl = authenticator()
    handshake(sasl, version=version)
    step = sasl.on_raw_token(ALICE) if version == 0 else authenticate(sasl)
    assert step == Step(close=True)
    assert sasl.principal is None
    assert [r.getMessage() for r in caplog.records if r.exc_info] == ["SASL PLAIN mechanism failed unexpectedly"]
