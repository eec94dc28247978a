"""SCRAM-SHA-256/512 on the server side (kbroker/security/sasl/scram.py): RFC 7677's and RFC 5802's test vectors,
a full SCRAM-SHA-512 exchange driven by a client written here, and every failure with Kafka's message (the
generic one for an unknown user, a wrong proof and a malformed message; the explicit one for an authorization id
that is not the user)."""

from __future__ import annotations

import base64

import pytest

from kbroker.security.sasl import SaslAuthenticationFailed, SaslExchangeAborted, SaslSettings, create_server
from kbroker.security.sasl.scram import (
    SCRAM_SHA_256,
    SCRAM_SHA_512,
    ClientFirstMessage,
    ScramMechanism,
    ScramSaslServer,
    auth_message,
    client_proof,
    credential_from_password,
    hmac_digest,
    salted_password,
    server_key,
    username_of,
)
from tests.security.scram_store import ControlledScramStore

GENERIC_256 = "Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-256"
GENERIC_512 = "Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"


def store_with(user: str, mechanism: ScramMechanism, password: str, salt: bytes | None = None) -> ControlledScramStore:
    store = ControlledScramStore()
    store.put(user, mechanism.name, credential_from_password(mechanism, password, 4096, salt))
    return store


def test_rfc7677_scram_sha_256_vector() -> None:
    """RFC 7677 section 3: user "user", password "pencil", the exact server messages."""
    store = store_with("user", SCRAM_SHA_256, "pencil", base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="))
    server = ScramSaslServer(SCRAM_SHA_256, store, server_nonce=lambda: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    first = server.evaluate_response(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first == b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    assert not server.is_complete
    final = server.evaluate_response(
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert server.is_complete
    assert server.authorization_id == "user"
    assert server.credential_expiry_ms is None


def test_rfc5802_sha1_vector_checks_the_formatter() -> None:
    """RFC 5802 section 5 (SCRAM-SHA-1): the proof and the server signature from the same formatter."""
    sha1 = ScramMechanism("SCRAM-SHA-1", "sha1", 0)
    salted = salted_password(sha1, "pencil", base64.b64decode("QSXCR+Q6sek8bf92"), 4096)
    message = auth_message(
        "n=user,r=fyko+d2lbbFgONRv9qkxdawL",
        "r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096",
        "c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j",
    )
    assert base64.b64encode(client_proof(sha1, salted, message)) == b"v0X8v3Bz2T0CJGbJQyF0X+HI4Ts="
    assert base64.b64encode(hmac_digest(sha1, server_key(sha1, salted), message)) == b"rmF9pqV8S7suAoZWja4dJRkFsKQ="


class Client:
    """A SCRAM client, enough to drive the server: the first and final messages for a password."""

    def __init__(self, mechanism: ScramMechanism, user: str, password: str, nonce: str = "clientnonce123") -> None:
        self.mechanism, self.user, self.password, self.nonce = mechanism, user, password, nonce
        self.bare = f"n={user},r={nonce}"

    def first(self, gs2: str = "n,,") -> bytes:
        return (gs2 + self.bare).encode()

    def final(self, server_first: bytes, password: str | None = None) -> tuple[bytes, bytes]:
        """(client-final, the server signature expected back)."""
        fields = dict(item.split("=", 1) for item in server_first.decode().split(","))
        salted = salted_password(
            self.mechanism, password or self.password, base64.b64decode(fields["s"]), int(fields["i"])
        )
        without_proof = f"c=biws,r={fields['r']}"
        message = auth_message(self.bare, server_first.decode(), without_proof)
        proof = base64.b64encode(client_proof(self.mechanism, salted, message)).decode()
        signature = hmac_digest(self.mechanism, server_key(self.mechanism, salted), message)
        return f"{without_proof},p={proof}".encode(), b"v=" + base64.b64encode(signature)


def settings(store: ControlledScramStore) -> SaslSettings:
    return SaslSettings(plain_users={}, scram_credentials=store)


def test_scram_sha_512_round_trip_through_create_server() -> None:
    store = ControlledScramStore()
    store.set_password("alice", "SCRAM-SHA-512", "secret", iterations=8192)
    server = create_server("SCRAM-SHA-512", settings(store))
    client = Client(SCRAM_SHA_512, "alice", "secret")
    server_first = server.evaluate_response(client.first())
    assert server_first.startswith(b"r=clientnonce123") and server_first.endswith(b",i=8192")
    final, expected_signature = client.final(server_first)
    assert server.evaluate_response(final) == expected_signature
    assert server.is_complete and server.authorization_id == "alice"


def test_escaped_user_names_and_a_matching_authzid() -> None:
    store = ControlledScramStore()
    store.set_password("a=b,c", "SCRAM-SHA-256", "pw")
    store.set_password("alice", "SCRAM-SHA-256", "pw")
    assert username_of("a=3Db=2Cc") == "a=b,c"
    server = create_server("SCRAM-SHA-256", settings(store))
    client = Client(SCRAM_SHA_256, "a=3Db=2Cc", "pw")
    final, signature = client.final(server.evaluate_response(client.first()))
    assert server.evaluate_response(final) == signature
    assert server.authorization_id == "a=b,c"
    server = create_server("SCRAM-SHA-256", settings(store))
    client = Client(SCRAM_SHA_256, "alice", "pw")
    final, signature = client.final(server.evaluate_response(client.first("n,a=alice,")))
    assert server.evaluate_response(final) == signature
    # Kafka compares the authzid as sent (still escaped) with the decoded user name: an escaped one never equals.
    failure = fail(create_server("SCRAM-SHA-256", settings(store)), b"n,a=a=3Db=2Cc,n=a=3Db=2Cc,r=abc")
    assert not failure.is_generic


def test_extensions_are_part_of_the_auth_message_in_kafkas_order() -> None:
    parsed = ClientFirstMessage.parse("n,,m=reserved,n=bob,r=abc,b=1,a=2,b=3")
    assert parsed.extensions == {"b": "3", "a": "2"}
    # Kafka rebuilds the bare message from a HashMap of the extensions (java.util.HashMap prints {a=2, b=3} for
    # these) and drops the reserved m=.
    assert parsed.bare() == "n=bob,r=abc,a=2,b=3"


def fail(server: ScramSaslServer | object, message: bytes) -> SaslAuthenticationFailed:
    with pytest.raises(SaslAuthenticationFailed) as caught:
        server.evaluate_response(message)  # type: ignore[attr-defined]
    return caught.value


def test_unknown_user_fails_on_the_first_message_with_the_generic_message() -> None:
    server = create_server("SCRAM-SHA-256", settings(ControlledScramStore()))
    failure = fail(server, b"n,,n=nobody,r=abc")
    assert failure.message == GENERIC_256
    assert failure.is_generic and failure.reason == "Authentication failed: Invalid user credentials"
    assert failure.message_for(reauthenticating=True) == GENERIC_256.replace(
        "during authentication", "during re-authentication"
    )
    assert not server.is_complete


def test_a_credential_of_the_other_mechanism_is_not_used() -> None:
    store = store_with("alice", SCRAM_SHA_256, "secret")
    assert fail(create_server("SCRAM-SHA-512", settings(store)), b"n,,n=alice,r=abc").message == GENERIC_512


def test_wrong_password_fails_on_the_final_message_with_the_same_message() -> None:
    store = store_with("alice", SCRAM_SHA_256, "secret")
    server = create_server("SCRAM-SHA-256", settings(store))
    client = Client(SCRAM_SHA_256, "alice", "secret")
    final, _ = client.final(server.evaluate_response(client.first()), password="wrong")
    failure = fail(server, final)
    assert (failure.message, failure.reason) == (GENERIC_256, "Invalid client credentials")
    assert not server.is_complete
    # Failed is final: nothing more is accepted.
    assert fail(server, client.first()).message == "Unexpected challenge in Sasl server state failed"


@pytest.mark.parametrize(
    "first, reason",
    [
        (b"", "Invalid SCRAM client first message format: "),
        (b"y,,n=alice,r=abc", "Invalid SCRAM client first message format: y,,n=alice,r=abc"),
        (b"n,,n=alice", "Invalid SCRAM client first message format: n,,n=alice"),
        (b"n,,n=al=ice,r=abc", "Invalid SCRAM client first message format: n,,n=al=ice,r=abc"),
        (b"n,,n=alice,r=a\xffc", "Invalid SCRAM client first message format: n,,n=alice,r=a\ufffdc"),
        (b"n,,n=alice,r=abc,tokenauth=true", "Token Authentication failed: Invalid tokenId : alice"),
    ],
)
def test_malformed_first_messages_fail_generically(first: bytes, reason: str) -> None:
    store = store_with("alice", SCRAM_SHA_256, "secret")
    failure = fail(create_server("SCRAM-SHA-256", settings(store)), first)
    assert (failure.message, failure.reason) == (GENERIC_256, reason)


def test_an_authorization_id_other_than_the_user_is_told() -> None:
    store = store_with("alice", SCRAM_SHA_256, "secret")
    failure = fail(create_server("SCRAM-SHA-256", settings(store)), b"n,a=bob,n=alice,r=abc")
    assert failure.message == (
        "Authentication failed: Client requested an authorization id that is different from username"
    )
    assert not failure.is_generic


@pytest.mark.parametrize(
    "final, reason",
    [
        (b"c=biws,r=WRONG,p=AAAA", "Invalid client nonce in the final client message."),
        # Anything before the nonce is refused too (Kafka 4.3's exact match, CVE-2024-56128; librdkafka before
        # 2.6.1 repeats the client nonce there).
        (b"c=biws,r=abc{nonce},p=AAAA", "Invalid client nonce in the final client message."),
        (b"garbage", "Invalid SCRAM client final message format: garbage"),
    ],
)
def test_bad_final_messages_fail_generically(final: bytes, reason: str) -> None:
    store = store_with("alice", SCRAM_SHA_256, "secret")
    server = create_server("SCRAM-SHA-256", settings(store))
    server_first = server.evaluate_response(b"n,,n=alice,r=abc")
    nonce = server_first.split(b",")[0][2:]
    failure = fail(server, final.replace(b"{nonce}", nonce))
    assert (failure.message, failure.reason) == (GENERIC_256, reason)


@pytest.mark.parametrize(("proof", "length"), [(b"", 0), (b"AAAA", 3)])
def test_a_proof_of_the_wrong_length_aborts_the_exchange(proof: bytes, length: int) -> None:
    # Kafka's xor throws on it and closes the connection without an answer: the authenticator does the same.
    store = store_with("alice", SCRAM_SHA_256, "secret")
    server = create_server("SCRAM-SHA-256", settings(store))
    nonce = server.evaluate_response(b"n,,n=alice,r=abc").split(b",")[0][2:]
    with pytest.raises(SaslExchangeAborted, match=f"SCRAM client proof of {length} bytes, 32 expected"):
        server.evaluate_response(b"c=biws,r=" + nonce + b",p=" + proof)


def test_iterations_below_the_minimum_are_refused_at_login() -> None:
    store = ControlledScramStore()
    store.put("old", SCRAM_SHA_256.name, credential_from_password(SCRAM_SHA_256, "pw", 1000))
    failure = fail(create_server("SCRAM-SHA-256", settings(store)), b"n,,n=old,r=abc")
    reason = "Iterations 1000 is less than the minimum 4096 for SCRAM-SHA-256"
    assert (failure.message, failure.reason) == (GENERIC_256, reason)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kafka_pythons_scram_client_logs_in(mechanism: str) -> None:
    """An independent client: kafka-python 3's ScramClient checks the server's signature itself."""
    scram_client = pytest.importorskip("kafka.net.sasl.scram", reason="kafka-python 3 is not installed").ScramClient
    store = ControlledScramStore()
    store.set_password("alice", mechanism, "wonderland")
    server = create_server(mechanism, settings(store))
    client = scram_client("alice", "wonderland", mechanism)
    client.process_server_first_message(server.evaluate_response(client.first_message()))
    client.process_server_final_message(server.evaluate_response(client.final_message()))  # raises if wrong
    assert server.is_complete and server.authorization_id == "alice"
