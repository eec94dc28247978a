"""``kbroker certs`` then ``kbroker serve --sasl-user ... --tls DIR``: a secured dev broker in two commands.

The users get PLAIN and both SCRAM mechanisms; ``--tls`` makes the listener SASL_SSL (SSL without users). Mistakes
in the flags are one line and exit code 2, before anything is created. A user dropped from ``--sasl-user`` at a
restart no longer logs in by any mechanism; one created through AlterUserScramCredentials stays.
"""

from __future__ import annotations

import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kbroker.security.sasl.scram import SCRAM_MECHANISMS
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.sasl_authenticate_request import SaslAuthenticateRequest
from protocol.messages.sasl_handshake_request import SaslHandshakeRequest
from tests.security.test_sasl_scram import Client

SERVE = [sys.executable, "-m", "kbroker", "serve", "--listen", "127.0.0.1:0", "--log-level", "WARNING"]


def start(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen[bytes], str]:
    ready = tmp_path / "ready"
    ready.unlink(missing_ok=True)  # a restart on the same data directory announces itself anew
    command = [*SERVE, "--data-dir", str(tmp_path / "data"), "--ready-file", str(ready), *flags]
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - the child writes it until stopped
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert process.poll() is None, (tmp_path / "serve.log").read_text()
        assert time.monotonic() < deadline, "kbroker serve did not start"
        time.sleep(0.01)
    return process, ready.read_text().strip()


@pytest.fixture
def certs_dir(tmp_path: Path) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "kbroker", "certs", "--dir", str(tmp_path / "certs")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "ssl.keystore.type=PEM" in done.stdout
    return tmp_path / "certs"


@pytest.fixture
def stopper() -> Iterator[list[subprocess.Popen[bytes]]]:
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        process.terminate()
        process.wait(30)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_serve_with_sasl_users_over_tls(
    tmp_path: Path, certs_dir: Path, stopper: list[subprocess.Popen[bytes]], mechanism: str
) -> None:
    from kafka import KafkaProducer

    process, bootstrap = start(
        tmp_path, "--sasl-user", 'alice:s3"cr\\t', "--sasl-user", "bob:pw", "--tls", str(certs_dir)
    )
    stopper.append(process)
    options = {
        "bootstrap_servers": bootstrap,
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(certs_dir / "ca.pem"),
        "sasl_mechanism": mechanism,
    }
    producer = KafkaProducer(sasl_plain_username="alice", sasl_plain_password='s3"cr\\t', **options)
    assert producer.send("cli-secured", b"v").get(10).offset == 0
    producer.close()
    # A wrong password is refused as Kafka refuses it (the exact exchange: tests/security/test_sasl_connection.py).
    context = ssl.create_default_context(cafile=str(certs_dir / "ca.pem"))
    with WireClient(bootstrap, ssl_context=context) as client:
        assert client.request(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == ErrorCode.NONE
        answer = client.request(SaslAuthenticateRequest(auth_bytes=b"\0bob\0nope"), 2)
        assert answer.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED


def test_serve_with_sasl_users_without_tls(tmp_path: Path, stopper: list[subprocess.Popen[bytes]]) -> None:
    from confluent_kafka import Producer

    process, bootstrap = start(tmp_path, "--sasl-user", "alice:secret")
    stopper.append(process)
    delivered: list[int] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "alice",
            "sasl.password": "secret",
        }
    )
    producer.produce("cli-sasl", b"v", on_delivery=lambda err, msg: delivered.append(msg.offset()))
    assert producer.flush(15) == 0
    assert delivered == [0]


