"""--bootstrap and --command-config: the client commands reach secured listeners with a Java client's (or kcat's)
properties file, refuse what they do not understand in one line, and report failures with Kafka's error names."""

from __future__ import annotations

import argparse
import struct
from collections.abc import Iterator
from pathlib import Path

import kafka.errors
import pytest

from kbroker.commands.connection import (
    ClientSettings,
    CommandError,
    UnsecuredTokenProvider,
    admin_client,
    failure_line,
    read_command_config,
    security_kwargs,
)
from kbroker.config_registry import ConfigError
from kbroker.security import certs
from kbroker.testing import RunningBroker

PLAIN_JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_carol="carol-secret";'


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "client.properties"
    path.write_text(text)
    return path


def test_java_keys_are_kept_and_librdkafka_names_become_java_ones(tmp_path: Path) -> None:
    (tmp_path / "client.crt").write_text("CERT")
    (tmp_path / "client.key").write_text("KEY")
    config = write(
        tmp_path,
        "security.protocol=SASL_SSL\nsasl.mechanisms=SCRAM-SHA-512\nsasl.username=u\nsasl.password=p\n"
        f"ssl.ca.location=/ca.pem\nssl.certificate.location={tmp_path / 'client.crt'}\n"
        f"ssl.key.location={tmp_path / 'client.key'}\nclient.id=tool\n",
    )
    assert read_command_config(config) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "u",
        "sasl.password": "p",
        "ssl.truststore.location": "/ca.pem",
        "ssl.truststore.type": "PEM",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.certificate.chain": "CERT",
        "ssl.keystore.key": "KEY",
        "client.id": "tool",
    }


def test_an_unknown_key_is_refused_in_one_line(tmp_path: Path) -> None:
    config = write(tmp_path, "security.protocol=PLAINTEXT\nlinger.ms=5\n")
    with pytest.raises(CommandError) as refused:
        read_command_config(config)
    assert str(refused.value) == (
        f"--command-config {config}: linger.ms is not a client setting kbroker's commands understand "
        "(they take security.protocol, sasl.*, ssl.* store keys, client.id and request.timeout.ms)"
    )


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match=r"^--command-config .*nope: No such file or directory$"):
        read_command_config(tmp_path / "nope")


def test_sasl_users_come_from_the_jaas_config_or_librdkafka_keys() -> None:
    jaas = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="s3 cret";'
    assert security_kwargs(
        {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256", "sasl.jaas.config": jaas}
    ) == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "alice",
        "sasl_plain_password": "s3 cret",
    }
    assert security_kwargs(
        {"security.protocol": "sasl_plaintext", "sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": ""}
    ) == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "u",
        "sasl_plain_password": "",
    }


