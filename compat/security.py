"""The secured broker of the compat security scenarios, set up the same way on kbroker and on Apache Kafka.

One broker per target serves every security setup at once, each on a listener of its own, from the same
server.properties keys on both brokers (Kafka's names: ``listeners``, ``listener.security.protocol.map``,
``listener.name.<l>.<mechanism>.sasl.jaas.config``, ``ssl.keystore.type=PEM``, ``authorizer.class.name``, ...):

- PLAINTEXT: the suite's own door (ANONYMOUS is a super user there): topics, SCRAM users and ACLs are set up
  through it with the admin API (AlterUserScramCredentials, CreateAcls), as an operator would;
- SSL: TLS with server authentication only (the client is ANONYMOUS);
- MTLS: TLS with ``ssl.client.auth=required``; the principal is the client certificate's distinguished name;
- SASL_PLAINTEXT: PLAIN (users from the JAAS config), SCRAM-SHA-256 and SCRAM-SHA-512;
- SASL_SSL: the same mechanisms over TLS;
- REAUTH: SASL_PLAINTEXT whose sessions last ``REAUTH_MS`` (``connections.max.reauth.ms``, KIP-368).

Certificates come from a throwaway CA made with ``cryptography`` (keys unencrypted, PKCS#8 PEM, which both
brokers and every client read). Authorization is Kafka's StandardAuthorizer with ``super.users``.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from compat.apache_kafka import ApacheKafka, KafkaUnavailable, free_port
from kbroker.health import wait_until_ready
from kbroker.security.acls import AclOperation, AclPermissionType, PatternType, ResourceType
from kbroker.wire_client import WireClient
from protocol.messages.alter_user_scram_credentials_request import (
    AlterUserScramCredentialsRequest,
    ScramCredentialUpsertion,
)
from protocol.messages.create_acls_request import AclCreation, CreateAclsRequest
from protocol.messages.describe_acls_request import DescribeAclsRequest

STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SCRAM_CODES = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}  # AlterUserScramCredentials' mechanism numbers
SCRAM_ITERATIONS = 4096
REAUTH_MS = 2000

ADMIN = ("admin", "admin-secret")  # a super user
ALICE = ("alice", "alice-secret")  # may do anything to any topic and group (wildcard ACLs)
BOB = ("bob", "bob-secret")  # only what each ACL scenario grants him
USERS = (ADMIN, ALICE, BOB)

# Listener name -> security protocol; the order is the order of ``listeners``.
LISTENERS = {
    "PLAINTEXT": "PLAINTEXT",
    "SSL": "SSL",
    "MTLS": "SSL",
    "SASL_PLAINTEXT": "SASL_PLAINTEXT",
    "SASL_SSL": "SASL_SSL",
    "REAUTH": "SASL_PLAINTEXT",
}


# --- certificates --------------------------------------------------------------------------------------------


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kbroker compat"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "security"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class Certificates:
    """Files of a throwaway PKI: the CA, the broker's key and certificate (for 127.0.0.1 and localhost), and a
    client's; ``*_keystore`` holds key then certificate chain in one PEM file (Kafka's PEM key store file)."""

    ca: Path
    broker_keystore: Path
    client_cert: Path
    client_key: Path
    client_principal: str  # User:<the client certificate's DN, RFC 2253 as Kafka prints it>

    @classmethod
    def create(cls, directory: Path) -> Certificates:
        directory.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = _name("compat throwaway CA")
        ca = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(ca_key, hashes.SHA256())
        )

        def issue(
            subject: x509.Name, usage: x509.ObjectIdentifier, names: list[x509.GeneralName]
        ) -> tuple[bytes, bytes]:
            key = ec.generate_private_key(ec.SECP256R1())
            builder = (
                x509.CertificateBuilder()
                .subject_name(subject)
                .issuer_name(ca_name)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=2))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            )
            if names:
                builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
            return _pem_key(key), _pem_cert(builder.sign(ca_key, hashes.SHA256()))

        broker_key, broker_cert = issue(
            _name("localhost"),
            ExtendedKeyUsageOID.SERVER_AUTH,
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
        )
        client_name = _name("compat-client")
        client_key, client_cert = issue(client_name, ExtendedKeyUsageOID.CLIENT_AUTH, [])
        files = cls(
            ca=directory / "ca.pem",
            broker_keystore=directory / "broker-keystore.pem",
            client_cert=directory / "client.pem",
            client_key=directory / "client-key.pem",
            client_principal=f"User:{client_name.rfc4514_string()}",
        )
        files.ca.write_bytes(_pem_cert(ca))
        files.broker_keystore.write_bytes(broker_key + broker_cert + _pem_cert(ca))
        files.client_cert.write_bytes(client_cert + _pem_cert(ca))
        files.client_key.write_bytes(client_key)
        return files


# --- the brokers' settings -----------------------------------------------------------------------------------


def jaas_plain(users: tuple[tuple[str, str], ...]) -> str:
    options = " ".join(f'user_{name}="{password}"' for name, password in users)
    return f"{PLAIN_MODULE} required {options};"


def secured_settings(certs: Certificates) -> dict[str, str]:
    """What both brokers are given besides their listeners: TLS, SASL, the authorizer and the super users."""
    settings = {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(certs.broker_keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(certs.ca),
        "ssl.client.auth": "none",
        "listener.name.mtls.ssl.client.auth": "required",
        "sasl.enabled.mechanisms": ",".join(MECHANISMS),
        "authorizer.class.name": STANDARD_AUTHORIZER,
        "super.users": f"User:{ADMIN[0]};User:ANONYMOUS",
        "allow.everyone.if.no.acl.found": "false",
        "listener.name.reauth.connections.max.reauth.ms": str(REAUTH_MS),
    }
    for listener in ("sasl_plaintext", "sasl_ssl", "reauth"):
        settings[f"listener.name.{listener}.plain.sasl.jaas.config"] = jaas_plain(USERS)
        for mechanism in SCRAM_CODES:
            settings[f"listener.name.{listener}.{mechanism.lower()}.sasl.jaas.config"] = f"{SCRAM_MODULE} required;"
    return settings


# --- the secured brokers -------------------------------------------------------------------------------------


class SecuredBroker:
    """A broker with the listeners of LISTENERS; ``address(listener)`` is where a client of it connects."""

    name: str
    ports: dict[str, int]

    def address(self, listener: str) -> str:
        return f"127.0.0.1:{self.ports[listener]}"

    @property
    def bootstrap(self) -> str:
        return self.address("PLAINTEXT")

    def stop(self) -> None:
        raise NotImplementedError


class SecuredKafka(SecuredBroker):
    def __init__(self, directory: Path, certs: Certificates, test_settings: dict[str, str]) -> None:
        self.name = "kafka"
        self.kafka = ApacheKafka(
            directory, {**test_settings, **secured_settings(certs)}, extra_listeners=dict(LISTENERS)
        )
        self.kafka.start()
        self.ports = {"PLAINTEXT": self.kafka.port, **self.kafka.extra_ports}

    def stop(self) -> None:
        self.kafka.stop()


class SecuredKBroker(SecuredBroker):
    """``kbroker serve --config server.properties``: the same keys as Kafka's server.properties."""

    def __init__(self, directory: Path, certs: Certificates, test_settings: dict[str, str]) -> None:
        self.name = "kbroker"
        directory.mkdir(parents=True, exist_ok=True)
        self.ports = {name: free_port() for name in LISTENERS}
        listeners = ",".join(f"{name}://127.0.0.1:{port}" for name, port in self.ports.items())
        settings = {
            "listeners": listeners,
            "advertised.listeners": listeners,
            "listener.security.protocol.map": ",".join(f"{n}:{p}" for n, p in LISTENERS.items()),
            "inter.broker.listener.name": "PLAINTEXT",
            **test_settings,
            **secured_settings(certs),
        }
        properties = directory / "server.properties"
        properties.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        ready = directory / "ready"
        self.log_path = directory / "kbroker.log"
        command = [sys.executable, "-m", "kbroker", "serve", "--config", str(properties)]
        command += ["--data-dir", str(directory / "data"), "--ready-file", str(ready), "--log-level", "INFO"]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while not ready.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"kbroker with security did not start:\n{self.log_tail()}")
            time.sleep(0.02)
        wait_until_ready(self.bootstrap, timeout=30)

    def log_tail(self, size: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-size:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_secured(name: str, directory: Path, certs: Certificates, test_settings: dict[str, str]) -> SecuredBroker:
    """Raises KafkaUnavailable where Apache Kafka cannot run here."""
    if name == "kafka":
        return SecuredKafka(directory / "apache-kafka", certs, test_settings)
    if name == "kbroker":
        return SecuredKBroker(directory / "kbroker", certs, test_settings)
    raise KafkaUnavailable(f"the security scenarios start their own broker; {name} is not one the suite starts")


# --- setting up users and ACLs through the admin API ---------------------------------------------------------


def scram_upsertion(user: str, password: str, mechanism: str) -> ScramCredentialUpsertion:
    """The salted password is computed by the client (RFC 5802 Hi()), as Kafka's admin client does."""
    salt = secrets.token_bytes(16)
    digest = "sha256" if mechanism == "SCRAM-SHA-256" else "sha512"
    salted = hashlib.pbkdf2_hmac(digest, password.encode(), salt, SCRAM_ITERATIONS)
    return ScramCredentialUpsertion(
        name=user, mechanism=SCRAM_CODES[mechanism], iterations=SCRAM_ITERATIONS, salt=salt, salted_password=salted
    )


def create_scram_users(bootstrap: str, users: tuple[tuple[str, str], ...]) -> None:
    """Both SCRAM mechanisms' credentials for each user: one request per mechanism, since Kafka refuses to
    alter one user twice in a request (DUPLICATE_RESOURCE)."""
    with WireClient(bootstrap, timeout=30) as admin:
        for mechanism in SCRAM_CODES:
            request = AlterUserScramCredentialsRequest(upsertions=[scram_upsertion(u, p, mechanism) for u, p in users])
            answer = admin.request(request, 0)
            failed = [(r.user, r.error_code, r.error_message) for r in answer.results if r.error_code]
            if failed:
                raise RuntimeError(f"AlterUserScramCredentials failed: {failed}")


@dataclass(frozen=True)
class Acl:
    principal: str
    resource_type: ResourceType
    name: str
    operation: AclOperation
    permission: AclPermissionType = AclPermissionType.ALLOW
    pattern: PatternType = PatternType.LITERAL


def create_acls(bootstrap: str, acls: list[Acl], timeout: float = 30) -> None:
    """CreateAcls, then wait until DescribeAcls shows every one (Kafka applies them through its metadata log)."""
    creations = [
        AclCreation(
            resource_type=a.resource_type,
            resource_name=a.name,
            resource_pattern_type=a.pattern,
            principal=a.principal,
            host="*",
            operation=a.operation,
            permission_type=a.permission,
        )
        for a in acls
    ]
    with WireClient(bootstrap, timeout=30) as admin:
        answer = admin.request(CreateAclsRequest(creations=creations), 3)
        failed = [(r.error_code, r.error_message) for r in answer.results if r.error_code]
        if failed:
            raise RuntimeError(f"CreateAcls failed: {failed}")
        deadline = time.monotonic() + timeout
        while not all(_described(admin, a) for a in acls):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the ACLs {acls} were not all in effect within {timeout:g} s")
            time.sleep(0.05)


def _described(admin: WireClient, acl: Acl) -> bool:
    found = admin.request(
        DescribeAclsRequest(
            resource_type_filter=acl.resource_type,
            resource_name_filter=acl.name,
            pattern_type_filter=acl.pattern,
            principal_filter=acl.principal,
            host_filter=None,
            operation=acl.operation,
            permission_type=acl.permission,
        ),
        3,
    )
    return found.error_code == 0 and any(r.acls for r in found.resources)


# --- what a client of each setup is given --------------------------------------------------------------------


def client_security(
    certs: Certificates,
    protocol: str,
    mechanism: str | None = None,
    user: tuple[str, str] | None = None,
    client_certificate: bool = False,
) -> dict[str, Any]:
    """The adapters' security settings (compat/clients/api.py, ``security``)."""
    security: dict[str, Any] = {"security_protocol": protocol}
    if "SSL" in protocol:
        security["ssl_cafile"] = str(certs.ca)
    if client_certificate:
        security["ssl_certfile"] = str(certs.client_cert)
        security["ssl_keyfile"] = str(certs.client_key)
    if mechanism is not None and user is not None:
        security |= {"sasl_mechanism": mechanism, "sasl_username": user[0], "sasl_password": user[1]}
    return security
