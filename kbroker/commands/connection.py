"""How the client commands reach a cluster: ``--bootstrap`` and ``--command-config``, as Kafka's tools take them.

``--command-config`` is a Java client properties file (kafka-topics.sh's ``--command-config``):
``security.protocol``, ``sasl.mechanism``, ``sasl.jaas.config`` and the ``ssl.*`` store keys, with librdkafka's
names (``sasl.username``, ``ssl.ca.location``, ...) accepted too so a kcat config works. A key this module does not
understand is refused in one line rather than silently dropped. The result is keyword arguments for kafka-python's
clients (``ClientSettings.kafka_kwargs``), which every command, ``kbroker mirror`` and the console use.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import re
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kbroker.config_registry import ConfigError

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_ENVIRONMENT = "KBROKER_BOOTSTRAP"
BOOTSTRAP_TIMEOUT_MS = 15_000

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")

# The Java ssl.* keys kbroker/security/tls.py reads to build a client context.
JAVA_SSL_KEYS = frozenset(
    {
        "ssl.truststore.location",
        "ssl.truststore.type",
        "ssl.truststore.password",
        "ssl.truststore.certificates",
        "ssl.keystore.location",
        "ssl.keystore.type",
        "ssl.keystore.password",
        "ssl.keystore.key",
        "ssl.keystore.certificate.chain",
        "ssl.key.password",
        "ssl.endpoint.identification.algorithm",
        "ssl.protocol",
        "ssl.enabled.protocols",
        "ssl.cipher.suites",
    }
)
# librdkafka's names for the same things (a kcat or confluent-kafka config), as the Java key they stand for.
LIBRDKAFKA_ALIASES = {
    "ssl.ca.location": "ssl.truststore.location",
    "ssl.certificate.location": "ssl.keystore.certificate.chain",
    "ssl.key.location": "ssl.keystore.key",
}
OTHER_KEYS = frozenset(
    {
        "security.protocol",
        "sasl.mechanism",
        "sasl.mechanisms",  # librdkafka's spelling
        "sasl.jaas.config",
        "sasl.username",
        "sasl.password",
        "enable.ssl.certificate.verification",
        "bootstrap.servers",
        "client.id",
        "request.timeout.ms",
    }
)


class CommandError(Exception):
    """A failure the user can act on, reported as this one line (no traceback)."""


@dataclass
class ClientSettings:
    """Where and how to connect: the bootstrap servers and the command config's settings."""

    bootstrap: str = DEFAULT_BOOTSTRAP
    properties: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ClientSettings:
        properties = read_command_config(args.command_config) if args.command_config else {}
        bootstrap = args.bootstrap or properties.get("bootstrap.servers") or DEFAULT_BOOTSTRAP
        return cls(bootstrap, properties)

    def kafka_kwargs(self, client_id: str = "kbroker-cli") -> dict[str, Any]:
        """kafka-python client arguments: bootstrap, client id, timeouts and security."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": [server.strip() for server in self.bootstrap.split(",") if server.strip()],
            "client_id": self.properties.get("client.id", client_id),
        }
        if "request.timeout.ms" in self.properties:
            kwargs["request_timeout_ms"] = _int_setting(self.properties, "request.timeout.ms")
        # How long to keep trying the bootstrap servers: kafka-python's 30 s is long for a person waiting on an
        # unreachable address or a refused login (reported as such: ClientLog).
        kwargs["bootstrap_timeout_ms"] = kwargs.get("request_timeout_ms", BOOTSTRAP_TIMEOUT_MS)
        kwargs.update(security_kwargs(self.properties))
        return kwargs


def add_client_arguments(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap`` and ``--command-config``, on every client command."""
    parser.add_argument(
        "--bootstrap",
        "--bootstrap-server",
        default=os.environ.get(BOOTSTRAP_ENVIRONMENT),
        metavar="HOST:PORT[,HOST:PORT]",
        help=f"brokers to connect to (default ${BOOTSTRAP_ENVIRONMENT} or {DEFAULT_BOOTSTRAP})",
    )
    parser.add_argument(
        "--command-config",
        type=Path,
        default=None,
        metavar="FILE",
        help="client properties: security.protocol, sasl.mechanism, sasl.jaas.config, ssl.truststore.location, ...",
    )


def add_output_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output", "-o", choices=("table", "json"), default="table", help="table for people, json for programs"
    )


