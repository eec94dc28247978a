"""``kbroker certs``: a throwaway CA, a broker certificate and optional client certificates for local TLS.

Everything is PEM, in the forms Kafka reads with ``ssl.keystore.type=PEM`` / ``ssl.truststore.type=PEM``:

- ``ca.pem`` (the CA certificate: every side's trust store) and ``ca-key.pem`` (to sign more, kept 0600);
- ``broker.pem``: the broker's unencrypted PKCS#8 key, its certificate and the CA's (``ssl.keystore.location``),
  the hosts as subject alternative names (DNS names, IP addresses as IP SANs), CN the first host;
- ``client-<name>.pem`` (key + chain, for Java clients) and ``client-<name>.crt`` / ``client-<name>.key`` (for
  librdkafka's ``ssl.certificate.location`` / ``ssl.key.location``), CN=<name>: the principal ``User:CN=<name>``
  under the default mapping rules.

Keys are EC P-256 (fast to make, understood by Java, OpenSSL and every client). Not for production: the CA key
lies next to the certificates.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_HOSTS = ("localhost", "127.0.0.1")
DEFAULT_DAYS = 365
SSL_PORT = 9093  # Kafka's customary SSL port


class CertsError(Exception):
    """A one-line reason the certificates could not be written."""


@dataclass
class GeneratedCerts:
    directory: Path
    ca: Path
    ca_key: Path
    broker: Path
    clients: dict[str, tuple[Path, Path, Path]] = field(default_factory=dict)  # name -> (pem, crt, key)


def _name(common_name: str, organization: str = "kbroker") -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _issue(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    days: int,
    *,
    ca: bool = False,
    hosts: list[str] | None = None,
    usage: list[x509.ObjectIdentifier] | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # tolerate a little clock skew
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
    else:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False
        ).add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True)
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName([_san(host) for host in hosts]), critical=False)
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, data: bytes, private: bool = False) -> None:
    # Private keys are created 0600 rather than chmod-ed after the fact.
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)


def generate(
    directory: Path, hosts: list[str] | None = None, clients: list[str] | None = None, days: int = DEFAULT_DAYS
) -> GeneratedCerts:
    """Write a CA, a broker certificate for ``hosts`` and client certificates into ``directory``."""
    hosts = list(hosts or DEFAULT_HOSTS)
    for name in clients or []:
        if not name or "/" in name or name.startswith("."):
            raise CertsError(f"--client {name!r}: a client name is used in file names: no '/', no leading '.'")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if not os.access(directory, os.W_OK | os.X_OK):
            raise CertsError(f"cannot write to {directory}: permission denied")
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = _name("kbroker throwaway CA")
        ca_cert = _issue(ca_name, ca_key, ca_name, ca_key, days, ca=True)
        result = GeneratedCerts(directory, directory / "ca.pem", directory / "ca-key.pem", directory / "broker.pem")
        _write(result.ca, _cert_pem(ca_cert))
        _write(result.ca_key, _key_pem(ca_key), private=True)

        broker_key = ec.generate_private_key(ec.SECP256R1())
        broker_cert = _issue(
            _name(hosts[0]), broker_key, ca_name, ca_key, days, hosts=hosts, usage=[ExtendedKeyUsageOID.SERVER_AUTH]
        )
        _write(result.broker, _key_pem(broker_key) + _cert_pem(broker_cert) + _cert_pem(ca_cert), private=True)

        for name in clients or []:
            client_key = ec.generate_private_key(ec.SECP256R1())
            client_cert = _issue(
                x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]),
                client_key,
                ca_name,
                ca_key,
                days,
                usage=[ExtendedKeyUsageOID.CLIENT_AUTH],
            )
            paths = (
                directory / f"client-{name}.pem",
                directory / f"client-{name}.crt",
                directory / f"client-{name}.key",
            )
            chain = _cert_pem(client_cert) + _cert_pem(ca_cert)
            _write(paths[0], _key_pem(client_key) + chain, private=True)
            _write(paths[1], chain)
            _write(paths[2], _key_pem(client_key), private=True)
            result.clients[name] = paths
    except OSError as exc:
        where = exc.filename if exc.filename is not None else directory
        raise CertsError(f"cannot write to {where}: {exc.strerror or exc}") from None
    return result


def server_properties(certs: GeneratedCerts, host: str, port: int = SSL_PORT) -> str:
    """The server.properties lines for an SSL listener with these certificates."""
    mutual = "required" if certs.clients else "none"
    return "\n".join(
        [
            f"listeners=SSL://{host}:{port}",
            f"advertised.listeners=SSL://{host}:{port}",
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={certs.broker.resolve()}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={certs.ca.resolve()}",
            f"ssl.client.auth={mutual}",
        ]
    )


def client_settings(certs: GeneratedCerts) -> str:
    """Client settings for Java clients and for librdkafka (confluent-kafka, kcat), per client certificate."""
    ca = certs.ca.resolve()
    lines = [
        "# Java clients (client.properties)",
        "security.protocol=SSL",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={ca}",
    ]
    for name, (pem, _, _) in certs.clients.items():
        lines += [
            f"# ... as {name} (User:CN={name})",
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={pem.resolve()}",
        ]
    lines += ["# librdkafka (confluent-kafka, kcat -X ...)", "security.protocol=SSL", f"ssl.ca.location={ca}"]
    for name, (_, crt, key) in certs.clients.items():
        lines += [
            f"# ... as {name}",
            f"ssl.certificate.location={crt.resolve()}",
            f"ssl.key.location={key.resolve()}",
        ]
    lines += [
        "# kafka-python / aiokafka: security_protocol='SSL', ssl_cafile="
        + str(ca)
        + "".join(
            f"; as {name}: ssl_certfile={crt.resolve()}, ssl_keyfile={key.resolve()}"
            for name, (_, crt, key) in certs.clients.items()
        )
    ]
    return "\n".join(lines)
