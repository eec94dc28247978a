"""Fuzzing the SASL exchange: random, truncated and mutated authentication bytes never crash or hang the broker.

Two levels:

- In process, sans-I/O: each mechanism's server (PLAIN, SCRAM-SHA-256, OAUTHBEARER) fed random bytes and
  truncations or mutations of valid client messages, and kbroker/security/authenticator.py's SaslAuthenticator
  driven through random orders of requests, tokens, stages and clock jumps exactly as the connection drives it.
  Every outcome is a clean answer or SaslAuthenticationFailed / a close step; no other exception escapes, every
  answer encodes, and no bad input ever yields an authenticated principal.
- Over the wire, against a live broker with a SASL_PLAINTEXT listener: a few hundred connections sending random
  bytes, truncated frames, frames cut mid-way then closed, garbage after SaslHandshake v0 and huge size prefixes.
  Each connection is answered or closed within a bound (the client half-closes, so the broker always sees the end),
  the broker logs no traceback and no error, and a good client still authenticates afterwards. The same bytes on a
  SASL_SSL listener: where the ClientHello belongs, after a ClientHello cut short, and inside an established TLS
  session ended by close_notify.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import hmac
import logging
import socket
import ssl
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbroker.apis.error_responses import error_response
from kbroker.security import certs
from kbroker.security.authenticator import SaslAuthenticator, SaslListener, Step
from kbroker.security.sasl import SaslAuthenticationFailed, SaslExchangeAborted, SaslServer, SaslSettings, create_server
from kbroker.security.sasl.oauthbearer import unsecured_token
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.framing import encode_request, encode_response
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.sasl_authenticate_request import SaslAuthenticateRequest
from protocol.messages.sasl_authenticate_response import SaslAuthenticateResponse
from protocol.messages.sasl_handshake_request import SaslHandshakeRequest
from protocol.messages.sasl_handshake_response import SaslHandshakeResponse
from tests.security.scram_store import ControlledScramStore, set_password_over_the_wire

USERS = {"alice": "alice-secret", "bob": "bob-secret"}
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "OAUTHBEARER")
SCRAM = "SCRAM-SHA-256"
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def scram_store() -> ControlledScramStore:
    store = ControlledScramStore()
    for user, password in USERS.items():
        store.set_password(user, SCRAM, password)
    return store


def sasl_settings(store: ControlledScramStore) -> SaslSettings:
    return SaslSettings(plain_users=USERS, scram_credentials=store)


# --- valid client messages, and what is done to them ----------------------------------------------------------


def plain_message(user: str = "alice", password: str = "alice-secret", authzid: str = "") -> bytes:
    return f"{authzid}\0{user}\0{password}".encode()


def oauth_message(subject: str = "alice") -> bytes:
    return _oauth_message(subject)


@functools.cache  # one token per subject for the whole run: a valid token's bytes must not change mid-test
def _oauth_message(subject: str) -> bytes:
    now = int(time.time())
    token = unsecured_token({"sub": subject, "iat": now - 10, "exp": now + 3600})
    return f"n,,\x01auth=Bearer {token}\x01\x01".encode()


class ScramClient:
    """The client side of SCRAM-SHA-256 (RFC 5802), enough to make real client-first and client-final messages."""

    def __init__(self, user: str, password: str, nonce: str = "fuzzclientnonce") -> None:
        self.user, self.password, self.nonce = user, password, nonce
        self.bare = f"n={user},r={nonce}"

    def first(self) -> bytes:
        return f"n,,{self.bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        fields = dict(part.split("=", 1) for part in server_first.decode().split(","))
        salted = hashlib.pbkdf2_hmac("sha256", self.password.encode(), base64.b64decode(fields["s"]), int(fields["i"]))
        client_key = hmac.new(salted, b"Client Key", "sha256").digest()
        without_proof = f"c=biws,r={fields['r']}"
        message = f"{self.bare},{server_first.decode()},{without_proof}".encode()
        signature = hmac.new(hashlib.sha256(client_key).digest(), message, "sha256").digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


@st.composite
def mutated(draw: st.DrawFn, message: bytes) -> bytes:
    """``message`` truncated, with a byte flipped, bytes inserted or deleted, or a NUL/comma/= moved around.

    Everything is drawn before looking at ``message``, so the same draws fit a message that differs from run to
    run (a SCRAM client-final carries the server's random nonce)."""
    kind = draw(st.sampled_from(["truncate", "flip", "insert", "delete", "separator"]))
    where = draw(st.integers(0, 2**16))
    flip, count = draw(st.integers(1, 255)), draw(st.integers(1, 8))
    inserted = draw(st.binary(min_size=1, max_size=8))
    separator = draw(st.sampled_from([b"\0", b",", b"=", b"\x01", b"\xff", b"n=", b"p="]))
    data = bytearray(message)
    position = where % max(1, len(data))
    if kind == "truncate":
        return bytes(data[:position])
    if kind == "flip" and data:
        data[position] ^= flip
    elif kind == "insert":
        data[position:position] = inserted
    elif kind == "delete" and data:
        del data[position : position + count]
    else:
        data[position:position] = separator
    return bytes(data)


def evaluate(server: SaslServer, messages: list[bytes]) -> list[bytes | str]:
    """Feed ``messages`` in turn until the exchange fails or completes; what each gave back."""
    outcomes: list[bytes | str] = []
    for message in messages:
        try:
            outcomes.append(server.evaluate_response(message))
        except SaslAuthenticationFailed as failure:
            assert isinstance(failure.message, str) and failure.message
            outcomes.append("failed")
            break
        except SaslExchangeAborted:  # a message Kafka's mechanism throws on: closed without an answer
            outcomes.append("failed")
            break
        if server.is_complete:
            break
    return outcomes


def plain_is_valid(message: bytes) -> str | None:
    """The user a PLAIN message rightly authenticates (RFC 4616 and the JAAS users), else None."""
    parts = message.decode("utf-8", "replace").split("\0")
    if len(parts) != 3:
        return None
    authzid, user, password = parts
    if not user or USERS.get(user) != password or authzid not in ("", user):
        return None
    return user


# --- in process: each mechanism's server -------------------------------------------------------------------


@FUZZ
@given(mechanism=st.sampled_from(MECHANISMS), messages=st.lists(st.binary(max_size=300), min_size=1, max_size=3))
def test_random_bytes_never_authenticate(
    scram_store: ControlledScramStore, mechanism: str, messages: list[bytes]
) -> None:
    server = create_server(mechanism, sasl_settings(scram_store))
    evaluate(server, messages)
    assert not server.is_complete


@FUZZ
@given(data=st.data())
def test_mutated_plain_messages(scram_store: ControlledScramStore, data: st.DataObject) -> None:
    message = data.draw(mutated(plain_message(authzid=data.draw(st.sampled_from(["", "alice"])))))
    server = create_server("PLAIN", sasl_settings(scram_store))
    outcomes = evaluate(server, [message])
    expected_user = plain_is_valid(message)
    assert server.is_complete == (expected_user is not None), (message, outcomes)
    if expected_user is not None:
        assert server.authorization_id == expected_user


@FUZZ
@given(data=st.data(), right_password=st.booleans(), stage=st.sampled_from(["client-first", "client-final"]))
def test_mutated_scram_messages(
    scram_store: ControlledScramStore, data: st.DataObject, right_password: bool, stage: str
) -> None:
    client = ScramClient("alice", "alice-secret" if right_password else "wrong")
    server = create_server(SCRAM, sasl_settings(scram_store))
    first = client.first()
    if stage == "client-first":
        first = data.draw(mutated(first))
    outcomes = evaluate(server, [first])
    if outcomes != ["failed"]:
        challenge = outcomes[0]
        assert isinstance(challenge, bytes) and challenge.startswith(b"r=")
        try:
            final = client.final(challenge)
        except (ValueError, KeyError, UnicodeDecodeError):  # a mutated first message the client cannot go on from
            return
        if stage == "client-final":
            final = data.draw(mutated(final))
        evaluate(server, [final])
    if server.is_complete:  # only ever with the password, and as the user whose credentials were used
        assert right_password and server.authorization_id == "alice"
    with pytest.raises(SaslAuthenticationFailed):  # a finished exchange takes no more tokens
        server.evaluate_response(b"c=biws,r=x,p=AAAA")


@FUZZ
@given(data=st.data())
def test_truncated_and_mutated_oauthbearer_messages(scram_store: ControlledScramStore, data: st.DataObject) -> None:
    original = oauth_message()
    message = data.draw(mutated(original))
    server = create_server("OAUTHBEARER", sasl_settings(scram_store))
    outcomes = evaluate(server, [message, b"\x01"])
    if original.startswith(message) and message != original:  # a truncation
        assert not server.is_complete
    if server.is_complete:  # unsecured tokens carry any name; the principal is still a non-empty string
        assert isinstance(server.authorization_id, str) and server.authorization_id
        assert isinstance(server.credential_expiry_ms, int)
    else:
        assert outcomes[-1] == "failed" or (len(outcomes) == 1 and outcomes[0].startswith(b'{"status"'))


# --- in process: the authenticator, driven as the connection drives it --------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


SINGLE_EVENTS = st.one_of(
    st.tuples(st.just("versions"), st.sampled_from([0, 3]), st.sampled_from(["wire-test", "bad name!", ""])),
    st.tuples(st.just("handshake"), st.sampled_from([0, 1]), st.sampled_from([*MECHANISMS, "GSSAPI", "", "plain"])),
    st.tuples(
        st.just("authenticate"),
        st.sampled_from([0, 1, 2]),
        st.one_of(
            st.binary(max_size=64),
            st.sampled_from([plain_message(), plain_message("bob", "bob-secret"), plain_message(password="no")]),
            st.just(oauth_message()),
            st.just(oauth_message("bob")),
        ),
    ),
    st.tuples(st.just("metadata"), st.just(12), st.none()),
    st.tuples(st.just("clock"), st.just(0), st.floats(0, 3)),
)
# A whole PLAIN or OAUTHBEARER login (v0 or v1 handshake), as alice or bob: so that sequences often authenticate,
# then re-authenticate, expire or go wrong afterwards.
LOGINS = st.builds(
    lambda mechanism, version, user: [
        ("handshake", version, mechanism),
        ("authenticate", 2, plain_message(user, USERS[user]) if mechanism == "PLAIN" else oauth_message(user)),
    ],
    st.sampled_from(["PLAIN", "OAUTHBEARER"]),
    st.sampled_from([0, 1]),
    st.sampled_from(["alice", "alice", "bob"]),
)
EVENTS = st.tuples(
    st.one_of(st.just([]), LOGINS),  # most sequences start with a login, to fuzz what follows one
    st.lists(st.one_of(SINGLE_EVENTS.map(lambda event: [event]), LOGINS), max_size=8),
).map(lambda start_and_groups: start_and_groups[0] + [event for group in start_and_groups[1] for event in group])


def request_of(kind: str, version: int, argument: Any) -> tuple[int, Any]:
    if kind == "versions":
        return 18, ApiVersionsRequest(client_software_name=argument, client_software_version="1")
    if kind == "handshake":
        return 17, SaslHandshakeRequest(mechanism=argument)
    if kind == "authenticate":
        return 36, SaslAuthenticateRequest(auth_bytes=argument)
    return 3, MetadataRequest(topics=[], allow_auto_topic_creation=False)


def check_step(step: Step, api_key: int, version: int, body: Any) -> None:
    """A step is something the connection can send: every answer encodes with the request's key and version."""
    assert isinstance(step, Step)
    assert not step.pass_through or api_key == 18
    if isinstance(step.response, tuple):
        code, message = step.response
        assert code == ErrorCode.ILLEGAL_SASL_STATE and isinstance(message, str)
        answer = error_response(api_key, version, body, code, message)
        assert answer is not None
        encode_response(answer, api_key, version, 1)
    elif step.response is not None:
        assert isinstance(step.response, SaslHandshakeResponse | SaslAuthenticateResponse)
        encode_response(step.response, api_key, version, 1)
    if step.response is None and not step.pass_through:
        assert step.close  # nothing to say is only ever the end of the connection


@settings(FUZZ, max_examples=400)
@given(
    mechanisms=st.lists(st.sampled_from(MECHANISMS[1:]), max_size=2, unique=True).map(lambda more: ["PLAIN", *more]),
    reauth_ms=st.sampled_from([0, 1500]),
    events=EVENTS,
)
def test_random_orders_of_requests_and_stages(
    scram_store: ControlledScramStore, mechanisms: list[str], reauth_ms: int, events: list[tuple[str, int, Any]]
) -> None:
    listener = SaslListener(
        mechanisms=tuple(mechanisms), plain_users=USERS, max_reauth_ms=dict.fromkeys(mechanisms, reauth_ms)
    )
    clock = Clock()
    sasl = SaslAuthenticator(listener, scram_store, monotonic=clock)
    valid_tokens = {plain_message(): "User:alice", plain_message("bob", "bob-secret"): "User:bob"}
    valid_tokens |= {oauth_message(): "User:alice", oauth_message("bob"): "User:bob"}
    for kind, version, argument in events:
        if kind == "clock":
            clock.now += argument
            continue
        api_key, body = request_of(kind, version, argument)
        before = sasl.principal
        if sasl.raw_tokens:  # after SaslHandshake v0 every frame is a token, whatever it looks like
            token = argument if isinstance(argument, bytes) else b"\x00\x03" + bytes(version)
            step = sasl.on_raw_token(token)
            assert step.response is None or isinstance(step.response, bytes)
        elif sasl.complete and not (api_key == 17 and sasl.begin_reauthentication()):
            if sasl.session_expired():
                break  # the connection ends here
            continue  # an ordinary request: the pipeline answers it
        else:
            token = argument if api_key == 36 else None
            step = sasl.on_request(api_key, version, body)
            check_step(step, api_key, version, body)
        if sasl.principal != before or (sasl.complete and token is not None):
            # Authenticated (again) only with a valid credential, and only as that credential's user.
            assert valid_tokens.get(token) == sasl.principal, (token, sasl.principal)
        if step.close:
            assert not sasl.complete
            break


# --- over the wire --------------------------------------------------------------------------------------------

PLAIN_JAAS = (
    'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret" user_bob="bob-secret";'
)
MAX_RECEIVE = 4096
ANSWER_OR_CLOSE_SECONDS = 10.0  # the bound: every connection is answered or closed well within it


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    settings = {
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,OAUTHBEARER",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
        "sasl.server.max.receive.size": str(MAX_RECEIVE),
        "connection.failed.authentication.delay.ms": "0",
        "connections.max.idle.ms": "2000",  # a client that stops midway is closed by the idle timer
    }
    with RunningBroker(tmp_path_factory.mktemp("sasl-fuzz"), settings) as running:
        assert running.broker is not None
        set_password_over_the_wire(running.bootstrap, "alice", SCRAM, "alice-secret")
        yield running


def frame_of(body: Any, version: int, correlation_id: int = 1) -> bytes:
    return encode_request(body, version, correlation_id, client_id="fuzz")


def handshake_frame(mechanism: str = "PLAIN", version: int = 1) -> bytes:
    return frame_of(SaslHandshakeRequest(mechanism=mechanism), version)


def authenticate_frame(auth_bytes: bytes, version: int = 2) -> bytes:
    return frame_of(SaslAuthenticateRequest(auth_bytes=auth_bytes), version, 2)


def sized(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


AUTH_BYTES = st.one_of(
    st.binary(max_size=200),
    mutated(plain_message()),
    mutated(oauth_message()),
    mutated(ScramClient("alice", "alice-secret").first()),
)


@st.composite
def wire_inputs(draw: st.DrawFn) -> bytes:
    """What one connection sends: a whole exchange or part of one, cut anywhere, possibly with garbage after it."""
    kind = draw(
        st.sampled_from(["random", "authenticate", "v0 token", "v0 garbage", "huge prefix", "truncated", "oversized"])
    )
    mechanism = draw(st.sampled_from(MECHANISMS))
    if kind == "random":
        data = draw(st.binary(max_size=600))
    elif kind == "authenticate":
        data = handshake_frame(mechanism) + authenticate_frame(draw(AUTH_BYTES), draw(st.sampled_from([0, 1, 2])))
    elif kind == "v0 token":
        data = handshake_frame(mechanism, 0) + sized(draw(AUTH_BYTES))
    elif kind == "v0 garbage":
        data = handshake_frame(mechanism, 0) + draw(st.binary(max_size=300))
    elif kind == "huge prefix":
        prefix = draw(st.one_of(st.integers(MAX_RECEIVE + 1, 2**31 - 1), st.integers(-(2**31), -1)))
        data = (
            draw(st.sampled_from([b"", handshake_frame()])) + struct.pack(">i", prefix) + draw(st.binary(max_size=64))
        )
    elif kind == "oversized":
        data = handshake_frame() + authenticate_frame(b"\0alice\0" + b"x" * MAX_RECEIVE)
    else:
        whole = handshake_frame(mechanism) + authenticate_frame(draw(AUTH_BYTES))
        data = whole[: draw(st.integers(0, len(whole) - 1))]
    if draw(st.booleans()):
        data += draw(st.binary(max_size=100))  # garbage after whatever came first
    return data


def send_then_half_close(address: str, data: bytes) -> bytes:
    """Send ``data``, close the sending side, and read everything until the broker closes; raises on a hang."""
    host, _, port = address.rpartition(":")
    received = bytearray()
    with socket.create_connection((host, int(port)), timeout=ANSWER_OR_CLOSE_SECONDS) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # the broker closed first (it refused an earlier part): fine, read what it said
            pass
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            # socket.timeout propagates: neither an answer nor a close within the bound is the failure sought
            if not chunk:
                break
            received += chunk
    return bytes(received)


def drain_until_closed(sock: socket.socket) -> None:
    """Read (and drop) until the broker closes its end; TimeoutError if it does not within the bound."""
    try:
        while sock.recv(65536):
            pass
    except (ConnectionResetError, BrokenPipeError):
        pass


def assert_good_client_authenticates(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap_for("SASL_PLAINTEXT"), timeout=ANSWER_OR_CLOSE_SECONDS) as client:
        assert client.request(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == ErrorCode.NONE
        answer = client.request(SaslAuthenticateRequest(auth_bytes=plain_message()), 2)
        assert (answer.error_code, answer.error_message) == (ErrorCode.NONE, "")
        assert client.request(MetadataRequest(topics=[], allow_auto_topic_creation=False), 12).brokers


def assert_clean_log(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not bad, [f"{r.levelname} {r.name}: {r.getMessage()}" for r in bad]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=wire_inputs())
def test_every_connection_is_answered_or_closed(
    broker: RunningBroker, caplog: pytest.LogCaptureFixture, data: bytes
) -> None:
    caplog.set_level(logging.INFO)
    send_then_half_close(broker.bootstrap_for("SASL_PLAINTEXT"), data)
    assert_clean_log(caplog)


def test_the_broker_still_authenticates_after_the_fuzzing(
    broker: RunningBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    # A frame cut mid-way, then the socket closed at once (no half-close, no reading).
    for cut in (3, 9, 30):
        with socket.create_connection(tuple(broker.bootstrap_for("SASL_PLAINTEXT").rsplit(":", 1))) as sock:
            sock.sendall((handshake_frame() + authenticate_frame(plain_message()))[:cut])
    # A frame cut mid-way on a socket left open: the idle timer ends it (no answer, and no hang either).
    host, _, port = broker.bootstrap_for("SASL_PLAINTEXT").rpartition(":")
    with socket.create_connection((host, int(port)), timeout=ANSWER_OR_CLOSE_SECONDS) as sock:
        sock.sendall(handshake_frame()[:10])
        assert sock.recv(100) == b""
    assert_good_client_authenticates(broker)
    assert broker.broker is not None
    assert_clean_log(caplog)


# --- over TLS: SASL_SSL --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> certs.GeneratedCerts:
    return certs.generate(tmp_path_factory.mktemp("certs"), clients=[])


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory, tls_files: certs.GeneratedCerts) -> Iterator[RunningBroker]:
    settings = {
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(tls_files.broker),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls_files.ca),
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": PLAIN_JAAS,
        "sasl.server.max.receive.size": str(MAX_RECEIVE),
        "connection.failed.authentication.delay.ms": "0",
    }
    with RunningBroker(tmp_path_factory.mktemp("sasl-ssl-fuzz"), settings) as running:
        yield running


class TlsOverSocket:
    """A TLS client over a plain socket through memory buffers, so the socket stays ours to half-close."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext) -> None:
        self.sock = sock
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self._incoming, self._outgoing, server_hostname="127.0.0.1")
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self.flush()
                received = sock.recv(65536)
                if not received:
                    raise ConnectionError("the broker closed during the TLS handshake") from None
                self._incoming.write(received)
        self.flush()

    def flush(self) -> None:
        self.sock.sendall(self._outgoing.read())

    def send_then_close(self, data: bytes) -> None:
        """``data`` encrypted, then TLS's end of stream (close_notify), then TCP's (a half-close)."""
        self.tls.write(data)
        with contextlib.suppress(ssl.SSLWantReadError):
            self.tls.unwrap()  # queues close_notify; the broker's is not waited for
        self.flush()
        self.sock.shutdown(socket.SHUT_WR)


def client_hello(context: ssl.SSLContext) -> bytes:
    """The first flight of a real TLS client, to be cut short."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["before TLS", "cut ClientHello", "inside TLS"]), data=wire_inputs(), cut=st.floats(0, 1))
def test_every_sasl_ssl_connection_is_answered_or_closed(
    tls_broker: RunningBroker,
    tls_files: certs.GeneratedCerts,
    caplog: pytest.LogCaptureFixture,
    kind: str,
    data: bytes,
    cut: float,
) -> None:
    caplog.set_level(logging.INFO)
    context = ssl.create_default_context(cafile=str(tls_files.ca))
    host, _, port = tls_broker.bootstrap_for("SASL_SSL").rpartition(":")
    if kind == "before TLS":  # the exchange's bytes where the broker expects a ClientHello
        send_then_half_close(tls_broker.bootstrap_for("SASL_SSL"), data)
    elif kind == "cut ClientHello":
        hello = client_hello(context)
        send_then_half_close(tls_broker.bootstrap_for("SASL_SSL"), hello[: int(len(hello) * cut)])
    else:  # the exchange's bytes through TLS, then TLS's own end of stream (close_notify) and TCP's
        with socket.create_connection((host, int(port)), timeout=ANSWER_OR_CLOSE_SECONDS) as sock:
            try:
                TlsOverSocket(sock, context).send_then_close(data)
            except OSError:  # the broker closed first (it refused an earlier part)
                pass
            drain_until_closed(sock)
    assert_clean_log(caplog)