def read_command_config(path: Path) -> dict[str, str]:
    """The properties of ``path``, with librdkafka aliases turned into Java keys; unknown keys are refused."""
    from kbroker.config import parse_properties

    try:
        text = path.read_text()
    except OSError as exc:
        raise CommandError(f"--command-config {path}: {exc.strerror or exc}") from None
    try:
        raw = parse_properties(text, str(path))
    except ConfigError as exc:
        raise CommandError(f"--command-config: {exc}") from None
    properties: dict[str, str] = {}
    for key, value in raw.items():
        if key in LIBRDKAFKA_ALIASES:
            properties[LIBRDKAFKA_ALIASES[key]] = value
            if key in ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location"):
                properties.setdefault("ssl.truststore.type", "PEM")
                properties.setdefault("ssl.keystore.type", "PEM")
        elif key in JAVA_SSL_KEYS or key in OTHER_KEYS:
            properties[key] = value
        else:
            raise CommandError(
                f"--command-config {path}: {key} is not a client setting kbroker's commands understand "
                "(they take security.protocol, sasl.*, ssl.* store keys, client.id and request.timeout.ms)"
            )
    # librdkafka's ssl.certificate.location/ssl.key.location are files; the Java keys they became hold PEM text.
    for key in ("ssl.keystore.certificate.chain", "ssl.keystore.key"):
        alias = next(a for a, java in LIBRDKAFKA_ALIASES.items() if java == key)
        if alias in raw:
            try:
                properties[key] = Path(raw[alias]).read_text()
            except OSError as exc:
                raise CommandError(f"--command-config {path}: {alias}: {exc.strerror or exc}: {raw[alias]}") from None
    return properties


def _int_setting(properties: dict[str, str], key: str) -> int:
    try:
        return int(properties[key])
    except ValueError:
        raise CommandError(f"--command-config: {key} must be a whole number, got {properties[key]!r}") from None


def security_kwargs(properties: dict[str, str]) -> dict[str, Any]:
    """kafka-python's security arguments for a command config."""
    protocol = properties.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise CommandError(f"security.protocol: {protocol!r} is not one of {', '.join(SECURITY_PROTOCOLS)}")
    kwargs: dict[str, Any] = {"security_protocol": protocol}
    if protocol in ("SSL", "SASL_SSL"):
        kwargs["ssl_context"] = _ssl_context(properties)
    if protocol.startswith("SASL"):
        kwargs.update(_sasl_kwargs(properties))
    return kwargs


def _ssl_context(properties: dict[str, str]) -> Any:
    from kbroker.security.tls import client_context

    settings = dict(properties)
    if properties.get("enable.ssl.certificate.verification", "true").lower() == "false":
        settings["ssl.endpoint.identification.algorithm"] = ""
    try:
        context = client_context(settings)
    except ConfigError as exc:
        raise CommandError(f"--command-config: {exc}") from None
    if properties.get("enable.ssl.certificate.verification", "true").lower() == "false":
        import ssl

        context.verify_mode = ssl.CERT_NONE
    return context


def _sasl_kwargs(properties: dict[str, str]) -> dict[str, Any]:
    from kbroker.security.sasl.jaas import parse_jaas_config

    mechanism = (properties.get("sasl.mechanism") or properties.get("sasl.mechanisms") or "GSSAPI").upper()
    if mechanism not in SASL_MECHANISMS:
        raise CommandError(
            f"sasl.mechanism: {mechanism} is not supported by kbroker's commands "
            f"(they speak {', '.join(SASL_MECHANISMS)}; Kafka's default is GSSAPI)"
        )
    options: dict[str, str] = {}
    if "sasl.jaas.config" in properties:
        try:
            options = parse_jaas_config(properties["sasl.jaas.config"]).options
        except ConfigError as exc:
            raise CommandError(f"sasl.jaas.config: {exc}") from None
    kwargs: dict[str, Any] = {"sasl_mechanism": mechanism}
    if mechanism == "OAUTHBEARER":
        subject = options.get("unsecuredLoginStringClaim_sub")
        if not subject:
            raise CommandError(
                "sasl.jaas.config: OAUTHBEARER in kbroker's commands takes an unsecured token: "
                'OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="<principal>";'
            )
        kwargs["sasl_oauth_token_provider"] = UnsecuredTokenProvider(subject)
        return kwargs
    username = properties.get("sasl.username", options.get("username"))
    password = properties.get("sasl.password", options.get("password"))
    if not username or password is None:
        raise CommandError(
            f'{mechanism} needs a user: sasl.jaas.config=... required username="U" password="P"; '
            "(or sasl.username and sasl.password)"
        )
    kwargs["sasl_plain_username"] = username
    kwargs["sasl_plain_password"] = password
    return kwargs


class UnsecuredTokenProvider:
    """An unsigned OAUTHBEARER token for ``subject`` (Kafka's unsecured JWS, for development setups), made afresh
    for each login so a long ``kbroker consume`` never presents an expired one."""

    def __init__(self, subject: str, lifetime_seconds: int = 3600) -> None:
        self.subject = subject
        self.lifetime_seconds = lifetime_seconds

    def token(self) -> str:
        issued = int(time.time()) - 10  # whole seconds, a little in the past: brokers refuse an iat in the future
        header = {"alg": "none"}
        claims = {"sub": self.subject, "iat": issued, "exp": issued + self.lifetime_seconds}
        return f"{_base64url(header)}.{_base64url(claims)}."

    def extensions(self) -> dict[str, str]:
        return {}


