"""The SASL exchange, request by request, against kbroker and Apache Kafka 4.4 configured the same way.

Both brokers get a SASL_PLAINTEXT listener (PLAIN with two JAAS users, SCRAM-SHA-256 without users) and a REAUTH
listener whose sessions last REAUTH_MS (KIP-368), with ``connection.failed.authentication.delay.ms=0`` so a closed
connection is seen at once. Each sequence below is sent to both, one fresh connection per sequence; what comes
back (every answer's fields except those that name the broker itself, or "closed" when the broker ended the
connection instead of answering) must be the same, answer for answer.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from compat.apache_kafka import ApacheKafka, KafkaUnavailable
from kbroker.security.sasl.oauthbearer import unsecured_token
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.framing import decode_response
from protocol.messages.alter_user_scram_credentials_request import AlterUserScramCredentialsRequest
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.sasl_authenticate_request import SaslAuthenticateRequest
from protocol.messages.sasl_handshake_request import SaslHandshakeRequest

PLAIN_JAAS = (
    'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret" user_bob="bob-secret";'
)
SCRAM_JAAS = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
# Kafka's own login for the broker needs a token subject; both brokers validate clients' tokens unsecured.
OAUTH_JAAS = (
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
    'unsecuredLoginStringClaim_sub="broker";'
)
REAUTH_MS = 1500
USERS = {"alice": "alice-secret", "bob": "bob-secret"}
SCRAM_SALT = b"a salt for tests"
SCRAM_ITERATIONS = 4096
CLIENT_NONCE = "clientnonce0123456789"
LISTENERS = {"SASL_PLAINTEXT": "SASL_PLAINTEXT", "REAUTH": "SASL_PLAINTEXT"}
SETTINGS = {
    "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,OAUTHBEARER",
    "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
    "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": SCRAM_JAAS,
    "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config": OAUTH_JAAS,
    "listener.name.reauth.plain.sasl.jaas.config": PLAIN_JAAS,
    "listener.name.reauth.scram-sha-256.sasl.jaas.config": SCRAM_JAAS,
    "listener.name.reauth.oauthbearer.sasl.jaas.config": OAUTH_JAAS,
    "listener.name.reauth.connections.max.reauth.ms": str(REAUTH_MS),
    "sasl.server.max.receive.size": "4096",
    "connection.failed.authentication.delay.ms": "0",
}
# Fields that describe the broker rather than the exchange: left out of the comparison.
BROKER_FIELDS = {"api_keys", "supported_features", "finalized_features", "finalized_features_epoch", "brokers"}
BROKER_FIELDS |= {
    "cluster_id",
    "controller_id",
    "throttle_time_ms",
    "zk_migration_ready",
    "cluster_authorized_operations",
}
CLOSED = "closed"
API_VERSIONS = 18


@dataclass(frozen=True)
class Endpoints:
    """Where each listener of one broker is."""

    name: str
    addresses: dict[str, str]


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    node = ApacheKafka(tmp_path_factory.mktemp("kafka-sasl"), SETTINGS, extra_listeners=LISTENERS, heap="512m")
    try:
        node.start()
    except KafkaUnavailable as exc:
        pytest.skip(f"Apache Kafka cannot run here: {exc}")
    try:
        create_scram_users(node.bootstrap)
        yield Endpoints("kafka", {name: f"127.0.0.1:{port}" for name, port in node.extra_ports.items()})
    finally:
        node.stop()


@pytest.fixture(scope="module")
def kbroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    settings = {
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,REAUTH://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,REAUTH:SASL_PLAINTEXT",
        **SETTINGS,
    }
    with RunningBroker(tmp_path_factory.mktemp("kbroker-sasl"), settings) as running:
        create_scram_users(running.bootstrap)
        yield Endpoints("kbroker", {name: running.bootstrap_for(name) for name in LISTENERS})


def create_scram_users(plaintext: str) -> None:
    """alice and bob get SCRAM-SHA-256 credentials through AlterUserScramCredentials, as an admin would."""
    upsertions = [
        AlterUserScramCredentialsRequest.ScramCredentialUpsertion(
            name=user,
            mechanism=1,  # SCRAM-SHA-256
            iterations=SCRAM_ITERATIONS,
            salt=SCRAM_SALT,
            salted_password=hashlib.pbkdf2_hmac("sha256", password.encode(), SCRAM_SALT, SCRAM_ITERATIONS),
        )
        for user, password in USERS.items()
    ]
    with WireClient(plaintext) as client:
        answer = client.request(AlterUserScramCredentialsRequest(deletions=[], upsertions=upsertions), 0)
    assert [result.error_code for result in answer.results] == [ErrorCode.NONE] * len(USERS)


# --- what is sent, and what is recorded of each answer ----------------------------------------------------------


def fields(message: Any) -> Any:
    """A decoded answer as plain data, without the fields that name the broker."""
    if isinstance(message, list):
        return [fields(item) for item in message]
    names = getattr(message, "FIELDS", None)
    if names is None:
        return message
    return {name: fields(getattr(message, name)) for name in names if name not in BROKER_FIELDS}


Action = Callable[[WireClient], Any]


def send(body: Any, version: int) -> Action:
    return lambda client: (type(body).__name__, fields(client.request(body, version)))


def token(raw: bytes) -> Action:
    """A bare size-prefixed token, as after SaslHandshake v0."""
    return lambda client: ("token", client.exchange_token(raw))


def frame(raw: bytes) -> Action:
    """Arbitrary bytes as one size-prefixed frame; the answer (if any) is not decoded."""

    def act(client: WireClient) -> Any:
        return ("frame", client.exchange_token(raw))

    return act


def raw(data: bytes) -> Action:
    """Bytes as they are (a size prefix and whatever follows, or not), then the next frame back, if any."""

    def act(client: WireClient) -> Any:
        client._sock.sendall(data)
        return ("raw", bytes(client._next_frame()))

    return act


def future_api_versions(version: int = 9) -> Action:
    """ApiVersions in a version no broker knows yet (v0 header, empty body): answered in v0 (KIP-511)."""

    def act(client: WireClient) -> Any:
        header = API_VERSIONS.to_bytes(2, "big") + version.to_bytes(2, "big") + (77).to_bytes(4, "big")
        answer = client.exchange_token(header + b"\xff\xff")  # a null client id
        correlation_id, body = decode_response(answer, API_VERSIONS, 0)
        return ("ApiVersionsRequest", correlation_id, fields(body))

    return act


def pause(seconds: float) -> Action:
    def act(client: WireClient) -> Any:
        time.sleep(seconds)
        return ("paused", seconds)

    return act


def api_versions(name: str = "wire-test", version: int = 3) -> Action:
    return send(ApiVersionsRequest(client_software_name=name, client_software_version="1"), version)


def handshake(mechanism: str = "PLAIN", version: int = 1) -> Action:
    return send(SaslHandshakeRequest(mechanism=mechanism), version)


def plain(user: str = "alice", password: str = "alice-secret", version: int = 2, authzid: str = "") -> Action:
    return send(SaslAuthenticateRequest(auth_bytes=f"{authzid}\0{user}\0{password}".encode()), version)


def authenticate_bytes(raw: bytes, version: int = 2) -> Action:
    return send(SaslAuthenticateRequest(auth_bytes=raw), version)


def metadata(*topics: str) -> Action:
    request = MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(name=name) for name in topics], allow_auto_topic_creation=False
    )
    return send(request, 12)


class Scram:
    """A SCRAM-SHA-256 client (RFC 5802): two SaslAuthenticate v2 requests, the answers recorded without their
    random parts (the server nonce's length, not its value; whether the server's signature verifies)."""

    def __init__(self, user: str, password: str, authzid: str = "", first: str | None = None) -> None:
        self.password = password
        self.bare = f"n={user},r={CLIENT_NONCE}"
        self.first_message = first if first is not None else f"n,{'a=' + authzid if authzid else ''},{self.bare}"
        self.server_first = ""

    def first(self) -> Action:
        def act(client: WireClient) -> Any:
            answer = client.request(SaslAuthenticateRequest(auth_bytes=self.first_message.encode()), 2)
            recorded = fields(answer)
            if answer.error_code == ErrorCode.NONE:
                self.server_first = answer.auth_bytes.decode()
                parts = dict(part.split("=", 1) for part in self.server_first.split(","))
                recorded["auth_bytes"] = {
                    "nonce starts with the client's": parts["r"].startswith(CLIENT_NONCE),
                    # Both: 130 random bits in base 36, 25 or 26 characters.
                    # 130 random bits in base 36: at most 26 characters (fewer 41% of the time)
                    "server nonce in base 36, at most 26 characters": 0 < len(parts["r"]) - len(CLIENT_NONCE) <= 26
                    and parts["r"][len(CLIENT_NONCE) :].isalnum(),
                    "salt": base64.b64decode(parts["s"]),
                    "iterations": int(parts["i"]),
                }
            return ("scram client-first", recorded)

        return act

    def final(self, nonce_suffix: str = "", proof: bytes | None = None) -> Action:
        def act(client: WireClient) -> Any:
            parts = dict(part.split("=", 1) for part in self.server_first.split(","))
            salted = hashlib.pbkdf2_hmac(
                "sha256", self.password.encode(), base64.b64decode(parts["s"]), int(parts["i"])
            )
            client_key = hmac.new(salted, b"Client Key", "sha256").digest()
            without_proof = f"c=biws,r={parts['r']}{nonce_suffix}"
            message = f"{self.bare},{self.server_first},{without_proof}".encode()
            signature = hmac.new(hashlib.sha256(client_key).digest(), message, "sha256").digest()
            computed = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
            final = f"{without_proof},p={base64.b64encode(proof if proof is not None else computed).decode()}"
            answer = client.request(SaslAuthenticateRequest(auth_bytes=final.encode()), 2)
            recorded = fields(answer)
            if answer.error_code == ErrorCode.NONE:
                server_key = hmac.new(salted, b"Server Key", "sha256").digest()
                expected = b"v=" + base64.b64encode(hmac.new(server_key, message, "sha256").digest())
                recorded["auth_bytes"] = "server signature verified" if answer.auth_bytes == expected else "wrong"
            return ("scram client-final", recorded)

        return act


def scram(user: str = "alice", password: str = "alice-secret", **final: Any) -> list[Action]:
    exchange = Scram(user, password)
    return [handshake("SCRAM-SHA-256"), exchange.first(), exchange.final(**final)]


def oauth_message(claims: dict[str, Any] | None = None, authzid: str = "", scheme: str = "Bearer") -> bytes:
    now = int(time.time())
    token = unsecured_token(claims if claims is not None else {"sub": "alice", "iat": now - 10, "exp": now + 3600})
    return f"n,{'a=' + authzid if authzid else ''},\x01auth={scheme} {token}\x01\x01".encode()


def oauth(raw: bytes) -> Action:
    """A SaslAuthenticate v2 of OAUTHBEARER; a session lifetime is recorded in whole minutes (the token's exp)."""

    def act(client: WireClient) -> Any:
        recorded = fields(client.request(SaslAuthenticateRequest(auth_bytes=raw), 2))
        recorded["session_lifetime_ms"] = round(recorded["session_lifetime_ms"] / 60000)
        return ("oauth", recorded)

    return act


def login(user: str = "alice", password: str = "alice-secret") -> list[Action]:
    return [handshake(), plain(user, password)]


def run(address: str, actions: list[Action]) -> list[Any]:
    """Every action's outcome on one connection, until the broker closes it ("closed")."""
    outcomes: list[Any] = []
    with WireClient(address, timeout=10) as client:
        for action in actions:
            try:
                outcomes.append(action(client))
            except (ConnectionError, OSError) as exc:
                if isinstance(exc, socket.timeout):  # neither an answer nor a close: a hung exchange
                    outcomes.append("no answer within 10 s")
                else:
                    outcomes.append(CLOSED)
                break
    return outcomes


# --- the sequences -------------------------------------------------------------------------------------------

SEQUENCES: dict[str, tuple[str, list[Action]]] = {
    "plain login then requests": ("SASL_PLAINTEXT", [api_versions(), *login(), metadata()]),
    "SaslAuthenticate v0 and v1": ("SASL_PLAINTEXT", [handshake(), plain(version=0), metadata()]),
    "SaslAuthenticate v1 success": ("SASL_PLAINTEXT", [handshake(), plain(version=1), metadata()]),
    "request before the handshake": ("SASL_PLAINTEXT", [metadata(), metadata()]),
    "SaslAuthenticate before the handshake": ("SASL_PLAINTEXT", [plain(), metadata()]),
    "second ApiVersions": ("SASL_PLAINTEXT", [api_versions(), api_versions(), metadata()]),
    "unsupported ApiVersions version then another": (
        "SASL_PLAINTEXT",
        [future_api_versions(), api_versions(), *login()],
    ),
    "invalid ApiVersions then another": (
        "SASL_PLAINTEXT",
        [api_versions(name="bad name!"), api_versions(), *login()],
    ),
    "ApiVersions after the handshake": ("SASL_PLAINTEXT", [handshake(), api_versions(), metadata()]),
    "unsupported mechanism": ("SASL_PLAINTEXT", [handshake("GSSAPI"), metadata()]),
    "mechanism names are case-sensitive": ("SASL_PLAINTEXT", [handshake("plain"), metadata()]),
    "unsupported mechanism with handshake v0": ("SASL_PLAINTEXT", [handshake("SCRAM-SHA-512", 0), metadata()]),
    "wrong password": ("SASL_PLAINTEXT", [handshake(), plain(password="wrong"), metadata()]),
    "wrong password, SaslAuthenticate v0": ("SASL_PLAINTEXT", [handshake(), plain(password="x", version=0)]),
    "unknown user": ("SASL_PLAINTEXT", [handshake(), plain("mallory"), metadata()]),
    "empty password": ("SASL_PLAINTEXT", [handshake(), plain(password=""), metadata()]),
    "empty user": ("SASL_PLAINTEXT", [handshake(), plain(user=""), metadata()]),
    "authorization id of another user": ("SASL_PLAINTEXT", [handshake(), plain(authzid="bob"), metadata()]),
    "authorization id of the user": ("SASL_PLAINTEXT", [handshake(), plain(authzid="alice"), metadata()]),
    "PLAIN token of one part": ("SASL_PLAINTEXT", [handshake(), authenticate_bytes(b"alice"), metadata()]),
    "PLAIN token of four parts": ("SASL_PLAINTEXT", [handshake(), authenticate_bytes(b"\0a\0b\0c"), metadata()]),
    "empty token": ("SASL_PLAINTEXT", [handshake(), authenticate_bytes(b""), metadata()]),
    "request during authentication": ("SASL_PLAINTEXT", [handshake(), metadata("t"), metadata()]),
    "second handshake during authentication": ("SASL_PLAINTEXT", [handshake(), handshake(), metadata()]),
    "SCRAM unknown user": ("SASL_PLAINTEXT", [handshake("SCRAM-SHA-256"), authenticate_bytes(b"n,,n=nobody,r=abc")]),
    "SCRAM garbage client-first": ("SASL_PLAINTEXT", [handshake("SCRAM-SHA-256"), authenticate_bytes(b"\xff\x00x")]),
    "handshake v0 then raw token": ("SASL_PLAINTEXT", [handshake(version=0), token(b"\0bob\0bob-secret"), metadata()]),
    "handshake v0 then a wrong raw token": ("SASL_PLAINTEXT", [handshake(version=0), token(b"\0bob\0x"), metadata()]),
    "handshake v0 then a Kafka request": ("SASL_PLAINTEXT", [handshake(version=0), metadata()]),
    "garbage first frame": ("SASL_PLAINTEXT", [frame(b"\x60\x82\x01\x02garbage"), metadata()]),
    "empty first frame": ("SASL_PLAINTEXT", [frame(b""), metadata()]),
    "unknown api key first": ("SASL_PLAINTEXT", [frame(b"\x03\xe7\x00\x00\x00\x00\x00\x01\xff\xff"), metadata()]),
    "frame above sasl.server.max.receive.size": (
        "SASL_PLAINTEXT",
        [handshake(), plain(password="x" * 5000), metadata()],
    ),
    "negative size prefix": ("SASL_PLAINTEXT", [raw(b"\xff\xff\xff\xfe" + b"x" * 10)]),
    "huge size prefix": ("SASL_PLAINTEXT", [raw(b"\x7f\xff\xff\xff" + b"x" * 10)]),
    "huge size prefix after the handshake": ("SASL_PLAINTEXT", [handshake(), raw(b"\x40\x00\x00\x00")]),
    "raw token above sasl.server.max.receive.size": ("SASL_PLAINTEXT", [handshake(version=0), token(b"x" * 5000)]),
    "SaslAuthenticate after authentication": (
        "SASL_PLAINTEXT",
        [*login(), authenticate_bytes(b"x"), handshake(), metadata()],
    ),
    # SCRAM-SHA-256 (users created through AlterUserScramCredentials) and OAUTHBEARER (unsecured tokens).
    "SCRAM login": ("SASL_PLAINTEXT", [*scram(), metadata()]),
    "SCRAM wrong password": ("SASL_PLAINTEXT", [*scram(password="wrong"), metadata()]),
    "SCRAM wrong nonce in client-final": ("SASL_PLAINTEXT", [*scram(nonce_suffix="x"), metadata()]),
    "SCRAM proof of the wrong length": ("SASL_PLAINTEXT", [*scram(proof=b"short"), metadata()]),
    "SCRAM authorization id of another user": (
        "SASL_PLAINTEXT",
        [handshake("SCRAM-SHA-256"), Scram("alice", "alice-secret", authzid="bob").first(), metadata()],
    ),
    "SCRAM token authentication extension": (
        "SASL_PLAINTEXT",
        [handshake("SCRAM-SHA-256"), authenticate_bytes(f"n,,n=alice,r={CLIENT_NONCE},tokenauth=true".encode())],
    ),
    "SCRAM client-final garbage": (
        "SASL_PLAINTEXT",
        [handshake("SCRAM-SHA-256"), Scram("alice", "x").first(), authenticate_bytes(b"c=biws"), metadata()],
    ),
    "SCRAM user name with an escape": (
        "SASL_PLAINTEXT",
        [handshake("SCRAM-SHA-256"), authenticate_bytes(f"n,,n=al=3Dice,r={CLIENT_NONCE}".encode()), metadata()],
    ),
    "SCRAM user name with a bad escape": (
        "SASL_PLAINTEXT",
        [handshake("SCRAM-SHA-256"), authenticate_bytes(f"n,,n=al=ice,r={CLIENT_NONCE}".encode()), metadata()],
    ),
    "OAUTHBEARER login": ("SASL_PLAINTEXT", [handshake("OAUTHBEARER"), oauth(oauth_message()), metadata()]),
    "OAUTHBEARER invalid token": (
        "SASL_PLAINTEXT",
        [handshake("OAUTHBEARER"), oauth(oauth_message({"iat": 1})), oauth(b"\x01"), metadata()],
    ),
    "OAUTHBEARER expired token": (
        "SASL_PLAINTEXT",
        [handshake("OAUTHBEARER"), oauth(oauth_message({"sub": "a", "iat": 1, "exp": 2})), oauth(b"\x01")],
    ),
    "OAUTHBEARER another token after the error": (
        "SASL_PLAINTEXT",
        [handshake("OAUTHBEARER"), oauth(oauth_message({"iat": 1})), oauth(oauth_message()), metadata()],
    ),
    "OAUTHBEARER malformed message": ("SASL_PLAINTEXT", [handshake("OAUTHBEARER"), oauth(b"n,,auth=x"), metadata()]),
    "OAUTHBEARER another scheme": (
        "SASL_PLAINTEXT",
        [handshake("OAUTHBEARER"), oauth(oauth_message(scheme="Basic")), metadata()],
    ),
    "OAUTHBEARER authorization id of another user": (
        "SASL_PLAINTEXT",
        [handshake("OAUTHBEARER"), oauth(oauth_message(authzid="bob")), metadata()],
    ),
    "OAUTHBEARER session bounded by the token": (
        "REAUTH",
        [handshake("OAUTHBEARER"), oauth(oauth_message()), metadata()],
    ),
    # KIP-368 re-authentication (sessions of REAUTH_MS).
    "SCRAM re-authentication": ("REAUTH", [*scram(), *scram(), metadata()]),
    "SCRAM re-authentication as another user": ("REAUTH", [*scram(), *scram("bob", "bob-secret"), metadata()]),
    "session lifetime and re-authentication": (
        "REAUTH",
        [*login(), *login(), metadata(), handshake(), metadata()],
    ),
    "re-authentication as another user": ("REAUTH", [*login(), *login("bob", "bob-secret"), metadata()]),
    "re-authentication with a wrong password": ("REAUTH", [*login(), *login(password="wrong"), metadata()]),
    "re-authentication with another mechanism": (
        "REAUTH",
        [*login(), handshake("SCRAM-SHA-256"), authenticate_bytes(b"n,,n=alice,r=abc"), metadata()],
    ),
    "another mechanism, then a request": ("REAUTH", [*login(), handshake("SCRAM-SHA-256"), metadata()]),
    "re-authentication with an unsupported mechanism": ("REAUTH", [*login(), handshake("GSSAPI"), metadata()]),
    "re-authentication with handshake v0": (
        "REAUTH",
        [*login(), handshake(version=0), token(b"\0alice\0alice-secret"), metadata()],
    ),
    "re-authentication token above sasl.server.max.receive.size": (
        "REAUTH",
        [*login(), handshake(), plain(password="x" * 5000), metadata()],
    ),
    "request during re-authentication": ("REAUTH", [*login(), handshake(), metadata("t"), metadata()]),
    "ApiVersions during re-authentication": ("REAUTH", [*login(), handshake(), api_versions(), metadata()]),
    "re-authentication after the session expired": (
        "REAUTH",
        [*login(), pause(REAUTH_MS / 1000 + 0.5), *login(), metadata()],
    ),
    "a request after the session expired": ("REAUTH", [*login(), pause(REAUTH_MS / 1000 + 0.5), metadata()]),
}


# Known differences, each to be fixed where it says (strict: the test fails once the difference is gone).
DIFFERENCES: dict[str, str] = {}  # none left: every sequence ends as Kafka's does


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.xfail(reason=DIFFERENCES[name], strict=True))
        if name in DIFFERENCES
        else name
        for name in SEQUENCES
    ],
)
def test_same_sasl_exchange_as_kafka(kafka: Endpoints, kbroker: Endpoints, name: str) -> None:
    listener, actions = SEQUENCES[name]
    expected = run(kafka.addresses[listener], actions)
    assert run(kbroker.addresses[listener], actions) == expected