@pytest.mark.parametrize(
    ("properties", "message"),
    [
        (
            {"security.protocol": "TLS"},
            "security.protocol: 'TLS' is not one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL",
        ),
        (
            {"security.protocol": "SASL_PLAINTEXT"},
            "sasl.mechanism: GSSAPI is not supported by kbroker's commands "
            "(they speak PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER; Kafka's default is GSSAPI)",
        ),
        (
            {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"},
            'PLAIN needs a user: sasl.jaas.config=... required username="U" password="P"; '
            "(or sasl.username and sasl.password)",
        ),
        (
            {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER"},
            "sasl.jaas.config: OAUTHBEARER in kbroker's commands takes an unsecured token: "
            'OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="<principal>";',
        ),
        (
            {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.jaas.config": "x"},
            "sasl.jaas.config: Login module control flag not specified in JAAS config",
        ),
    ],
)
def test_security_mistakes_are_one_line(properties: dict[str, str], message: str) -> None:
    with pytest.raises(CommandError) as refused:
        security_kwargs(properties)
    assert str(refused.value) == message


def test_the_unsecured_token_names_the_principal() -> None:
    import base64
    import json

    header, claims, signature = UnsecuredTokenProvider("alice").token().split(".")
    assert signature == ""
    assert json.loads(base64.urlsafe_b64decode(header + "==")) == {"alg": "none"}
    decoded = json.loads(base64.urlsafe_b64decode(claims + "=="))
    assert decoded["sub"] == "alice"
    assert decoded["exp"] - decoded["iat"] == 3600


def test_failure_lines_name_the_error_code() -> None:
    assert failure_line(kafka.errors.TopicAlreadyExistsError("Topic 't' already exists.")) == (
        "TOPIC_ALREADY_EXISTS (36): Topic 't' already exists."
    )
    # kafka-python puts the whole request and response in its message: only the broker's message is kept.
    verbose = kafka.errors.InvalidConfigurationError(
        "Request 'CreateTopicsRequest(...)' failed with response 'CreateTopicsResponse(topics=[CreatableTopicResult("
        "name='t', error_code=40, error_message=\"Invalid value x for configuration retention.ms\", configs=[])])'."
    )
    assert failure_line(verbose) == "INVALID_CONFIG (40): Invalid value x for configuration retention.ms"
    assert failure_line(kafka.errors.KafkaTimeoutError("Unable to bootstrap from 127.0.0.1:1")) == (
        "timed out: Unable to bootstrap from 127.0.0.1:1"
    )
    # Kafka's names, where kafka-python's differ.
    assert failure_line(kafka.errors.InvalidTopicError("bad name")) == "INVALID_TOPIC_EXCEPTION (17): bad name"
    assert failure_line(CommandError("plain words")) == "plain words"
    assert failure_line(ConfigError("ssl.protocol: bad")) == "configuration error: ssl.protocol: bad"
    assert failure_line(FileNotFoundError(2, "No such file or directory", "/x")) == "No such file or directory: /x"
    assert failure_line(struct.error("int too large to convert")) == (
        "a number given is out of range for Kafka's protocol (int too large to convert)"
    )
    assert failure_line(ZeroDivisionError()) is None  # a bug shows its traceback


def test_bootstrap_comes_from_the_flag_then_the_config(tmp_path: Path) -> None:
    config = write(tmp_path, "bootstrap.servers=a:1,b:2\n")
    from_config = ClientSettings.from_args(argparse.Namespace(bootstrap=None, command_config=config))
    assert from_config.kafka_kwargs()["bootstrap_servers"] == ["a:1", "b:2"]
    from_flag = ClientSettings.from_args(argparse.Namespace(bootstrap="c:3", command_config=config))
    assert from_flag.kafka_kwargs()["bootstrap_servers"] == ["c:3"]
    default = ClientSettings.from_args(argparse.Namespace(bootstrap=None, command_config=None))
    assert default.kafka_kwargs() == {
        "bootstrap_servers": ["127.0.0.1:9092"],
        "client_id": "kbroker-cli",
        "security_protocol": "PLAINTEXT",
        "bootstrap_timeout_ms": 15_000,
    }


# --- against secured listeners -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> certs.GeneratedCerts:
    return certs.generate(tmp_path_factory.mktemp("certs"), clients=["alice"])


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, files: certs.GeneratedCerts) -> Iterator[RunningBroker]:
    settings = {
        "listeners": "SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(files.broker),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca),
        "listener.name.ssl.ssl.client.auth": "required",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": PLAIN_JAAS,
    }
    with RunningBroker(tmp_path_factory.mktemp("secured"), settings) as running:
        yield running


def list_topics(bootstrap: str, properties: str, tmp_path: Path) -> list[str]:
    config = write(tmp_path, properties)
    settings = ClientSettings.from_args(argparse.Namespace(bootstrap=bootstrap, command_config=config))
    admin = admin_client(settings)
    try:
        return sorted(admin.list_topics())
    finally:
        admin.close()


def test_mutual_tls_with_java_store_keys(secured: RunningBroker, files: certs.GeneratedCerts, tmp_path: Path) -> None:
    client_pem = files.clients["alice"][0]
    properties = (
        "security.protocol=SSL\nssl.truststore.type=PEM\n"
        f"ssl.truststore.location={files.ca}\nssl.keystore.type=PEM\nssl.keystore.location={client_pem}\n"
    )
    assert list_topics(secured.bootstrap_for("SSL"), properties, tmp_path) == []


def test_mutual_tls_with_kcat_keys(secured: RunningBroker, files: certs.GeneratedCerts, tmp_path: Path) -> None:
    _pem, crt, key = files.clients["alice"]
    properties = (
        f"security.protocol=ssl\nssl.ca.location={files.ca}\nssl.certificate.location={crt}\nssl.key.location={key}\n"
    )
    assert list_topics(secured.bootstrap_for("SSL"), properties, tmp_path) == []


def test_sasl_ssl_plain_with_a_jaas_config(secured: RunningBroker, files: certs.GeneratedCerts, tmp_path: Path) -> None:
    properties = (
        f"security.protocol=SASL_SSL\nssl.truststore.type=PEM\nssl.truststore.location={files.ca}\n"
        "sasl.mechanism=PLAIN\nsasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="carol" password="carol-secret";\n'
    )
    assert list_topics(secured.bootstrap_for("SASL_SSL"), properties, tmp_path) == []


def test_a_wrong_password_is_one_line_from_the_command(
    secured: RunningBroker, files: certs.GeneratedCerts, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kbroker.cli import main

    config = write(
        tmp_path,
        f"security.protocol=SASL_SSL\nssl.truststore.type=PEM\nssl.truststore.location={files.ca}\n"
        "sasl.mechanism=PLAIN\nsasl.username=carol\nsasl.password=wrong\nrequest.timeout.ms=3000\n",
    )
    code = main(["topics", "list", "--bootstrap", secured.bootstrap_for("SASL_SSL"), "--command-config", str(config)])
    err = capsys.readouterr().err
    assert code == 1
    assert err == (
        "kbroker topics: SASL_AUTHENTICATION_FAILED (58): the broker refused the login (wrong user or password, or "
        "a mechanism it does not allow for this user)\n"
    )


def test_health_checks_an_ssl_listener_with_a_command_config(
    secured: RunningBroker, files: certs.GeneratedCerts, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kbroker.cli import main

    client_pem = files.clients["alice"][0]
    config = write(
        tmp_path,
        f"security.protocol=SSL\nssl.truststore.type=PEM\nssl.truststore.location={files.ca}\n"
        f"ssl.keystore.type=PEM\nssl.keystore.location={client_pem}\n",
    )
    bootstrap = secured.bootstrap_for("SSL")
    assert main(["health", "--bootstrap", bootstrap, "--command-config", str(config)]) == 0
    assert capsys.readouterr().out.startswith(f"ready: {bootstrap} answers ApiVersions (")
    # Plaintext against the TLS listener is not ready (the TLS server sees no handshake), in one line.
    assert main(["health", "--bootstrap", bootstrap, "--timeout", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"kbroker health: not ready: {bootstrap}: ") and err.count("\n") == 1


def test_health_refuses_a_sasl_command_config_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kbroker.cli import main

    config = write(tmp_path, "security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\n")
    assert main(["health", "--command-config", str(config)]) == 2
    assert capsys.readouterr().err == (
        "kbroker health: --command-config: SASL_SSL: the health check does not log in; check the listener with "
        "kbroker topics list --command-config, or give the broker a PLAINTEXT or SSL listener for checks\n"
    )


def test_serve_does_not_build_the_client_commands() -> None:
    """``kbroker serve`` parses a command line without the client commands' parsers (their modules and some 20 ms
    of start-up); every other command line has them all."""
    import subprocess
    import sys

    probe = (
        "import sys; from kbroker import cli; "
        "serve = cli.build_parser(client_commands=False); loaded = 'kbroker.commands' in sys.modules; "
        "full = cli.build_parser(); "
        "names = lambda p: sorted(p._subparsers._group_actions[0].choices); "
        "print(loaded, names(serve), names(full))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split(" [", 1)[0] == "False"
    commands = "['acls', 'certs', 'cluster', 'configs', 'console', 'consume', 'format', 'groups'"
    assert f"['certs', 'health', 'serve'] {commands}" in done.stdout