def _base64url(document: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(document).encode()).rstrip(b"=").decode()


# --- clients ---------------------------------------------------------------------------------------------------


def admin_client(settings: ClientSettings, **extra: Any) -> Any:
    from kafka import KafkaAdminClient

    return KafkaAdminClient(**settings.kafka_kwargs(), **extra)


def producer_client(settings: ClientSettings, **extra: Any) -> Any:
    from kafka import KafkaProducer

    return KafkaProducer(**settings.kafka_kwargs(), **extra)


def consumer_client(settings: ClientSettings, *topics: str, **extra: Any) -> Any:
    from kafka import KafkaConsumer

    return KafkaConsumer(*topics, **settings.kafka_kwargs(), **extra)


# --- failures as one line ----------------------------------------------------------------------------------------


def failure_line(exc: BaseException, client_log: ClientLog | None = None) -> str | None:
    """The one line a command's failure is reported with; None for a programming error (let it show)."""
    import kafka.errors as kafka_errors

    if isinstance(exc, CommandError):
        return str(exc)
    if isinstance(exc, ConfigError):
        return f"configuration error: {exc}"
    if isinstance(exc, kafka_errors.BrokerResponseError):
        return broker_error_line(exc)
    if isinstance(exc, kafka_errors.KafkaTimeoutError):
        if client_log is not None and client_log.refused_login is not None:
            return client_log.refused_login
        what = str(exc.args[0]) if exc.args else "no answer from the cluster"
        problem = client_log.last_problem if client_log is not None else None
        reason = f" (last problem: {problem})" if problem and what not in problem else ""
        return f"timed out: {what}{reason}"
    if isinstance(exc, kafka_errors.KafkaError):
        detail = exc.args[0] if exc.args else ""
        return f"{type(exc).__name__}{': ' + str(detail) if detail else ''}"
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename is not None else ""
        return f"{exc.strerror or exc}{where}"
    if isinstance(exc, struct.error):  # kafka-python encoding a number its protocol field cannot hold
        return f"a number given is out of range for Kafka's protocol ({exc})"
    return None


_RESPONSE_ERROR_MESSAGE = re.compile(r"error_message=(['\"])(.+?)\1[,)]")


def broker_error_line(exc: Any) -> str:
    """``TOPIC_ALREADY_EXISTS (36): Topic 'x' already exists.``: Kafka's error code name, number and message."""
    detail = str(exc.args[0]) if exc.args and exc.args[0] else (exc.description or "")
    if "failed with response" in detail:  # kafka-python's whole request and response: keep the broker's message
        message = _RESPONSE_ERROR_MESSAGE.search(detail)
        detail = message.group(2) if message else (exc.description or "")
    return f"{kafka_error_name(exc.errno, exc.message)} ({exc.errno}){': ' + detail if detail else ''}"


def kafka_error_name(code: int, fallback: str) -> str:
    """Kafka's name for an error code (kafka-python's names differ for a few: 17 is INVALID_TOPIC_EXCEPTION)."""
    from protocol.errors import ErrorCode

    try:
        return ErrorCode(code).name
    except ValueError:
        return fallback


class ClientLog(logging.Handler):
    """kafka-python's log while a command runs: kept off the terminal (its retries are not the user's business)
    and read for the reason behind a timeout. kafka-python 3 often loses a refused login: both Kafka and kbroker
    close the connection right after answering SaslAuthenticate with an error, and its transport drops the answer
    read with the end of the stream, then retries until its bootstrap timeout. A SaslAuthenticate answered by a
    closed connection is that refusal (requests are logged at DEBUG by kafka.net.connection)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.refused_login: str | None = None
        self.last_problem: str | None = None
        self._authenticating = False

    def install(self) -> None:
        client_logger = logging.getLogger("kafka")
        client_logger.addHandler(self)
        client_logger.propagate = False  # off the terminal: the command reports in its own words
        logging.getLogger("kafka.net.connection").setLevel(logging.DEBUG)

    def uninstall(self) -> None:
        logging.getLogger("kafka").removeHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.WARNING:
            # A debug line per request: look at what it names without formatting it (a produce request's text
            # holds its records, and the mirror sends many).
            kinds = {type(arg).__name__ for arg in record.args or ()} if isinstance(record.args, tuple) else set()
            if "SaslAuthenticateRequest" in kinds:
                self._authenticating = True
            elif "SaslAuthenticateResponse" in kinds:
                self._authenticating = False
            return
        message = record.getMessage()
        if "SaslAuthenticationFailedError" in message or (self._authenticating and "Connection lost" in message):
            self._authenticating = False
            self.refused_login = (
                "SASL_AUTHENTICATION_FAILED (58): the broker refused the login (wrong user or password, or a "
                "mechanism it does not allow for this user)"
            )
        self.last_problem = message