def scram_login(bootstrap: str, mechanism: str, user: str, password: str) -> ErrorCode:
    """The outcome of a whole SCRAM exchange over the wire (the first error, or NONE once the final is accepted)."""
    client_messages = Client(SCRAM_MECHANISMS[mechanism], user, password)
    with WireClient(bootstrap) as client:
        assert client.request(SaslHandshakeRequest(mechanism=mechanism), 1).error_code == ErrorCode.NONE
        first = client.request(SaslAuthenticateRequest(auth_bytes=client_messages.first()), 2)
        if first.error_code != ErrorCode.NONE:
            return ErrorCode(first.error_code)
        final, signature = client_messages.final(first.auth_bytes)
        answer = client.request(SaslAuthenticateRequest(auth_bytes=final), 2)
        assert answer.error_code != ErrorCode.NONE or answer.auth_bytes == signature
        return ErrorCode(answer.error_code)


def librdkafka_delivers(bootstrap: str, mechanism: str, user: str, password: str) -> tuple[list[int], list[str]]:
    """(offsets delivered, librdkafka's error names) for one record produced as ``user``."""
    from confluent_kafka import KafkaError, Producer

    delivered: list[int] = []
    errors: list[str] = []

    def on_error(error: KafkaError) -> None:
        errors.append(error.name())

    options = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism, "message.timeout.ms": 8000}
    producer = Producer(
        {"bootstrap.servers": bootstrap, "sasl.username": user, "sasl.password": password, **options},
        error_cb=on_error,
    )
    producer.produce("cli-sasl", b"v", on_delivery=lambda err, msg: err is None and delivered.append(msg.offset()))
    producer.flush(15)
    return delivered, errors


def test_a_user_dropped_from_sasl_user_no_longer_logs_in(
    tmp_path: Path, stopper: list[subprocess.Popen[bytes]]
) -> None:
    from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    process, bootstrap = start(tmp_path, "--sasl-user", "alice:alice-pw", "--sasl-user", "bob:bob-pw")
    stopper.append(process)
    assert scram_login(bootstrap, "SCRAM-SHA-512", "bob", "bob-pw") == ErrorCode.NONE
    # carol is created through the admin API (by alice), as Kafka's users are.
    admin = AdminClient(
        {
            "bootstrap.servers": bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": "alice",
            "sasl.password": "alice-pw",
        }
    )
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192)
    futures = admin.alter_user_scram_credentials([UserScramCredentialUpsertion("carol", info, b"carol-pw")])
    futures["carol"].result(15)
    process.terminate()
    assert process.wait(30) == 0

    process, bootstrap = start(tmp_path, "--sasl-user", "alice:alice-pw", "--log-level", "INFO")
    stopper.append(process)
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        assert scram_login(bootstrap, mechanism, "bob", "bob-pw") == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert scram_login(bootstrap, mechanism, "alice", "alice-pw") == ErrorCode.NONE
    assert scram_login(bootstrap, "SCRAM-SHA-256", "carol", "carol-pw") == ErrorCode.NONE
    for mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        delivered, errors = librdkafka_delivers(bootstrap, mechanism, "bob", "bob-pw")
        assert delivered == [] and "_AUTHENTICATION" in errors, (mechanism, errors)
    assert librdkafka_delivers(bootstrap, "SCRAM-SHA-512", "alice", "alice-pw") == ([0], [])

    log = (tmp_path / "serve.log").read_text()
    assert "SCRAM users deleted, no longer named by --sasl-user: bob\n" in log
    assert "SCRAM users: from --sasl-user: alice; from AlterUserScramCredentials: carol\n" in log
    assert "-pw" not in log  # names only, never a password


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--sasl-user", "alice"], "kbroker: configuration error: --sasl-user expects USER:PASSWORD, got 'alice'"),
        (["--tls", "/nonexistent"], "kbroker: configuration error: --tls /nonexistent: no broker.pem there"),
    ],
)
def test_bad_security_flags_are_one_line(tmp_path: Path, flags: list[str], problem: str) -> None:
    done = subprocess.run([*SERVE, "--data-dir", str(tmp_path / "data"), *flags], capture_output=True, text=True)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(problem), lines
    assert not (tmp_path / "data").exists()
